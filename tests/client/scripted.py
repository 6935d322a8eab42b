"""A scripted in-memory :class:`nsq_client.Backend`: the network is the test.

:class:`ScriptedBackend` implements the public Backend protocol on anyio's primitives (so it
runs on asyncio and on trio) and opens :class:`ScriptedStream` connections that reach no
server: what the test :meth:`~ScriptedStream.feed`\\ s is what the client reads, and every
write is recorded (``written``, and the backend's ``log`` of everything the client did, in
order).  A stream may answer commands by itself (``replies``: the command's name to the
bytes nsqd would send back), delivered from the backend's own task, as a server's bytes
arrive from outside the client's tasks.

Three kinds of stream, the three ways the runner writes and reads:

- ``plain``: ``send`` and ``receive`` (a stream on trio, say);
- ``nowait``: also ``send_nowait`` (:class:`nsq_client.NowaitStream`), which takes the bytes
  while ``room`` is True and refuses them (False) otherwise;
- ``push``: also ``start_pushing`` and ``stop_pushing`` (:class:`nsq_client.PushStream`):
  what arrives while it pushes is handed to the client at once, from the caller of
  :meth:`~ScriptedStream.feed` (as asyncio's ``data_received`` does, outside any task of the
  client).

Every kind can also be aborted (``abort``, :class:`nsq_client.AbortStream`), which a write
waiting on the peer sees fail at once.
"""

from __future__ import annotations

import math
import ssl
import struct
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio
import anyio.abc
import anyio.lowlevel

from nsq_client import Backend, BackendBase, Stream
from nsq_proto import ClientCore, Output

# nsqd's frames, as the core's own tests build them
from tests.proto.helpers import error as error
from tests.proto.helpers import identify_response as identify_response
from tests.proto.helpers import message as message
from tests.proto.helpers import mid as mid
from tests.proto.helpers import response as response

Kind = Literal["plain", "nowait", "push"]
KINDS: tuple[Kind, ...] = ("plain", "nowait", "push")

#: commands followed by a 4-byte size and a body
_WITH_BODY = {b"IDENTIFY", b"PUB", b"MPUB", b"DPUB", b"AUTH", b"PUB_TRACE", b"MPUB_TRACE"}


def nsqd_replies(**identify: Any) -> dict[bytes, bytes]:
    """What a well-behaved nsqd answers: IDENTIFY (with ``identify``'s changes), SUB, PUB,
    MPUB and CLS."""
    ok = response(b"OK")
    return {
        b"IDENTIFY": identify_response(**identify),
        b"SUB": ok,
        b"PUB": ok,
        b"MPUB": ok,
        b"CLS": response(b"CLOSE_WAIT"),
    }


@dataclass
class Command:
    """One command the client wrote: its line (``b"SUB t c"``) and its body, if any."""

    line: bytes
    body: bytes | None = None

    @property
    def name(self) -> bytes:
        return self.line.split(b" ", 1)[0]


@dataclass
class _Parser:
    """Splits what the client wrote into commands (after the 4-byte magic)."""

    buffer: bytes = b""
    magic: bytes | None = None
    commands: list[Command] = field(default_factory=list)

    def feed(self, data: bytes) -> list[Command]:
        self.buffer += data
        if self.magic is None:
            if len(self.buffer) < 4:
                return []
            self.magic, self.buffer = self.buffer[:4], self.buffer[4:]
        found: list[Command] = []
        while True:
            end = self.buffer.find(b"\n")
            if end < 0:
                break
            line = self.buffer[:end]
            rest = self.buffer[end + 1 :]
            body: bytes | None = None
            if line.split(b" ", 1)[0] in _WITH_BODY:
                if len(rest) < 4:
                    break
                (size,) = struct.unpack(">I", rest[:4])
                if len(rest) < 4 + size:
                    break
                body, rest = rest[4 : 4 + size], rest[4 + size :]
            self.buffer = rest
            found.append(Command(line, body))
        self.commands.extend(found)
        return found


class ScriptedStream:
    """One connection: the test is the peer (see the module)."""

    def __init__(self, backend: ScriptedBackend, address: str, *, tls: bool = False) -> None:
        self.backend = backend
        self.address = address
        self.tls = tls
        #: every write, in order (through ``send`` or ``send_nowait``)
        self.written: list[bytes] = []
        #: the command's name -> the bytes sent back once the client wrote it
        self.replies: dict[bytes, bytes] = dict(backend.replies)
        #: raised by every write from now on (the peer reset the connection)
        self.send_error: BaseException | None = None
        #: while set, ``send`` waits until it is set (a peer that does not read)
        self.send_gate: anyio.Event | None = None
        #: whether ``send_nowait`` takes bytes (``nowait`` and ``push`` kinds)
        self.room = True
        self.closed = False
        self.sends_started = 0
        self._parser = _Parser()
        self._chunks: deque[bytes | BaseException] = deque()
        self._arrived = anyio.Event()
        self._push: tuple[Callable[[bytes], None], Callable[[BaseException | None], None]] | None
        self._push = None

    # the test's side ---------------------------------------------------------------

    @property
    def commands(self) -> list[Command]:
        """Every command written so far."""
        return self._parser.commands

    def names(self) -> list[bytes]:
        """The name of every command written so far."""
        return [c.name for c in self.commands]

    def lines(self) -> list[bytes]:
        """The line of every command written so far."""
        return [c.line for c in self.commands]

    def feed(self, data: bytes) -> None:
        """The peer sends ``data``."""
        self._arrive(data)

    def end(self, error: BaseException | None = None) -> None:
        """The peer closes (``error`` None: a clean end) or the connection fails with ``error``."""
        self._arrive(error if error is not None else b"")

    def _arrive(self, item: bytes | BaseException) -> None:
        if self._push is not None and not self._chunks:
            self._hand_over(item)
            return
        self._chunks.append(item)
        self._arrived.set()

    def _hand_over(self, item: bytes | BaseException) -> None:
        assert self._push is not None
        on_data, on_end = self._push
        if isinstance(item, BaseException):
            self._push = None
            on_end(item)
        elif item:
            on_data(item)
        else:
            self._push = None
            on_end(None)

    def _record(self, data: bytes) -> None:
        self.written.append(data)
        self.backend.log.append(("send", self.address, data))
        for command in self._parser.feed(data):
            reply = self.replies.get(command.name)
            if reply is not None:
                self.backend.later(self.feed, reply)

    # the client's side -------------------------------------------------------------

    async def send(self, data: bytes) -> None:
        self.sends_started += 1
        if self.send_gate is not None:
            await self.send_gate.wait()
        if self.send_error is not None:
            raise self.send_error
        self._record(data)

    async def receive(self) -> bytes:
        while not self._chunks:
            if self.closed:
                raise OSError("read from a closed stream")
            self._arrived = anyio.Event()
            await self._arrived.wait()
        item = self._chunks.popleft()
        if isinstance(item, BaseException):
            raise item
        return item

    async def aclose(self) -> None:
        self.closed = True
        self.backend.log.append(("close", self.address, b""))
        self._arrived.set()

    async def abort(self) -> None:
        """Close at once (:class:`nsq_client.AbortStream`): a write under way fails."""
        self.closed = True
        self.backend.log.append(("abort", self.address, b""))
        self.send_error = ConnectionResetError("aborted")
        if self.send_gate is not None:
            self.send_gate.set()
        self._arrived.set()


class NowaitScriptedStream(ScriptedStream):
    """A :class:`ScriptedStream` with ``send_nowait`` (:class:`nsq_client.NowaitStream`)."""

    def send_nowait(self, data: bytes) -> bool:
        if self.send_error is not None:
            raise self.send_error
        if not self.room:
            return False
        self._record(data)
        return True


class PushScriptedStream(NowaitScriptedStream):
    """A :class:`NowaitScriptedStream` that also hands reads over
    (:class:`nsq_client.PushStream`)."""

    pushes_started = 0

    def start_pushing(
        self,
        on_data: Callable[[bytes], None],
        on_end: Callable[[BaseException | None], None],
    ) -> None:
        self.pushes_started += 1
        self._push = (on_data, on_end)
        while self._chunks and self._push is not None:
            self._hand_over(self._chunks.popleft())

    def stop_pushing(self) -> None:
        self._push = None

    @property
    def pushing(self) -> bool:
        return self._push is not None


_STREAMS: dict[Kind, type[ScriptedStream]] = {
    "plain": ScriptedStream,
    "nowait": NowaitScriptedStream,
    "push": PushScriptedStream,
}


class ScriptedBackend(BackendBase):
    """The :class:`nsq_client.Backend` of the tests (see the module).  Use it inside
    :func:`scripted_network`, which runs the task that delivers the streams' replies."""

    def __init__(self, kind: Kind = "plain", **identify: Any) -> None:
        self.kind = kind
        self.stream_class = _STREAMS[kind]
        #: what a new stream answers by itself (see :func:`nsqd_replies`)
        self.replies = nsqd_replies(**identify)
        #: every stream opened, in order (a TLS upgrade's stream too)
        self.streams: list[ScriptedStream] = []
        #: ("connect" | "send" | "close" | "start_tls" | anything a test adds, address, data)
        self.log: list[tuple[str, str, bytes]] = []
        #: addresses whose connections are refused
        self.refused: set[str] = set()
        #: raised by the next TLS handshake (then forgotten)
        self.tls_failure: BaseException | None = None
        #: each handshake's (address, hostname it checks)
        self.handshakes: list[tuple[str, str | None]] = []
        #: what nsqd sends first over TLS once the handshake is done
        self.after_handshake: bytes | None = response(b"OK")
        self._later: deque[tuple[Callable[[bytes], None], bytes]] = deque()
        self._later_ready = anyio.Event()

    def later(self, deliver: Callable[[bytes], None], data: bytes) -> None:
        """Call ``deliver(data)`` soon, from the backend's own task (not the caller's)."""
        self._later.append((deliver, data))
        self._later_ready.set()

    async def deliver_replies(self) -> None:
        """The backend's task: delivers what :meth:`later` queued, in order."""
        while True:
            while self._later:
                deliver, data = self._later.popleft()
                deliver(data)
                await anyio.lowlevel.checkpoint()
            self._later_ready = anyio.Event()
            await self._later_ready.wait()

    def stream(self, address: str, index: int = -1) -> ScriptedStream:
        """The ``index``-th stream opened to ``address`` (the latest by default)."""
        return [s for s in self.streams if s.address == address][index]

    def connections_to(self, address: str) -> int:
        return sum(1 for s in self.streams if s.address == address and not s.tls)

    # the Backend protocol ------------------------------------------------------------

    def current_time(self) -> float:
        return anyio.current_time()

    def clock(self) -> Callable[[], float]:
        return anyio.current_time

    def event(self) -> anyio.Event:
        return anyio.Event()

    def cancel_scope(
        self, *, deadline: float = math.inf, shield: bool = False
    ) -> anyio.CancelScope:
        return anyio.CancelScope(deadline=deadline, shield=shield)

    def task_group(self) -> anyio.abc.TaskGroup:
        return anyio.create_task_group()

    def cancelled_exc_class(self) -> type[BaseException]:
        return anyio.get_cancelled_exc_class()

    async def checkpoint(self) -> None:
        await anyio.lowlevel.checkpoint()

    async def connect_tcp(self, host: str, port: int) -> Stream:
        await anyio.lowlevel.checkpoint()
        address = f"{host}:{port}"
        self.log.append(("connect", address, b""))
        if address in self.refused:
            raise ConnectionRefusedError(f"connect to {address} refused")
        stream = self.stream_class(self, address)
        self.streams.append(stream)
        return stream

    async def start_tls(self, stream: Stream, ssl_context: Any, hostname: str | None) -> Stream:
        assert isinstance(stream, ScriptedStream)
        self.log.append(("start_tls", stream.address, b""))
        self.handshakes.append((stream.address, hostname))
        await anyio.lowlevel.checkpoint()
        failure, self.tls_failure = self.tls_failure, None
        if failure is not None:
            raise failure
        upgraded = self.stream_class(self, stream.address, tls=True)
        upgraded._parser = stream._parser  # the same byte stream, decrypted
        self.streams.append(upgraded)
        if self.after_handshake is not None:
            self.later(upgraded.feed, self.after_handshake)
        return upgraded

    def default_ssl_context(self) -> ssl.SSLContext:
        return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # no trust store to load: none is used


@asynccontextmanager
async def scripted_network(backend: ScriptedBackend) -> AsyncIterator[ScriptedBackend]:
    """Run ``backend``'s reply task around the block."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(backend.deliver_replies)
        yield backend
        tg.cancel_scope.cancel()


async def wait_until(condition: Callable[[], object], timeout: float = 5.0) -> None:
    """Let the client run until ``condition()`` is true (fails after ``timeout`` seconds)."""
    with anyio.fail_after(timeout):
        while not condition():
            await anyio.sleep(0.001)


def backend_protocol(backend: ScriptedBackend) -> Backend:
    """``backend`` as the public protocol (mypy checks that it implements it)."""
    return backend


class ScriptedCore:
    """A :class:`nsq_proto.ClientCore` whose outputs the test queues (``outputs``), and which
    writes every call the runner makes into the backend's ``log``, beside what the backend
    did: ``("connection_made", "1", b"")``, ``("receive_data", "1", data)``, ...
    ``on_receive(conn_id, data)`` runs inside each ``receive_data`` (to queue its answers)."""

    def __init__(self, backend: ScriptedBackend) -> None:
        self.log = backend.log
        self.outputs: deque[Output] = deque()
        self.deadline: float | None = None
        self.timer_calls: list[float] = []
        self.lost: dict[int, BaseException | None] = {}
        self.http: dict[int, list[bytes]] = {}
        self.http_errors: dict[int, BaseException] = {}
        self.on_receive: Callable[[int, bytes], None] | None = None

    def queue(self, *outputs: Output) -> None:
        self.outputs.extend(outputs)

    def start(self, now: float) -> None:
        self.log.append(("start", "", b""))

    def next_output(self) -> Output | None:
        return self.outputs.popleft() if self.outputs else None

    def next_deadline(self) -> float | None:
        return self.deadline

    def handle_timer(self, now: float) -> None:
        self.timer_calls.append(now)
        if self.deadline is not None and now >= self.deadline:
            self.deadline = None

    def connection_made(self, conn_id: int, now: float) -> None:
        self.log.append(("connection_made", str(conn_id), b""))

    def tls_established(self, conn_id: int, now: float) -> None:
        self.log.append(("tls_established", str(conn_id), b""))

    def receive_data(self, conn_id: int, data: bytes, now: float) -> None:
        self.log.append(("receive_data", str(conn_id), data))
        if self.on_receive is not None:
            self.on_receive(conn_id, data)

    def connection_lost(self, conn_id: int, now: float, error: BaseException | None = None) -> None:
        self.log.append(("connection_lost", str(conn_id), b""))
        self.lost[conn_id] = error

    def http_data(self, request_id: int, data: bytes, now: float) -> None:
        self.http.setdefault(request_id, []).append(data)

    def http_failed(self, request_id: int, error: BaseException, now: float) -> None:
        self.http_errors[request_id] = error


def as_core(core: ScriptedCore) -> ClientCore:
    """``core`` as the public protocol (mypy checks that it implements it)."""
    return core
