"""The core's runner: carries out a sans-IO core's outputs on a :class:`~nsq_client.Backend`.

It makes no protocol decision: it connects, writes, starts TLS, closes and reads when the core
says so, feeds the core bytes and the loop's time, and sleeps until the core's next deadline.

Three pieces: :class:`CoreRunner` carries out the core's outputs, all of them in one place
(:meth:`CoreRunner._carry_out`, from a task or from a callback of the loop), and keeps the
connections; each connection (:class:`_Link`) has a :class:`_Writer`, which puts the core's
bytes on its stream in order, one write at a time, and a :class:`_Reader`, which feeds what
the stream reads (or hands over) to the core and carries out the TLS upgrade.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from contextlib import suppress
from typing import Any, cast

from nsq_proto import ClientCore, Close, Connect, Event, HttpRequest, NSQError, Send, StartTLS

from ._backend import (
    AbortStream,
    Backend,
    EventLike,
    PushStream,
    ScopeLike,
    ScopeMaker,
    Stream,
    TaskGroupLike,
    event_factory,
    scope_factory,
)

__all__ = ["CoreRunner", "TransportError"]


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


class _Link:
    """One connection to nsqd: its address and stream, whether it is over, and the two
    machines that use the stream (its :class:`_Writer` and its :class:`_Reader`)."""

    __slots__ = ("closed", "conn_id", "host", "port", "reader", "stream", "writer")

    def __init__(self, runner: CoreRunner, conn_id: int, host: str, port: int) -> None:
        self.conn_id = conn_id
        self.host = host
        self.port = port
        #: None until connected; the TLS stream once upgraded
        self.stream: Stream | None = None
        #: the core closed it, or it was lost: nothing more is written or read
        self.closed = False
        self.writer = _Writer(runner, self)
        self.reader = _Reader(runner, self)


class _Writer:
    """Writes a connection's bytes in the order the core gave them, one write at a time.

    :meth:`offer` takes each ``Send`` without waiting: a stream with room
    (:class:`NowaitStream`) takes it at once; bytes that cannot go yet wait, in
    ``held_back`` before the connection is made and during a TLS upgrade (they go on the
    stream that comes next), in ``pending`` behind a write under way; otherwise the caller
    gets the write turn and runs :meth:`write`, which waits for room.  A write the peer refused is kept in ``error`` for the reader to report (the
    peer's last words, often the error that made it close, are read first); a write slower
    than ``write_timeout`` aborts the connection at once.
    """

    __slots__ = ("_link", "_nowait", "_runner", "busy", "error", "held", "held_back", "pending")

    def __init__(self, runner: CoreRunner, link: _Link) -> None:
        self._runner = runner
        self._link = link
        #: the stream's ``send_nowait``, when it has one (see :class:`NowaitStream`)
        self._nowait: Callable[[bytes], bool] | None = None
        #: bytes waiting for the write under way
        self.pending: list[bytes] = []
        #: bytes waiting for the stream to be ready (connected, or upgraded to TLS)
        self.held_back: list[bytes] = []
        #: set while a write is under way (the write turn): set once it is done
        self.busy: EventLike | None = None
        #: True until connected and while a TLS upgrade is under way: bytes wait
        self.held = True
        #: a write failed because the peer went away (the reader reports it)
        self.error: BaseException | None = None

    def offer(self, data: bytes) -> bool:
        """Hand ``data`` over without waiting.  True once dealt with: written by a stream
        with room, queued in ``pending`` (until the stream is ready, or for the write under
        way), or dropped with a connection that is over.  False when it must be written
        waiting for room: it is queued and the write turn (``busy``) is the caller's, who
        must run :meth:`write` (now, or in a task of its own)."""
        if self._link.closed or self.error is not None:
            return True
        if self.held:
            # for the stream that comes next: after a write under way, whose bytes (queued
            # before the StartTLS) go on the stream before it
            self.held_back.append(data)
            return True
        if self.busy is not None:
            self.pending.append(data)  # written by the write under way
            return True
        nowait = self._nowait
        if nowait is not None:
            # a stream with room takes the bytes at once: no other writer can come between,
            # so no event for them to wait on and no write-timeout scope
            try:
                if nowait(data):
                    return True
            except self._runner._write_failures as exc:
                # the peer closed or reset: the reader reports it once it read what came first
                self.error = exc
                return True
        self.pending.append(data)
        self.busy = self._runner.new_event()
        return False

    async def write(self) -> None:
        """Write what is pending, then what queued meanwhile, until none is left; the caller
        has the write turn (``busy``), given back (and set) once done."""
        done = self.busy
        link = self._link
        stream = link.stream
        assert done is not None and stream is not None
        runner = self._runner
        timeout = runner._write_timeout
        pending = self.pending
        try:
            while True:
                data = b"".join(pending)
                pending.clear()
                # once taken from the core, bytes must reach the socket even if this task is
                # being cancelled (they may be the FIN/REQ of a stop); bounded, not forever
                with runner.new_scope(deadline=runner._clock() + timeout, shield=True) as scope:
                    await stream.send(data)
                if getattr(scope, "cancelled_caught", False):
                    # part of a command may be on the wire: the connection cannot go on
                    raise TransportError(
                        f"writing to {link.host}:{link.port} took over {timeout} s"
                    )
                if not pending:
                    break
        except runner._write_failures as exc:
            self.busy = None
            done.set()
            if isinstance(exc, TransportError):
                # too slow: the peer may be frozen or gone, close now without waiting on it
                await runner._lost(link, exc, abort=True)
            else:
                # the peer closed or reset: its last words (an error frame) may be unread
                # yet; the reader reaches the end of the stream at once and reports this
                self.error = exc
            return
        self.busy = None
        done.set()

    async def release(self) -> None:
        """The link's stream is ready (connected, or upgraded to TLS): write to it from now
        on, what was held back first."""
        self._nowait = getattr(self._link.stream, "send_nowait", None)
        self.held = False
        self.pending.extend(self.held_back)
        self.held_back.clear()
        if self.pending and self.busy is None:
            self.busy = self._runner.new_event()
            await self.write()


class _Reader:
    """Reads a connection into the core, in the connection's task, and carries out its TLS
    upgrade there.

    A :class:`PushStream` hands its reads over from the loop's callbacks instead
    (:meth:`_pushed`): the bytes reach the core, and its outputs the socket, in that
    callback.  A ``StartTLS`` stops the reads (:meth:`start_upgrade`); the handshake runs in
    the read's place, then the reads go on over TLS.  The end of the stream is reported once
    (:meth:`_end`), with the error that says best why it came.
    """

    __slots__ = (
        "_done",
        "_end_error",
        "_ended",
        "_failure",
        "_link",
        "_runner",
        "_scope",
        "tls_fresh",
        "upgrading",
    )

    def __init__(self, runner: CoreRunner, link: _Link) -> None:
        self._runner = runner
        self._link = link
        #: the scope of the read (or the handshake) under way, to cancel it
        self._scope: ScopeLike | None = None
        #: a StartTLS came: the handshake is next
        self.upgrading = False
        #: TLS is up and nothing was read since
        self.tls_fresh = False
        #: while a :class:`PushStream` hands reads over: set at its end or on a failure
        self._done: EventLike | None = None
        #: the stream ended (``_end_error``: None at a clean end)
        self._ended = False
        self._end_error: BaseException | None = None
        #: what a pushed read raised, for the connection's task to raise
        self._failure: Exception | None = None

    def stop(self) -> None:
        """Cancel the read (or the handshake) under way: the connection is closing, or
        upgrading."""
        if self._scope is not None:
            self._scope.cancel()

    def start_upgrade(self) -> None:
        """A StartTLS: stop reading (what comes now stays unread until the handshake), and
        run the handshake next."""
        self.upgrading = True
        stop_pushing = getattr(self._link.stream, "stop_pushing", None)
        if stop_pushing is not None:
            stop_pushing()
        self.stop()

    async def run(self) -> None:
        """Read until the connection is over (the connection's task)."""
        link = self._link
        runner = self._runner
        backend = runner.backend
        core = runner.core
        while not link.closed:
            if self.upgrading:
                if not await self._upgrade():
                    return
                continue
            stream = link.stream
            assert stream is not None
            if hasattr(stream, "start_pushing"):
                if await self._pushed_reads(cast(PushStream, stream)):
                    continue
                return
            data: bytes | None = None
            with runner.new_scope() as scope:
                self._scope = scope
                try:
                    data = await stream.receive()
                except backend.io_errors as exc:
                    self._scope = None
                    await self._end(exc)
                    return
                self._scope = None
            if data is None:
                continue  # the read was cancelled: an upgrade or a close
            if not data:
                await self._end(None)
                return
            self.tls_fresh = False
            core.receive_data(link.conn_id, data, runner._clock())
            # the events and answers of these bytes, from this task: one hop less
            await runner.drain_here()

    async def _end(self, error: BaseException | None) -> None:
        """The stream ended (``error`` None: cleanly): the connection is lost, with the
        error that says best why: nsqd refusing the TLS handshake (an alert right after it:
        TLS 1.3 servers refuse a client certificate only after the client's side is done),
        else a write the peer refused, else the stream's own."""
        link = self._link
        refused = self._refusal(error) if error is not None and self.tls_fresh else None
        await self._runner._lost(link, _worded(refused or link.writer.error or error))

    async def _pushed_reads(self, stream: PushStream) -> bool:
        """Let ``stream`` hand reads over (:meth:`_pushed`) until its end, a close or a TLS
        upgrade; False once the connection is over."""
        backend = self._runner.backend
        self._done = done = backend.event()
        try:
            with backend.cancel_scope() as scope:
                self._scope = scope
                stream.start_pushing(self._pushed, self._push_ended)
                await done.wait()
        finally:
            self._scope = None
            stream.stop_pushing()
        failure = self._failure
        if failure is not None:
            raise failure
        if not self._ended:
            return True  # cancelled: an upgrade or a close (the loop looks)
        await self._end(self._end_error)
        return False

    def _pushed(self, data: bytes) -> None:
        """Bytes a :class:`PushStream` handed over: into the core, and its outputs out, here."""
        link = self._link
        if link.closed:
            return
        self.tls_fresh = False
        runner = self._runner
        try:
            runner.core.receive_data(link.conn_id, data, runner._clock())
            runner.drain_soon()
        except Exception as exc:
            # raised in the connection's task, as a read there would (not into the loop)
            self._failure = exc
            assert link.stream is not None and self._done is not None
            cast(PushStream, link.stream).stop_pushing()
            self._done.set()

    def _push_ended(self, error: BaseException | None) -> None:
        self._ended = True
        self._end_error = error
        assert self._done is not None
        self._done.set()

    async def _upgrade(self) -> bool:
        """The TLS handshake, then the stream is the TLS one; False once the connection is
        over."""
        link = self._link
        writer = link.writer
        runner = self._runner
        backend = runner.backend
        assert link.stream is not None
        if writer.busy is not None:
            # the write that carried IDENTIFY may still be returning (nsqd answered first):
            # the handshake writes on the same stream, after it (new bytes are held back)
            await writer.busy.wait()
        context = runner._ssl_context
        if context is None:
            context = backend.default_ssl_context()
        hostname = runner._tls_hostname or link.host
        upgraded: Stream | None = None
        # cancellable like a read: the core closes a link whose handshake takes too long
        with backend.cancel_scope() as scope:
            self._scope = scope
            try:
                upgraded = await backend.start_tls(
                    link.stream, context, hostname if backend.ssl_check_hostname(context) else None
                )
            except backend.io_errors as exc:
                self._scope = None
                error = self._refusal(exc)
                if error is None:
                    error = TransportError(
                        f"TLS handshake with {link.host}:{link.port} failed: {exc}"
                    )
                    error.__cause__ = exc
                await runner._lost(link, error)
                return False
            self._scope = None
        if upgraded is None:
            return False  # closed meanwhile
        link.stream = upgraded
        self.upgrading = False
        self.tls_fresh = True
        runner.core.tls_established(link.conn_id, backend.current_time())
        await writer.release()
        runner.wake()
        return True

    def _refusal(self, exc: BaseException) -> TransportError | None:
        """A TLS error in ``exc``'s chain as a permanent TransportError (the handshake was
        refused), or None."""
        backend = self._runner.backend
        tls = _find(exc, backend.tls_errors)
        if tls is None or isinstance(tls, backend.transient_tls_errors):
            return None
        link = self._link
        error = TransportError(
            f"TLS handshake with {link.host}:{link.port} failed: {tls}", permanent=True
        )
        error.__cause__ = exc
        return error


class CoreRunner:
    """Runs a sans-IO core on a backend: carries out its outputs over the backend's streams
    and feeds it bytes and the loop's time.

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
        before_output: Callable[[], None] | None = None,
    ) -> None:
        self.backend = backend
        self.core = core
        self._on_event = on_event
        #: called before the core's timers and outputs are looked at: what the client keeps
        #: for the core to take in at once (the consumer's answers given since the last pass)
        self._before_output = before_output
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
        #: makes the loop's events (a cheaper callable once the loop runs: see :meth:`start`)
        self.new_event: Callable[[], EventLike] = backend.event
        #: makes the loop's cancel scopes (a cheaper callable once the loop runs, as new_event)
        self.new_scope: ScopeMaker = backend.cancel_scope
        self._woken = False
        #: the deadline the pump task sleeps until (-inf while it runs: it looks again)
        self._sleeping_until = -math.inf
        self._tg: TaskGroupLike | None = None
        #: whether the pump task runs: while it does, its group takes new tasks
        self._pumping = False
        #: the loop's clock (a cheaper callable once the loop runs: see :meth:`start`)
        self._clock: Callable[[], float] = backend.current_time

    def wake(self) -> None:
        if not self._woken:  # once per pump pass (called for every answer)
            self._woken = True
            self._wake.set()

    async def drain_here(self, *, wait: bool = True) -> None:
        """Carry out the core's outputs in the calling task, now: what a call into the core
        produced goes out without a hop to the pump task (the latency of a publish, of a
        read).  Wakes the pump task when the core's next deadline moved before the one it
        sleeps until.  Without ``wait``, bytes handed to another task's write under way are
        not waited for (a publish waits for its answer, bounded by its own deadline)."""
        while (waiting := self._carry_out(None, wait=wait)) is not None:
            await waiting
        deadline = self.core.next_deadline()
        if deadline is not None and deadline < self._sleeping_until:
            self.wake()

    def start(self, task_group: TaskGroupLike) -> None:
        """Run the pump task in ``task_group`` (from now on, outputs may be carried out from
        any task: connections and lookups start in that group)."""
        self._tg = task_group
        self._clock = self.backend.clock()
        self.new_event = event_factory(self.backend)
        self.new_scope = scope_factory(self.backend)
        task_group.start_soon(self.run, task_group)

    async def run(self, task_group: TaskGroupLike) -> None:
        """The pump loop; runs until cancelled."""
        self._tg = task_group
        self._pumping = True
        try:
            await self._pump(task_group)
        finally:
            self._pumping = False

    async def _pump(self, task_group: TaskGroupLike) -> None:
        core = self.core
        new_event = self.new_event
        while True:
            self._wake = new_event()
            self._woken = False
            if self._before_output is not None:
                self._before_output()
            core.handle_timer(self._clock())  # an early call does nothing
            # a write that must wait (and a close) goes on in a task of its own: the pump
            # never waits on a peer, so the core's timers fire on time whatever one does
            self._carry_out(task_group)
            if self._wake.is_set():
                continue
            deadline = core.next_deadline()
            self._sleeping_until = until = math.inf if deadline is None else deadline
            try:
                with self.new_scope(deadline=until):
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
                task_group.start_soon(link.reader.run)

    async def flush(self) -> None:
        """Carry out every pending output now (when the pump task may be cancelled)."""
        while (waiting := self._carry_out(None)) is not None:
            await waiting

    async def aclose(self) -> None:
        """Close every transport still open."""
        for link in list(self._links.values()):
            self._links.pop(link.conn_id, None)
            await self._shut(link)

    def _carry_out(
        self, spawn: TaskGroupLike | None, wait: bool = False
    ) -> Awaitable[object] | None:
        """Carry out the core's outputs, in order, up to one that must be waited for, and
        return that wait (the caller awaits it, then calls again); None once there are no
        more.  Every output is carried out here, whoever calls:

        - ``spawn`` None: from a task (a call into the core that drains at once, a flush).
          With ``wait``, bytes handed to a write already under way on their connection
          (another task's) are waited for until written.
        - ``spawn`` a task group: from a callback of the loop (a pushed read), which cannot
          wait, or from the pump task, which must not (the core's timers wait on it): a
          write that must wait and a close go on in tasks of that group (later bytes queue
          behind the write), and None is returned at the end.
        """
        if self._before_output is not None:
            self._before_output()
        core = self.core
        on_event = self._on_event
        links = self._links
        while (out := core.next_output()) is not None:
            if isinstance(out, Event):
                on_event(out)
            elif type(out) is Send:
                link = links.get(out.conn_id)
                if link is None:
                    continue  # closed: the bytes go nowhere
                writer = link.writer
                if writer.offer(out.data):
                    if wait and writer.busy is not None and not writer.held:
                        return writer.busy.wait()  # ours go next; bounded by its deadline
                elif spawn is not None:
                    spawn.start_soon(writer.write)
                else:
                    return writer.write()
            elif isinstance(out, Connect):
                self._connect(out)
            elif isinstance(out, StartTLS):
                self._start_tls(out)
            elif isinstance(out, Close):
                closing = links.pop(out.conn_id, None)
                if closing is not None:
                    if spawn is None:
                        return self._shut(closing, out.abort)
                    spawn.start_soon(self._shut, closing, out.abort)
            elif isinstance(out, HttpRequest):
                assert self._tg is not None
                self._tg.start_soon(self._http, out)
        return None

    def drain_soon(self) -> None:
        """Carry out the core's outputs without waiting, from a callback of the loop (a
        pushed read); wake the pump task when the core's next deadline moved before the one
        it sleeps until.

        Once the pump task has ended, its group is ending too (on trio it may already be
        closed to new arrivals, and a task started there would never run): the outputs wait
        in the core for what comes next, a last exchange (:meth:`resume`, :meth:`flush`) or
        :meth:`aclose`, which closes every connection still open."""
        if not self._pumping:
            return
        assert self._tg is not None
        self._carry_out(self._tg)
        deadline = self.core.next_deadline()
        if deadline is not None and deadline < self._sleeping_until:
            self.wake()

    def _connect(self, out: Connect) -> None:
        link = _Link(self, out.conn_id, out.host, out.port)
        self._links[out.conn_id] = link
        assert self._tg is not None
        self._tg.start_soon(self._connection, link, out.timeout)

    def _start_tls(self, out: StartTLS) -> None:
        link = self._links.get(out.conn_id)
        if link is None:
            return
        if out.buffered:
            # nsqd sends nothing between its IDENTIFY response and our ClientHello
            error = TransportError("data arrived before the TLS handshake")
            assert self._tg is not None
            self._tg.start_soon(self._lost, link, error)
            return
        link.writer.held = True  # what comes now is written over TLS, once it is up
        link.reader.start_upgrade()

    async def _connection(self, link: _Link, timeout: float) -> None:
        """The connection's task: connect, then read until the connection is over."""
        backend = self.backend
        try:
            with backend.cancel_scope(deadline=backend.current_time() + timeout) as scope:
                link.stream = await backend.connect_tcp(link.host, link.port)
            if link.stream is None or getattr(scope, "cancelled_caught", False):
                raise TimeoutError(f"connecting to {link.host}:{link.port} timed out")
        except self._failures as exc:
            error = TransportError(f"connecting to {link.host}:{link.port} failed: {_why(exc)}")
            error.__cause__ = exc
            await self._lost(link, error)
            return
        if link.closed:
            await self._shut(link)
            return
        self.core.connection_made(link.conn_id, backend.current_time())
        await link.writer.release()
        self.wake()
        await link.reader.run()

    async def _shut(self, link: _Link, abort: bool = False) -> None:
        """Close the link's stream: after the write under way, or with ``abort`` (the peer
        is judged dead) at once, dropping what was not sent (:class:`AbortStream`; a
        stream without ``abort`` is closed)."""
        backend = self.backend
        busy = link.writer.busy
        if busy is not None and not link.closed and not abort:
            # let the write under way (and what queued behind it) finish first
            with backend.cancel_scope(
                deadline=backend.current_time() + self._write_timeout, shield=True
            ):
                await busy.wait()
        link.closed = True
        link.reader.stop()
        stream = link.stream
        if stream is not None:
            with backend.cancel_scope(deadline=backend.current_time() + 1.0, shield=True):
                with suppress(*backend.io_errors):
                    if abort and hasattr(stream, "abort"):
                        # a write waiting on the peer fails now, and gives its turn back
                        await cast(AbortStream, stream).abort()
                    else:
                        await stream.aclose()

    async def _lost(self, link: _Link, error: BaseException | None, abort: bool = False) -> None:
        if link.closed:
            return
        self._links.pop(link.conn_id, None)
        await self._shut(link, abort)
        self.core.connection_lost(link.conn_id, self.backend.current_time(), error)
        self.wake()

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


def _worded(exc: BaseException | None) -> BaseException | None:
    """``exc``, or when it has no words (anyio on trio reads a reset as a
    ``BrokenResourceError()`` caused by the reset) a TransportError with those of its first
    cause that has some, else with its type's name."""
    if exc is None or str(exc):
        return exc
    seen = 0
    current = exc.__cause__ or exc.__context__
    while current is not None and seen < 16 and not str(current):
        current = current.__cause__ or current.__context__
        seen += 1
    error = TransportError(str(current) if current is not None else type(exc).__name__)
    error.__cause__ = exc
    return error


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
