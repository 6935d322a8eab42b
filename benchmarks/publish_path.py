"""The publishing client's own cost per publish, without a server: CPU microseconds.

    python benchmarks/publish_path.py [--backend asyncio|trio|nsq_trio] [--publishers 200]

``--publishers`` tasks each ``await producer.publish(topic, body)`` in a loop, as a service's
request handlers do, through the public ``Producer`` on its backend, against an nsqd faked in
the same process (a stream object answering the handshake and each PUB or MPUB with OK at
once, from a loop callback on asyncio, to the reading task on trio).  What the process spends
per publish is then the client's own: the queue, the coalescing into MPUBs, the encoding, the
answer matched to its caller and the caller's wake-up; nothing of nsqd's, of the kernel's
sockets or of another process sharing the cores.  CPU time (not wall time) is measured.

Beside it, in the same run, the floor of that pattern in plain asyncio with no client code:
the same number of tasks, each awaiting a future of its own that a driver sets in batches of
them (the wake-up of a caller whose answer came, and nothing else).

Prints ``client_cpu_us_per_publish=`` and ``wakeup_floor_cpu_us_per_publish=`` (medians of
``--rounds``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import struct
import time
from typing import Any

import anyio
from client_path import fake_backend, library

FEATURES = json.dumps({"max_rdy_count": 2500, "version": "1.3.0"}).encode()
_FRAME_HEADER = struct.Struct(">ii")
_SIZE = struct.Struct(">i")
#: commands followed by ``size:i32`` and that many bytes
_WITH_BODY = (b"IDENTIFY", b"PUB", b"MPUB", b"DPUB")


def frame(kind: int, data: bytes) -> bytes:
    return _FRAME_HEADER.pack(len(data) + 4, kind) + data


OK = frame(0, b"OK")


class FakeNsqd:
    """One connection's nsqd: the IDENTIFY answer, then OK for each publish command."""

    def __init__(self) -> None:
        self.pending = b""
        self.replies: list[bytes] = []
        self.published = 0

    def handle(self, data: bytes) -> None:
        buf = self.pending + data if self.pending else data
        pos, n = 0, len(buf)
        while pos < n:
            if buf.startswith(b"  V2", pos):
                pos += 4
                continue
            nl = buf.find(b"\n", pos)
            if nl < 0:
                break
            name = buf[pos:nl].split(b" ", 1)[0]
            if name in _WITH_BODY:
                if n < nl + 5:
                    break
                (size,) = _SIZE.unpack_from(buf, nl + 1)
                end = nl + 5 + size
                if n < end:
                    break
                if name == b"IDENTIFY":
                    self.replies.append(frame(0, FEATURES))
                else:
                    self.published += _SIZE.unpack_from(buf, nl + 5)[0] if name == b"MPUB" else 1
                    self.replies.append(OK)
                pos = end
                continue
            if name == b"CLS":
                self.replies.append(frame(0, b"CLOSE_WAIT"))
            pos = nl + 1  # NOP
        self.pending = buf[pos:]

    def take(self) -> bytes:
        data = b"".join(self.replies)
        self.replies.clear()
        return data

    def credit(self) -> int:
        return 0  # it sends nothing unasked

    def worth_sending(self) -> bool:
        return False


async def publish(lib: Any, backend: Any, publishers: int, count: int) -> float:
    """CPU microseconds per publish, ``count`` publishes by ``publishers`` tasks (each
    publish checked to have reached the fake nsqd)."""
    backend.nsqds.clear()
    body = b"x" * 200
    each = max(1, count // publishers)
    async with lib.Producer(nsqd_tcp_addresses=["127.0.0.1:4150"], backend=backend) as producer:
        await producer.publish("t", body)  # connected

        async def publisher() -> None:
            for _ in range(each):
                await producer.publish("t", body)

        started = time.process_time()
        async with anyio.create_task_group() as tg:
            for _ in range(publishers):
                tg.start_soon(publisher)
        used = time.process_time() - started
    published = sum(nsqd.published for nsqd in backend.nsqds)  # (FakeNsqd)
    if published != each * publishers + 1:
        raise AssertionError(f"{published} messages reached nsqd, not {each * publishers + 1}")
    return used / (each * publishers) * 1e6


async def wakeup_floor(publishers: int, count: int) -> float:
    """``publishers`` tasks each awaiting its own future, which a driver sets in batches."""
    loop = asyncio.get_running_loop()
    waiting: list[asyncio.Future[None]] = []
    each = max(1, count // publishers)
    ready = asyncio.Event()

    async def publisher() -> None:
        for _ in range(each):
            future = loop.create_future()
            waiting.append(future)
            ready.set()
            await future

    async def driver() -> None:
        while True:
            await ready.wait()
            ready.clear()
            await asyncio.sleep(0)
            batch = waiting[:]
            waiting.clear()
            for future in batch:
                future.set_result(None)

    started = time.process_time()
    drive = asyncio.create_task(driver())
    await asyncio.gather(*(publisher() for _ in range(publishers)))
    used = time.process_time() - started
    drive.cancel()
    return used / (each * publishers) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["asyncio", "trio", "nsq_trio"], default="asyncio")
    parser.add_argument("--publishers", type=int, default=200)
    parser.add_argument("--count", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    lib, base, loop = library(args.backend)
    backend = fake_backend(base, FakeNsqd)
    client, floor = [], []
    for _ in range(args.rounds):
        client.append(anyio.run(publish, lib, backend, args.publishers, args.count, backend=loop))
        floor.append(asyncio.run(wakeup_floor(args.publishers, args.count)))
    print(f"backend={args.backend} publishers={args.publishers} count={args.count}")
    print(f"client_cpu_us_per_publish={statistics.median(client):.2f}")
    print(f"wakeup_floor_cpu_us_per_publish={statistics.median(floor):.2f}")


if __name__ == "__main__":
    main()
