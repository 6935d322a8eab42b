"""The consuming client's own cost per message, without a server: CPU microseconds.

    python benchmarks/client_path.py [--backend asyncio|trio|nsq_trio] [--style handler|iterate]

The public ``Consumer`` runs on its backend against an nsqd faked in the same process (a
stream object answering the handshake and handing over pre-built 200-byte message frames in
64 KiB pieces, as many as RDY allows, each piece once a quarter of RDY is free again), with
one handler per message that does nothing (``--style iterate``: ``async for`` and ``await
message.finish()``).  What the process spends per message is then the client's own: the
decoding, the core's books, the handler's dispatch and the FIN, the loop's wake-ups;
nothing of nsqd's, of the kernel's sockets or of another process sharing the cores.  CPU time
(not wall time) is measured, so a busy machine changes the figures less.

Beside it, on the same frames in the same run, two floors in plain Python with no client
code: ``parse_fin`` decodes each frame's header and appends its FIN (what the bare loop of
``benchmarks/bare.py`` does per message), and ``handler_floor`` adds the least a handler
API does per message (a message object, an in-flight book, one awaited handler call).

Prints ``client_cpu_us_per_msg=``, ``parse_fin_cpu_us_per_msg=`` and
``handler_floor_cpu_us_per_msg=`` (medians of ``--rounds``).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import statistics
import struct
import time
from collections.abc import Callable
from typing import Any, ClassVar, Protocol

import anyio
import anyio.lowlevel

from nsq_anyio import _backend as anyio_backend

FEATURES = json.dumps(
    {"max_rdy_count": 2500, "version": "1.3.0", "max_msg_timeout": 900000, "msg_timeout": 60000}
).encode()
RING = 8192  # distinct message ids, more than max_in_flight: no id is held twice
CHUNK = 280  # messages per piece: about 64 KiB, what one socket read gives
_FRAME_HEADER = struct.Struct(">ii")
_MESSAGE_HEADER = struct.Struct(">iiqh")


def frame(kind: int, data: bytes) -> bytes:
    return _FRAME_HEADER.pack(len(data) + 4, kind) + data


def message_frames(size: int) -> tuple[bytes, int]:
    """``RING`` message frames twice over (a piece never wraps), and one frame's size."""
    body = b"x" * (size - 26)
    frames = [
        frame(2, struct.pack(">qh", 1_700_000_000_000_000_000, 1) + b"%016x" % i + body)
        for i in range(RING)
    ]
    return b"".join(frames) * 2, len(frames[0])


class FakeNsqd:
    """One connection's nsqd: the handshake's answers, then messages as RDY allows."""

    def __init__(self, frames: bytes, frame_size: int) -> None:
        self.frames = frames
        self.frame_size = frame_size
        self.pending = b""
        self.replies: list[bytes] = []
        self.rdy = 0
        self.sent = 0
        self.finished = 0
        self.pos = 0

    def handle(self, data: bytes) -> None:
        if data[:4] == b"FIN ":  # the steady state: FINs alone
            fins = data.count(b"FIN ")
            if data.count(b"\n") == fins:
                self.finished += fins
                return
            # FINs and another command (RDY, or the CLS of a stop): each line in turn
        buf = self.pending + data
        while buf:
            if buf[:4] == b"  V2":
                buf = buf[4:]
                continue
            nl = buf.find(b"\n")
            if nl < 0:
                break
            line = buf[:nl]
            if line == b"IDENTIFY":
                if len(buf) < nl + 5:
                    break
                (size,) = struct.unpack(">i", buf[nl + 1 : nl + 5])
                if len(buf) < nl + 5 + size:
                    break
                buf = buf[nl + 5 + size :]
                self.replies.append(frame(0, FEATURES))
                continue
            buf = buf[nl + 1 :]
            if line.startswith(b"SUB"):
                self.replies.append(frame(0, b"OK"))
            elif line.startswith(b"RDY"):
                self.rdy = int(line[4:])
            elif line.startswith(b"FIN"):
                self.finished += 1
            elif line.startswith(b"CLS"):
                self.replies.append(frame(0, b"CLOSE_WAIT"))
        self.pending = buf

    def credit(self) -> int:
        return self.rdy - (self.sent - self.finished)

    def worth_sending(self) -> bool:
        return self.credit() >= max(1, self.rdy // 4)

    def take(self) -> bytes:
        """The replies waiting, else up to ``CHUNK`` messages RDY allows."""
        if self.replies:
            data = b"".join(self.replies)
            self.replies.clear()
            return data
        n = min(self.credit(), CHUNK)
        if n <= 0:
            return b""
        start = self.pos * self.frame_size
        self.pos = (self.pos + n) % RING
        self.sent += n
        return self.frames[start : start + n * self.frame_size]


class NsqdSide(Protocol):
    """What the streams below need of a faked nsqd (:class:`FakeNsqd`, and the publishing
    one of ``publish_path.py``)."""

    replies: list[bytes]

    def handle(self, data: bytes) -> None: ...

    def take(self) -> bytes: ...

    def credit(self) -> int: ...

    def worth_sending(self) -> bool: ...


class PushedStream:
    """On asyncio: hands data over from loop callbacks, as the adapter's own stream does."""

    def __init__(self, nsqd: NsqdSide) -> None:
        self.nsqd = nsqd
        self.loop = asyncio.get_running_loop()
        self.on_data: Callable[[bytes], None] | None = None
        self.scheduled = False
        self.readable = asyncio.Event()

    def send_nowait(self, data: bytes) -> bool:
        self.nsqd.handle(data)
        self._kick()
        return True

    async def send(self, data: bytes) -> None:
        self.send_nowait(data)

    def _kick(self) -> None:
        self.readable.set()
        nsqd = self.nsqd
        idle = self.on_data is not None and not self.scheduled
        if idle and (nsqd.replies or nsqd.worth_sending()):
            self.scheduled = True
            self.loop.call_soon(self._push)

    def _push(self) -> None:
        self.scheduled = False
        if self.on_data is None:
            return
        data = self.nsqd.take()
        if data:
            self.on_data(data)
            if self.nsqd.credit() > 0 and not self.scheduled:
                self.scheduled = True
                self.loop.call_soon(self._push)

    async def receive(self) -> bytes:
        while not self.nsqd.replies:
            self.readable.clear()
            await self.readable.wait()
        return self.nsqd.take()

    def start_pushing(
        self, on_data: Callable[[bytes], None], on_end: Callable[[BaseException | None], None]
    ) -> None:
        self.on_data = on_data
        if self.nsqd.replies:
            on_data(self.nsqd.take())
        self._kick()

    def stop_pushing(self) -> None:
        self.on_data = None

    async def aclose(self) -> None:
        self.on_data = None

    async def abort(self) -> None:
        self.on_data = None


class ReadStream:
    """On trio: read by a task, as trio's streams are."""

    def __init__(self, nsqd: NsqdSide) -> None:
        self.nsqd = nsqd
        self.changed = anyio.Event()

    async def send(self, data: bytes) -> None:
        self.nsqd.handle(data)
        self.changed.set()

    async def receive(self) -> bytes:
        nsqd = self.nsqd
        await anyio.lowlevel.checkpoint()
        while not (nsqd.replies or nsqd.worth_sending()):
            self.changed = anyio.Event()
            await self.changed.wait()
        return nsqd.take()

    async def aclose(self) -> None:
        pass

    async def abort(self) -> None:
        pass


def library(backend: str) -> tuple[Any, Any, str]:
    """The client module, its backend object and the loop to run for ``--backend``."""
    if backend == "nsq_trio":
        lib = importlib.import_module("nsq_trio")
        return lib, importlib.import_module("nsq_trio._backend").BACKEND, "trio"
    return importlib.import_module("nsq_anyio"), anyio_backend.BACKEND, backend


def fake_backend(base: Any, make_nsqd: Callable[[], NsqdSide]) -> Any:
    """``base`` (a backend object) with its ``connect_tcp`` reaching a new nsqd of
    ``make_nsqd`` (kept in its ``nsqds``, in the order connected)."""

    class Fake(type(base)):  # type: ignore[misc]
        nsqds: ClassVar[list[NsqdSide]] = []

        async def connect_tcp(self, host: str, port: int) -> Any:
            nsqd = make_nsqd()
            self.nsqds.append(nsqd)
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                return ReadStream(nsqd)
            return PushedStream(nsqd)

    return Fake()


async def consume(lib: Any, backend: Any, count: int, style: str) -> float:
    """CPU microseconds per message, from the first message to the ``count``-th."""
    done = anyio.Event()
    n = 0
    started = 0.0

    async def handler(message: object) -> None:
        nonlocal n, started
        if n == 0:
            started = time.process_time()
        n += 1
        if n >= count:
            done.set()

    async with lib.Consumer(
        "t", "c", nsqd_tcp_addresses=["127.0.0.1:4150"], max_in_flight=2500, backend=backend
    ) as consumer:
        if style == "iterate":
            async for message in consumer:
                if n == 0:
                    started = time.process_time()
                await message.finish()
                n += 1
                if n >= count:
                    break
        else:
            async with anyio.create_task_group() as tg:
                tg.start_soon(consumer.run, handler, 1)
                await done.wait()
                tg.cancel_scope.cancel()
        used = time.process_time() - started
    return used / (count - 1) * 1e6


class _FloorMessage:
    __slots__ = ("_responded", "attempts", "body", "id", "timestamp")

    def __init__(self, id: bytes, timestamp: int, attempts: int, body: bytes) -> None:
        self.id = id
        self.timestamp = timestamp
        self.attempts = attempts
        self.body = body
        self._responded = False


async def _nothing(message: _FloorMessage) -> None:
    pass


async def parse_fin(piece: bytes, count: int) -> float:
    unpack = _MESSAGE_HEADER.unpack_from
    wbuf = bytearray()
    n = 0
    started = time.process_time()
    while n < count:
        pos, end_all = 0, len(piece)
        while pos < end_all:
            size, _kind, _timestamp, _attempts = unpack(piece, pos)
            wbuf += b"FIN "
            wbuf += piece[pos + 18 : pos + 34]
            wbuf += b"\n"
            pos += 4 + size
            n += 1
        wbuf.clear()
        await asyncio.sleep(0)
    return (time.process_time() - started) / n * 1e6


async def handler_floor(piece: bytes, count: int) -> float:
    unpack = _MESSAGE_HEADER.unpack_from
    wbuf = bytearray()
    held: dict[bytes, _FloorMessage] = {}
    n = 0
    started = time.process_time()
    while n < count:
        pos, end_all = 0, len(piece)
        batch = []
        while pos < end_all:
            size, _kind, timestamp, attempts = unpack(piece, pos)
            end = pos + 4 + size
            message = _FloorMessage(
                piece[pos + 18 : pos + 34], timestamp, attempts, piece[pos + 34 : end]
            )
            held[message.id] = message
            batch.append(message)
            pos = end
        for message in batch:
            await _nothing(message)
            message._responded = True
            del held[message.id]
            wbuf += b"FIN "
            wbuf += message.id
            wbuf += b"\n"
            n += 1
        wbuf.clear()
        await asyncio.sleep(0)
    return (time.process_time() - started) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["asyncio", "trio", "nsq_trio"], default="asyncio")
    parser.add_argument("--style", choices=["handler", "iterate"], default="handler")
    parser.add_argument("--count", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    frames, frame_size = message_frames(args.size)
    lib, base, loop = library(args.backend)
    backend = fake_backend(base, lambda: FakeNsqd(frames, frame_size))
    piece = frames[: CHUNK * frame_size]
    client, parsing, floor = [], [], []
    for _ in range(args.rounds):
        client.append(anyio.run(consume, lib, backend, args.count, args.style, backend=loop))
        parsing.append(asyncio.run(parse_fin(piece, args.count)))
        floor.append(asyncio.run(handler_floor(piece, args.count)))
    print(f"backend={args.backend} style={args.style} count={args.count} size={args.size}")
    print(f"client_cpu_us_per_msg={statistics.median(client):.2f}")
    print(f"parse_fin_cpu_us_per_msg={statistics.median(parsing):.2f}")
    print(f"handler_floor_cpu_us_per_msg={statistics.median(floor):.2f}")


if __name__ == "__main__":
    main()
