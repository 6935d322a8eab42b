"""The pump: carries out a core's actions with anyio and feeds it bytes and time.

No protocol decision is made here.  The driver opens the TCP connections and HTTP requests the
core asks for, writes what it says to write, starts TLS when it says so, closes what it says to
close, reads everything and hands it back with the loop's clock as ``now``, and sleeps until
the core's next deadline.  Events go to a callback.
"""

from __future__ import annotations

import contextlib
import math
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import anyio
import anyio.abc
from anyio.streams.tls import TLSStream

from nsq_proto import Close, Connect, Event, HttpRequest, Output, Send, StartTLS

__all__ = ["Core", "Driver"]

_READ_SIZE = 256 * 1024
_IO_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    ssl.SSLError,
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
    anyio.EndOfStream,
    TimeoutError,
)


class Core(Protocol):
    """What a driver needs of a consumer or producer core."""

    def next_output(self) -> Output | None: ...
    def next_deadline(self) -> float | None: ...
    def handle_timer(self, now: float) -> None: ...
    def connection_made(self, conn_id: int, now: float) -> None: ...
    def tls_established(self, conn_id: int, now: float) -> None: ...
    def receive_data(self, conn_id: int, data: bytes, now: float) -> None: ...
    def connection_lost(
        self, conn_id: int, now: float, error: BaseException | None = None
    ) -> None: ...
    def http_data(self, request_id: int, data: bytes, now: float) -> None: ...
    def http_failed(self, request_id: int, error: BaseException, now: float) -> None: ...


@dataclass(eq=False)
class _Link:
    conn_id: int
    host: str
    stream: anyio.abc.ByteStream | None = None
    read_scope: anyio.CancelScope | None = None
    upgrade: bool = False
    closed: bool = False
    pending: list[bytes] = field(default_factory=list)


class Driver:
    """Runs one core.  Call :meth:`wake` after every call into the core from outside."""

    def __init__(
        self,
        core: Core,
        on_event: Callable[[Event], None],
        *,
        ssl_context: ssl.SSLContext | None = None,
        tls_hostname: str | None = None,
    ) -> None:
        self.core = core
        self._on_event = on_event
        self._ssl_context = ssl_context
        self._tls_hostname = tls_hostname
        self._links: dict[int, _Link] = {}
        self._wake = anyio.Event()
        self._tg: anyio.abc.TaskGroup | None = None

    def wake(self) -> None:
        self._wake.set()

    async def run(self, task_group: anyio.abc.TaskGroup) -> None:
        """The pump loop; runs until cancelled."""
        self._tg = task_group
        core = self.core
        while True:
            self._wake = anyio.Event()
            core.handle_timer(anyio.current_time())  # an early call does nothing
            await self._drain()
            deadline = core.next_deadline()
            if self._wake.is_set():
                continue
            with anyio.CancelScope(deadline=math.inf if deadline is None else deadline):
                await self._wake.wait()

    async def aclose(self) -> None:
        """Close every transport still open (the last step of leaving the client)."""
        for link in list(self._links.values()):
            self._links.pop(link.conn_id, None)
            await self._shut(link)

    async def flush(self) -> None:
        """Carry out every pending output now (used when the pump task may be cancelled)."""
        await self._drain()

    async def _drain(self) -> None:
        core = self.core
        on_event = self._on_event
        while (out := core.next_output()) is not None:
            if isinstance(out, Event):
                on_event(out)
            elif type(out) is Send:
                await self._send(out.conn_id, out.data)
            elif isinstance(out, Connect):
                link = _Link(out.conn_id, out.host)
                self._links[out.conn_id] = link
                assert self._tg is not None
                self._tg.start_soon(self._connection, link, out.port, out.timeout)
            elif isinstance(out, StartTLS):
                self._start_tls(out)
            elif isinstance(out, Close):
                await self._close(out.conn_id)
            elif isinstance(out, HttpRequest):
                assert self._tg is not None
                self._tg.start_soon(self._http, out)

    # ------------------------------------------------------------------ TCP connections

    async def _send(self, conn_id: int, data: bytes) -> None:
        link = self._links.get(conn_id)
        if link is None or link.closed:
            return
        if link.stream is None or link.upgrade:
            link.pending.append(data)  # written once the TLS handshake is done
            return
        try:
            await link.stream.send(data)
        except _IO_ERRORS as exc:
            await self._lost(link, exc)

    async def _close(self, conn_id: int) -> None:
        link = self._links.pop(conn_id, None)
        if link is None:
            return
        await self._shut(link)

    async def _shut(self, link: _Link) -> None:
        link.closed = True
        if link.read_scope is not None:
            link.read_scope.cancel()
        if link.stream is not None:
            with (
                anyio.CancelScope(shield=True),
                anyio.move_on_after(1.0),
                contextlib.suppress(*_IO_ERRORS),
            ):
                await link.stream.aclose()

    async def _lost(self, link: _Link, error: BaseException | None) -> None:
        if link.closed:
            return
        self._links.pop(link.conn_id, None)
        await self._shut(link)
        self.core.connection_lost(link.conn_id, anyio.current_time(), error)
        self.wake()

    def _start_tls(self, out: StartTLS) -> None:
        link = self._links.get(out.conn_id)
        if link is None:
            return
        if out.buffered:
            # nsqd sends nothing between its IDENTIFY response and our ClientHello
            self.core.connection_lost(
                link.conn_id, anyio.current_time(), ssl.SSLError("data before the TLS handshake")
            )
            return
        link.upgrade = True
        if link.read_scope is not None:
            link.read_scope.cancel()

    async def _connection(self, link: _Link, port: int, timeout: float) -> None:
        core = self.core
        try:
            with anyio.fail_after(timeout):
                link.stream = await anyio.connect_tcp(link.host, port)
        except _IO_ERRORS as exc:
            await self._lost(link, exc)
            return
        if link.closed:
            await link.stream.aclose()
            return
        core.connection_made(link.conn_id, anyio.current_time())
        self.wake()
        await self._read_loop(link)

    async def _read_loop(self, link: _Link) -> None:
        core = self.core
        while not link.closed:
            if link.upgrade:
                if not await self._upgrade(link):
                    return
                continue
            stream = link.stream
            assert stream is not None
            with anyio.CancelScope() as scope:
                link.read_scope = scope
                try:
                    data = await stream.receive(_READ_SIZE)
                except anyio.EndOfStream:
                    await self._lost(link, None)
                    return
                except _IO_ERRORS as exc:
                    await self._lost(link, exc)
                    return
                finally:
                    link.read_scope = None
                core.receive_data(link.conn_id, data, anyio.current_time())
                self.wake()

    async def _upgrade(self, link: _Link) -> bool:
        assert link.stream is not None
        context = self._ssl_context or ssl.create_default_context()
        hostname = self._tls_hostname or link.host
        try:
            link.stream = await TLSStream.wrap(
                link.stream,
                hostname=hostname if context.check_hostname else None,
                server_side=False,
                ssl_context=context,
                standard_compatible=False,
            )
        except _IO_ERRORS as exc:
            await self._lost(link, exc)
            return False
        link.upgrade = False
        self.core.tls_established(link.conn_id, anyio.current_time())
        pending, link.pending = link.pending, []
        for data in pending:
            await self._send(link.conn_id, data)
        self.wake()
        return True

    # ------------------------------------------------------------------ lookupd HTTP

    async def _http(self, req: HttpRequest) -> None:
        core = self.core
        try:
            with anyio.fail_after(req.timeout):
                stream = await anyio.connect_tcp(req.host, req.port)
                async with stream:
                    await stream.send(req.data)
                    while True:
                        try:
                            chunk = await stream.receive(_READ_SIZE)
                        except anyio.EndOfStream:
                            core.http_data(req.request_id, b"", anyio.current_time())
                            break
                        core.http_data(req.request_id, chunk, anyio.current_time())
                        self.wake()
        except _IO_ERRORS as exc:
            core.http_failed(req.request_id, exc, anyio.current_time())
        self.wake()
