"""A byte stream straight on an asyncio transport, for the anyio backend running on asyncio.

anyio's socket stream yields to the loop before every write and pauses and resumes the
transport's reading around every read (two ``epoll_ctl`` calls): right for a general stream,
a loop iteration and two system calls too many for a client whose writes are already batched.
This one writes at once (waiting only while the transport's buffer is above its high-water
mark), keeps reading while data is buffered below a limit, and hands a reader everything that
arrived since its last read in one piece, or hands each read over from the protocol's
``data_received`` callback (:class:`nsq_client.PushStream`).  TLS goes over the same protocol
through ``loop.start_tls``.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import struct
from collections.abc import Callable
from contextvars import ContextVar
from typing import TypeVarTuple, Unpack, cast

try:
    # what anyio asks to know the running library; a loop callback has no task to tell it
    from sniffio import current_async_library_cvar as _library
except ImportError:  # pragma: no cover (anyio then finds the running asyncio loop itself)
    _library = ContextVar("_library", default=None)

__all__ = ["AsyncioStream", "LoopEvent", "connect"]

_Ts = TypeVarTuple("_Ts")

#: stop reading from the socket when this much arrived and was not read yet
_READ_LIMIT = 4 * 1024 * 1024


class LoopEvent:
    """A one-shot event of the running asyncio loop, as ``asyncio.Event`` (any number of
    waiters, each cancellable alone) at less cost: no deque and no loop lookup through the
    mixin, a slot for the first waiter (a publish's event has its publisher alone).  The
    client makes one for every publish and every write, on the loop it runs on: ``loop``
    (asking for the running loop costs about as much as the rest of a wait on CPython 3.11)."""

    __slots__ = ("_loop", "_more", "_set", "_waiter")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._set = False
        self._waiter: asyncio.Future[bool] | None = None
        self._more: list[asyncio.Future[bool]] | None = None

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        if self._set:
            return
        self._set = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(True)
        if self._more:
            for more in self._more:
                if not more.done():
                    more.set_result(True)

    async def wait(self) -> bool:
        if self._set:
            return True
        future: asyncio.Future[bool] = self._loop.create_future()
        if self._waiter is None:
            self._waiter = future
        elif self._more is None:
            self._more = [future]
        else:
            self._more.append(future)
        try:
            return await future
        finally:
            if self._waiter is future:
                self._waiter = None
            elif self._more:
                self._more.remove(future)


def as_asyncio(callback: Callable[[Unpack[_Ts]], object], *args: *_Ts) -> None:
    """Call ``callback(*args)`` from a callback of the loop, not a task (a pushed read, a
    thread's call handed over): anyio calls made there (starting a task, reading the clock)
    must still know they run on asyncio."""
    token = _library.set("asyncio")
    try:
        callback(*args)
    finally:
        _library.reset(token)


class _Protocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        #: what arrived and was not read yet, as the transport handed it over (no copy)
        self.chunks: list[bytes] = []
        self.buffered = 0
        self.eof = False
        #: the transport is gone (closed, aborted or failed): nothing more can be written
        self.lost = False
        self.error: BaseException | None = None
        self.reading_paused = False
        self._read_waiter: asyncio.Future[None] | None = None
        self._write_paused = False
        self._drain_waiter: asyncio.Future[None] | None = None
        #: while pushing: who takes the bytes as they arrive, and the end of the stream
        self.on_data: Callable[[bytes], None] | None = None
        self.on_end: Callable[[BaseException | None], None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream transport, of asyncio's own loop or another's (uvloop's do not subclass
        # asyncio.Transport: an isinstance check would refuse them)
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        on_data = self.on_data
        if on_data is not None:
            as_asyncio(on_data, data)
            return
        self.chunks.append(data)
        self.buffered += len(data)
        if self.buffered > _READ_LIMIT and self.transport is not None:
            self.transport.pause_reading()
            self.reading_paused = True
        self._wake_reader()

    def eof_received(self) -> bool:
        self.eof = True
        self._wake_reader()
        self._end()
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = True
        self.lost = True
        if exc is not None:
            self.error = exc
        self._wake_reader()
        self._wake_writer()
        self._end()

    def _end(self) -> None:
        on_end = self.on_end
        if on_end is not None:
            self.on_data = self.on_end = None  # once
            as_asyncio(on_end, self.error)

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        self._wake_writer()

    def _wake_reader(self) -> None:
        waiter = self._read_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _wake_writer(self) -> None:
        waiter = self._drain_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait_readable(self) -> None:
        waiter = self._read_waiter = asyncio.get_running_loop().create_future()
        try:
            await waiter
        finally:
            self._read_waiter = None

    async def drain(self) -> None:
        while self._write_paused and self.error is None and not self.lost:
            waiter = self._drain_waiter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                self._drain_waiter = None


class AsyncioStream:
    """One TCP (or TLS) connection on an asyncio transport."""

    __slots__ = ("_protocol", "_raw", "_transport")

    def __init__(
        self,
        transport: asyncio.Transport,
        protocol: _Protocol,
        raw: asyncio.Transport | None = None,
    ) -> None:
        self._transport = transport
        self._protocol = protocol
        #: under TLS, the TCP transport below it
        self._raw = raw

    async def send(self, data: bytes) -> None:
        protocol = self._protocol
        self._check_writable()
        self._transport.write(data)
        if protocol._write_paused:
            await protocol.drain()
            if protocol.error is not None:
                raise ConnectionResetError(f"the connection was lost: {protocol.error}")
            if protocol.lost:
                raise ConnectionResetError("the connection was closed before the write")

    def send_nowait(self, data: bytes) -> bool:
        """Write ``data`` now unless the transport's buffer is above its high-water mark
        (then write nothing and return False: :meth:`send` waits for it to drain)."""
        if self._protocol._write_paused:
            return False
        self._check_writable()
        self._transport.write(data)
        return True

    def _check_writable(self) -> None:
        if self._protocol.error is not None:
            raise ConnectionResetError(f"the connection was lost: {self._protocol.error}")
        if self._transport.is_closing():
            raise ConnectionResetError("the connection is closed")

    async def receive(self) -> bytes:
        """What arrived since the last call; ``b""`` at the end of the stream."""
        protocol = self._protocol
        while not protocol.chunks:
            if protocol.eof:
                if protocol.error is not None:
                    raise protocol.error
                return b""
            await protocol.wait_readable()
        return self._take()

    def _take(self) -> bytes:
        """What arrived and was not read, in one piece (reading goes on if it had stopped)."""
        protocol = self._protocol
        chunks = protocol.chunks
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        protocol.buffered = 0
        if protocol.reading_paused:
            protocol.reading_paused = False
            self._transport.resume_reading()
        return data

    def start_pushing(
        self,
        on_data: Callable[[bytes], None],
        on_end: Callable[[BaseException | None], None],
    ) -> None:
        """Hand what arrives to ``on_data`` from ``data_received`` (see
        :class:`nsq_client.PushStream`), first what arrived and was not read."""
        protocol = self._protocol
        protocol.on_data = on_data
        protocol.on_end = on_end
        if protocol.chunks:
            on_data(self._take())
        if protocol.eof:
            protocol._end()

    def stop_pushing(self) -> None:
        protocol = self._protocol
        protocol.on_data = protocol.on_end = None

    async def aclose(self) -> None:
        self._transport.close()
        if self._raw is not None:
            # no close_notify exchange to wait for (as anyio's TLS stream with
            # standard_compatible=False): the socket closes now, not when the loop gets to it
            self._raw.close()

    async def abort(self) -> None:
        """Close now (:class:`nsq_client.AbortStream`): what was not sent is dropped and the
        connection reset; a write waiting for room fails."""
        tcp = self._raw if self._raw is not None else self._transport
        _no_linger(tcp.get_extra_info("socket"))
        self._transport.abort()
        if self._raw is not None:
            self._raw.abort()

    async def start_tls(self, ssl_context: ssl.SSLContext, hostname: str | None) -> AsyncioStream:
        """The TLS client handshake; the stream to use afterwards."""
        loop = asyncio.get_running_loop()
        protocol = self._protocol
        if protocol.chunks or protocol.eof:
            raise ConnectionError("data or the end of the stream came before the TLS handshake")
        upgraded = await loop.start_tls(
            self._transport, protocol, ssl_context, server_hostname=hostname
        )
        if upgraded is None:  # pragma: no cover (the transport closed during the handshake)
            raise ConnectionResetError("the connection closed during the TLS handshake")
        # (no isinstance check: uvloop's transport is no asyncio.Transport, see connection_made)
        protocol.transport = upgraded
        return AsyncioStream(upgraded, protocol, raw=self._transport)


def _no_linger(sock: object) -> None:
    """Make closing ``sock`` reset its connection at once (``SO_LINGER`` 0), dropping what
    the kernel still holds to send."""
    setsockopt = getattr(sock, "setsockopt", None)
    if setsockopt is not None:
        with contextlib.suppress(OSError):  # closed already
            setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


async def connect(host: str, port: int) -> AsyncioStream:
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.create_connection(_Protocol, host, port)
    return AsyncioStream(transport, protocol)
