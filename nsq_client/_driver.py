"""The pump: carries out a sans-IO core's outputs on a :class:`~nsq_client.Backend`.

It makes no protocol decision: it connects, writes, starts TLS, closes and reads when the core
says so, feeds the core bytes and the loop's time, and sleeps until the core's next deadline.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from functools import partial
from typing import Any, cast

from nsq_proto import ClientCore, Close, Connect, Event, HttpRequest, NSQError, Send, StartTLS

from ._backend import Backend, EventLike, PushStream, ScopeLike, Stream, TaskGroupLike

__all__ = ["Driver", "TransportError"]


class TransportError(NSQError, ConnectionError):
    """The network failed: refused, reset, timed out, TLS handshake failed.

    ``permanent`` is True when retrying will not help (the TLS handshake was refused: an
    untrusted certificate, a name mismatch, no common protocol version)."""

    def __init__(self, msg: str, *, permanent: bool = False) -> None:
        super().__init__(msg)
        self.permanent = permanent

    def __reduce__(self) -> tuple[object, ...]:
        return (_transport_error, (str(self), self.permanent))


def _transport_error(msg: str, permanent: bool) -> TransportError:
    return TransportError(msg, permanent=permanent)


@dataclass(eq=False)
class _Link:
    conn_id: int
    host: str
    port: int
    stream: Stream | None = None
    #: the stream's ``send_nowait``, when it has one (see :class:`NowaitStream`)
    send_nowait: Callable[[bytes], bool] | None = None
    read_scope: ScopeLike | None = None
    upgrade: bool = False
    closed: bool = False
    pending: list[bytes] = field(default_factory=list)
    #: set while a write is under way (one writer at a time; others queue in ``pending``)
    sending: EventLike | None = None
    #: TLS is up and nothing was read since
    tls_fresh: bool = False
    #: a write failed because the peer went away: the read loop reports it once it has read
    #: what the peer said before (often the error that made it close)
    write_error: BaseException | None = None
    #: while a :class:`PushStream` hands reads over: set at its end or on a failure
    push_done: EventLike | None = None
    #: the stream ended (``end_error``: None at a clean end)
    ended: bool = False
    end_error: BaseException | None = None
    #: what a pushed read raised, for the connection's task to raise
    push_failure: Exception | None = None


class Driver:
    """Carries out a core's outputs and feeds it bytes and the loop's time.

    Makes no protocol decision: it connects, writes, starts TLS, closes and reads when the
    core says so, and sleeps until the core's next deadline.  Call :meth:`wake` after every
    call into the core from outside.
    """

    def __init__(
        self,
        backend: Backend,
        core: ClientCore,
        on_event: Callable[[Event], None],
        *,
        ssl_context: Any = None,
        tls_hostname: str | None = None,
        write_timeout: float = 10.0,
    ) -> None:
        self.backend = backend
        self.core = core
        self._on_event = on_event
        self._ssl_context = ssl_context
        self._tls_hostname = tls_hostname
        self._write_timeout = write_timeout
        self._links: dict[int, _Link] = {}
        self._failures: tuple[type[BaseException], ...] = (TimeoutError, *backend.io_errors)
        self._write_failures: tuple[type[BaseException], ...] = (
            TransportError,
            *backend.io_errors,
        )
        self._wake: EventLike = backend.event()
        self._woken = False
        #: the deadline the pump task sleeps until (-inf while it runs: it looks again)
        self._sleeping_until = -math.inf
        self._tg: TaskGroupLike | None = None
        #: the loop's clock (a cheaper callable once the loop runs: see :meth:`start`)
        self._clock: Callable[[], float] = backend.current_time

    def wake(self) -> None:
        if not self._woken:  # once per pump pass (called for every answer)
            self._woken = True
            self._wake.set()

    async def drain_here(self) -> None:
        """Carry out the core's outputs in the calling task, now: what a call into the core
        produced goes out without a hop to the pump task (the latency of a publish, of a
        read).  Wakes the pump task when the core's next deadline moved before the one it
        sleeps until."""
        await self._drain(wait=True)
        deadline = self.core.next_deadline()
        if deadline is not None and deadline < self._sleeping_until:
            self.wake()

    def start(self, task_group: TaskGroupLike) -> None:
        """Run the pump task in ``task_group`` (from now on, outputs may be carried out from
        any task: connections and lookups start in that group)."""
        self._tg = task_group
        self._clock = self.backend.clock()
        task_group.start_soon(self.run, task_group)

    async def run(self, task_group: TaskGroupLike) -> None:
        """The pump loop; runs until cancelled."""
        self._tg = task_group
        backend = self.backend
        core = self.core
        while True:
            self._wake = backend.event()
            self._woken = False
            core.handle_timer(self._clock())  # an early call does nothing
            await self._drain()
            if self._wake.is_set():
                continue
            deadline = core.next_deadline()
            self._sleeping_until = until = math.inf if deadline is None else deadline
            try:
                with backend.cancel_scope(deadline=until):
                    await self._wake.wait()
            finally:
                self._sleeping_until = -math.inf

    def resume(self, task_group: TaskGroupLike) -> None:
        """Run the pump task and a reading task for every open connection in
        ``task_group``, after the tasks of :meth:`start` ended (a last exchange, such as a
        cancelled consumer's CLS and requeues, in tasks shielded from that cancellation)."""
        self.start(task_group)
        for link in self._links.values():
            if link.stream is not None and not link.closed:
                task_group.start_soon(self._read_loop, link)

    async def flush(self) -> None:
        """Carry out every pending output now (when the pump task may be cancelled)."""
        await self._drain()

    async def aclose(self) -> None:
        """Close every transport still open."""
        for link in list(self._links.values()):
            self._links.pop(link.conn_id, None)
            await self._shut(link)

    async def _drain(self, *, wait: bool = False) -> None:
        """Carry out the core's outputs; with ``wait``, bytes handed to a write already under
        way on their connection (another task's) are waited for until written."""
        core = self.core
        on_event = self._on_event
        while (out := core.next_output()) is not None:
            if isinstance(out, Event):
                on_event(out)
            elif type(out) is Send:
                await self._send(out.conn_id, out.data, wait)
            elif isinstance(out, Connect):
                self._connect(out)
            elif isinstance(out, StartTLS):
                self._start_tls(out)
            elif isinstance(out, Close):
                closing = self._links.pop(out.conn_id, None)
                if closing is not None:
                    await self._shut(closing)
            elif isinstance(out, HttpRequest):
                assert self._tg is not None
                self._tg.start_soon(self._http, out)

    def _drain_now(self) -> None:
        """Carry out the core's outputs without waiting, from a callback of the loop (a
        pushed read): bytes a stream takes at once are written here, a write that must wait
        and a close go on in a task of their own."""
        core = self.core
        on_event = self._on_event
        tg = self._tg
        assert tg is not None
        while (out := core.next_output()) is not None:
            if isinstance(out, Event):
                on_event(out)
            elif type(out) is Send:
                self._send_now(out.conn_id, out.data)
            elif isinstance(out, Connect):
                self._connect(out)
            elif isinstance(out, StartTLS):
                self._start_tls(out)
            elif isinstance(out, Close):
                closing = self._links.pop(out.conn_id, None)
                if closing is not None:
                    tg.start_soon(self._shut, closing)
            elif isinstance(out, HttpRequest):
                tg.start_soon(self._http, out)
        deadline = core.next_deadline()
        if deadline is not None and deadline < self._sleeping_until:
            self.wake()

    def _connect(self, out: Connect) -> None:
        link = _Link(out.conn_id, out.host, out.port)
        self._links[out.conn_id] = link
        assert self._tg is not None
        self._tg.start_soon(self._connection, link, out.port, out.timeout)

    def _write_now(self, link: _Link | None, data: bytes) -> bool:
        """Hand ``data`` to ``link`` without waiting: True once dealt with (written by a
        stream with room, queued for the connect, the TLS upgrade or the write under way, or
        dropped with a link that is gone); False when it must be written waiting for room."""
        if link is None or link.closed or link.write_error is not None:
            return True
        if link.stream is None or link.upgrade or link.sending is not None:
            link.pending.append(data)  # written once connected, TLS is up, or by the writer
            return True
        nowait = link.send_nowait
        if nowait is None:
            return False
        # a stream with room takes the bytes at once: no other writer can come between, so
        # no event for them to wait on and no write-timeout scope
        try:
            return nowait(data)
        except self._write_failures as exc:
            # the peer closed or reset: the read loop reports it once it read what came first
            link.write_error = exc
            return True

    async def _send(self, conn_id: int, data: bytes, wait: bool = False) -> None:
        link = self._links.get(conn_id)
        if self._write_now(link, data):
            if wait and link is not None and link.sending is not None and not link.upgrade:
                await link.sending.wait()  # the writer takes ours next; bounded by its deadline
            return
        assert link is not None
        link.sending = self.backend.event()
        await self._write(link, data)

    def _send_now(self, conn_id: int, data: bytes) -> None:
        """:meth:`_send` without waiting: what the stream cannot take at once is written by
        a task of its own (later bytes queue behind it)."""
        link = self._links.get(conn_id)
        if self._write_now(link, data):
            return
        assert link is not None and self._tg is not None
        link.pending.append(data)
        link.sending = self.backend.event()
        self._tg.start_soon(self._write_pending, link)

    async def _write_pending(self, link: _Link) -> None:
        data = b"".join(link.pending)
        link.pending.clear()
        await self._write(link, data)

    async def _write(self, link: _Link, data: bytes) -> None:
        """Write ``data``, then what queued in ``link.pending`` meanwhile; ``link.sending``
        (set by the caller) is set and cleared once done."""
        done = link.sending
        stream = link.stream
        assert done is not None and stream is not None
        backend = self.backend
        try:
            while True:
                # once taken from the core, bytes must reach the socket even if this task is
                # being cancelled (they may be the FIN/REQ of a stop); bounded, not forever
                with backend.cancel_scope(
                    deadline=self._clock() + self._write_timeout, shield=True
                ) as scope:
                    await stream.send(data)
                if getattr(scope, "cancelled_caught", False):
                    # part of a command may be on the wire: the connection cannot go on
                    raise TransportError(
                        f"writing to {link.host}:{link.port} took over {self._write_timeout} s"
                    )
                if not link.pending or link.upgrade:
                    break
                data = b"".join(link.pending)
                link.pending.clear()
        except self._write_failures as exc:
            link.sending = None
            done.set()
            if isinstance(exc, TransportError):
                await self._lost(link, exc)  # too slow: the peer may be frozen, close now
            else:
                # the peer closed or reset: its last words (an error frame) may be unread
                # yet; the read loop reaches the end of the stream at once and reports this
                link.write_error = exc
            return
        link.sending = None
        done.set()

    async def _shut(self, link: _Link) -> None:
        backend = self.backend
        if link.sending is not None and not link.closed:
            # let the write under way (and what queued behind it) finish first
            with backend.cancel_scope(
                deadline=backend.current_time() + self._write_timeout, shield=True
            ):
                await link.sending.wait()
        link.closed = True
        if link.read_scope is not None:
            link.read_scope.cancel()
        if link.stream is not None:
            with backend.cancel_scope(deadline=backend.current_time() + 1.0, shield=True):
                with suppress(*backend.io_errors):
                    await link.stream.aclose()

    async def _lost(self, link: _Link, error: BaseException | None) -> None:
        if link.closed:
            return
        self._links.pop(link.conn_id, None)
        await self._shut(link)
        self.core.connection_lost(link.conn_id, self.backend.current_time(), error)
        self.wake()

    def _start_tls(self, out: StartTLS) -> None:
        link = self._links.get(out.conn_id)
        if link is None:
            return
        if out.buffered:
            # nsqd sends nothing between its IDENTIFY response and our ClientHello
            error = TransportError("data arrived before the TLS handshake")
            self.core.connection_lost(link.conn_id, self.backend.current_time(), error)
            return
        link.upgrade = True
        stop_pushing = getattr(link.stream, "stop_pushing", None)
        if stop_pushing is not None:
            stop_pushing()  # what comes now stays unread until the handshake
        if link.read_scope is not None:
            link.read_scope.cancel()

    async def _connection(self, link: _Link, port: int, timeout: float) -> None:
        backend = self.backend
        try:
            with backend.cancel_scope(deadline=backend.current_time() + timeout) as scope:
                link.stream = await backend.connect_tcp(link.host, port)
                link.send_nowait = getattr(link.stream, "send_nowait", None)
            if link.stream is None or getattr(scope, "cancelled_caught", False):
                raise TimeoutError(f"connecting to {link.host}:{port} timed out")
        except self._failures as exc:
            error = TransportError(f"connecting to {link.host}:{port} failed: {_why(exc)}")
            error.__cause__ = exc
            await self._lost(link, error)
            return
        if link.closed:
            await self._shut(link)
            return
        pending, link.pending = link.pending, []
        self.core.connection_made(link.conn_id, backend.current_time())
        for data in pending:
            await self._send(link.conn_id, data)
        self.wake()
        await self._read_loop(link)

    async def _read_loop(self, link: _Link) -> None:
        backend = self.backend
        core = self.core
        while not link.closed:
            if link.upgrade:
                if not await self._upgrade(link):
                    return
                continue
            stream = link.stream
            assert stream is not None
            if hasattr(stream, "start_pushing"):
                if await self._pushed_reads(link, cast(PushStream, stream)):
                    continue
                return
            data: bytes | None = None
            with backend.cancel_scope() as scope:
                link.read_scope = scope
                try:
                    data = await stream.receive()
                except backend.io_errors as exc:
                    link.read_scope = None
                    # an alert right after the handshake is nsqd refusing it (TLS 1.3 servers
                    # refuse a client certificate only after the client's side is done)
                    refused = self._tls_failure(link, exc) if link.tls_fresh else None
                    await self._lost(link, refused or link.write_error or exc)
                    return
                link.read_scope = None
            if data is None:
                continue  # the read was cancelled: an upgrade or a close
            if not data:
                await self._lost(link, link.write_error)
                return
            link.tls_fresh = False
            core.receive_data(link.conn_id, data, self._clock())
            # the events and answers of these bytes, from this task: one hop less
            await self.drain_here()

    async def _pushed_reads(self, link: _Link, stream: PushStream) -> bool:
        """Let ``stream`` hand reads over from its callbacks (:meth:`_pushed`) until its end,
        a close or a TLS upgrade; False once the link is over."""
        backend = self.backend
        link.push_done = done = backend.event()
        try:
            with backend.cancel_scope() as scope:
                link.read_scope = scope
                stream.start_pushing(partial(self._pushed, link), partial(self._push_ended, link))
                await done.wait()
        finally:
            link.read_scope = None
            stream.stop_pushing()
        failure = link.push_failure
        if failure is not None:
            raise failure
        if not link.ended:
            return True  # cancelled: an upgrade or a close (the loop looks)
        error = link.end_error
        # as in _read_loop: an alert right after the handshake is nsqd refusing it
        refused = self._tls_failure(link, error) if error and link.tls_fresh else None
        await self._lost(link, refused or link.write_error or error)
        return False

    def _pushed(self, link: _Link, data: bytes) -> None:
        """Bytes a :class:`PushStream` handed over: into the core, and its outputs out, here."""
        if link.closed:
            return
        link.tls_fresh = False
        try:
            self.core.receive_data(link.conn_id, data, self._clock())
            self._drain_now()
        except Exception as exc:
            # raised in the connection's task, as a read there would (not into the loop)
            link.push_failure = exc
            assert link.stream is not None and link.push_done is not None
            cast(PushStream, link.stream).stop_pushing()
            link.push_done.set()

    def _push_ended(self, link: _Link, error: BaseException | None) -> None:
        link.ended = True
        link.end_error = error
        assert link.push_done is not None
        link.push_done.set()

    async def _upgrade(self, link: _Link) -> bool:
        backend = self.backend
        assert link.stream is not None
        if link.sending is not None:
            # the write that carried IDENTIFY may still be returning (nsqd answered first):
            # the handshake writes on the same stream, after it (new bytes wait in pending)
            await link.sending.wait()
        context = (
            self._ssl_context if self._ssl_context is not None else backend.default_ssl_context()
        )
        hostname = self._tls_hostname or link.host
        upgraded: Stream | None = None
        # cancellable like a read: the core closes a link whose handshake takes too long
        with backend.cancel_scope() as scope:
            link.read_scope = scope
            try:
                upgraded = await backend.start_tls(
                    link.stream, context, hostname if backend.ssl_check_hostname(context) else None
                )
            except backend.io_errors as exc:
                link.read_scope = None
                error = self._tls_failure(link, exc)
                if error is None:
                    error = TransportError(
                        f"TLS handshake with {link.host}:{link.port} failed: {exc}"
                    )
                    error.__cause__ = exc
                await self._lost(link, error)
                return False
            link.read_scope = None
        if upgraded is None:
            return False  # closed meanwhile
        link.stream = upgraded
        link.send_nowait = getattr(upgraded, "send_nowait", None)
        link.upgrade = False
        link.tls_fresh = True
        self.core.tls_established(link.conn_id, backend.current_time())
        pending, link.pending = link.pending, []
        for data in pending:
            await self._send(link.conn_id, data)
        self.wake()
        return True

    def _tls_failure(self, link: _Link, exc: BaseException) -> TransportError | None:
        """A TLS error in ``exc``'s chain as a permanent TransportError (the handshake was
        refused), or None."""
        backend = self.backend
        tls = _find(exc, backend.tls_errors)
        if tls is None or isinstance(tls, backend.transient_tls_errors):
            return None
        error = TransportError(
            f"TLS handshake with {link.host}:{link.port} failed: {tls}", permanent=True
        )
        error.__cause__ = exc
        return error

    async def _http(self, req: HttpRequest) -> None:
        backend = self.backend
        core = self.core
        try:
            with backend.cancel_scope(deadline=backend.current_time() + req.timeout) as scope:
                stream = await backend.connect_tcp(req.host, req.port)
                try:
                    await stream.send(req.data)
                    while True:
                        chunk = await stream.receive()
                        core.http_data(req.request_id, chunk, backend.current_time())
                        self.wake()
                        if not chunk:
                            return
                finally:
                    with backend.cancel_scope(shield=True):
                        with suppress(*backend.io_errors):
                            await stream.aclose()
            if getattr(scope, "cancelled_caught", False):
                raise TimeoutError("lookupd request timed out")
        except self._failures as exc:
            if _refused(exc):  # named as every loop words it differently
                refused = ConnectionRefusedError("connection refused")
                refused.__cause__ = exc
                exc = refused
            core.http_failed(req.request_id, exc, backend.current_time())
            self.wake()


def _find(exc: BaseException, kinds: tuple[type[BaseException], ...]) -> BaseException | None:
    """The first exception of ``kinds`` in ``exc``'s chain of causes and contexts."""
    seen = 0
    current: BaseException | None = exc
    while current is not None and seen < 16:
        if isinstance(current, kinds):
            return current
        current = current.__cause__ or current.__context__
        seen += 1
    return None


def _refused(exc: BaseException) -> bool:
    """Whether ``exc`` is, or was caused by, a refused connection (the loops word it their
    own ways: "Connect call failed", "All connection attempts failed"...)."""
    seen = 0
    pending: list[BaseException] = [exc]
    while pending and seen < 32:
        current = pending.pop()
        seen += 1
        if isinstance(current, ConnectionRefusedError):
            return True
        if isinstance(current, BaseExceptionGroup):
            pending.extend(current.exceptions)
        pending.extend(e for e in (current.__cause__, current.__context__) if e is not None)
    return False


def _why(exc: BaseException) -> str:
    """What went wrong connecting, in words: a refusal by name, else what was raised."""
    return "connection refused" if _refused(exc) else str(exc)
