"""The async client shared by every adapter, written against a small :class:`Backend`.

Nothing here touches the network, a clock or an event loop directly: an adapter supplies a
backend (connect, TLS, events, cancel scopes, task groups, the loop's clock), and this module
supplies what every adapter would otherwise write again: the pump that carries out a core's
outputs, the message object with its answers, and the ``Consumer``/``Producer`` facades with
graceful stop, handler style and stats.  ``nsq_anyio`` and ``nsq_trio`` bind it to their
backends and add nothing else.
"""

from __future__ import annotations

import json
import logging
import math
import random
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import AbstractAsyncContextManager, suppress
from dataclasses import dataclass, field
from typing import Any, Protocol

from ._config import ConfigError
from ._consumer import Consumer as ConsumerCore
from ._consumer import ConsumerConfig
from ._core import ClientCore
from ._errors import LocalProtocolError, NSQError
from ._events import (
    ConnectionClosed,
    ErrorReceived,
    Event,
    LookupFailed,
    LookupSucceeded,
    MessageGivenUp,
    MessageReceived,
    PublishFailed,
    PublishSucceeded,
    StartFromFailed,
    Stopped,
)
from ._features import TraceReceipt
from ._message import Message as CoreMessage
from ._outputs import Close, Connect, HttpRequest, Send, StartTLS
from ._producer import Producer as ProducerCore
from ._producer import ProducerConfig
from ._version import __version__

__all__ = [
    "Backend",
    "Stream",
    "Driver",
    "AsyncMessage",
    "AsyncConsumer",
    "AsyncProducer",
    "TransportError",
]

log = logging.getLogger("nsq")

#: answers given by an application task without waiting are sent together; every this many
#: messages taken without waiting, the consumer yields to the loop once anyway
_CHECKPOINT_EVERY = 256
#: how many recent errors a consumer keeps for inspection
_KEEP_ERRORS = 100


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


# ---------------------------------------------------------------------------------------------
# what a backend provides


class Stream(Protocol):
    async def send(self, data: bytes) -> None: ...
    async def receive(self) -> bytes: ...  # b"" at EOF
    async def aclose(self) -> None: ...


class EventLike(Protocol):
    def set(self) -> None: ...
    def is_set(self) -> bool: ...
    async def wait(self) -> Any: ...


class ScopeLike(Protocol):
    def cancel(self) -> None: ...
    def __enter__(self) -> Any: ...
    def __exit__(self, *exc: object) -> bool | None: ...


class TaskGroupLike(Protocol):
    def start_soon(self, func: Callable[..., Awaitable[Any]], *args: Any) -> None: ...

    @property
    def cancel_scope(self) -> Any: ...


class Backend(Protocol):
    """The I/O and concurrency primitives of one event-loop library."""

    #: exceptions that mean "this transport failed"
    io_errors: tuple[type[BaseException], ...]
    #: TLS failures (anywhere in an exception's chain of causes) ...
    tls_errors: tuple[type[BaseException], ...]
    #: ... except these, which are the network's fault, not the handshake's
    transient_tls_errors: tuple[type[BaseException], ...]

    def current_time(self) -> float: ...
    def clock(self) -> Callable[[], float]:
        """A cheap callable reading the running loop's clock (called inside the loop)."""
        ...

    # the three factories below return the library's own objects, which have the shapes of
    # EventLike, ScopeLike and an async context manager of a TaskGroupLike
    def event(self) -> Any: ...
    def cancel_scope(self, *, deadline: float = math.inf, shield: bool = False) -> Any: ...
    def task_group(self) -> Any: ...
    def cancelled_exc_class(self) -> type[BaseException]: ...
    async def checkpoint(self) -> None: ...
    async def connect_tcp(self, host: str, port: int) -> Stream: ...
    async def start_tls(self, stream: Stream, ssl_context: Any, hostname: str | None) -> Stream: ...
    def default_ssl_context(self) -> Any: ...
    def ssl_check_hostname(self, ssl_context: Any) -> bool: ...
    def is_ssl_context(self, value: object) -> bool: ...
    def hostname(self) -> str: ...


# ---------------------------------------------------------------------------------------------
# the pump


@dataclass(eq=False)
class _Link:
    conn_id: int
    host: str
    port: int
    stream: Stream | None = None
    read_scope: ScopeLike | None = None
    upgrade: bool = False
    closed: bool = False
    pending: list[bytes] = field(default_factory=list)
    #: set while a write is under way (one writer at a time; others queue in ``pending``)
    sending: EventLike | None = None
    #: TLS is up and nothing was read since
    tls_fresh: bool = False


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
    ) -> None:
        self.backend = backend
        self.core = core
        self._on_event = on_event
        self._ssl_context = ssl_context
        self._tls_hostname = tls_hostname
        self._links: dict[int, _Link] = {}
        self._failures: tuple[type[BaseException], ...] = (TimeoutError, *backend.io_errors)
        self._wake: EventLike = backend.event()
        self._tg: TaskGroupLike | None = None

    def wake(self) -> None:
        self._wake.set()

    async def run(self, task_group: TaskGroupLike) -> None:
        """The pump loop; runs until cancelled."""
        self._tg = task_group
        backend = self.backend
        core = self.core
        while True:
            self._wake = backend.event()
            core.handle_timer(backend.current_time())  # an early call does nothing
            await self._drain()
            if self._wake.is_set():
                continue
            deadline = core.next_deadline()
            with backend.cancel_scope(deadline=math.inf if deadline is None else deadline):
                await self._wake.wait()

    async def flush(self) -> None:
        """Carry out every pending output now (when the pump task may be cancelled)."""
        await self._drain()

    async def aclose(self) -> None:
        """Close every transport still open."""
        for link in list(self._links.values()):
            self._links.pop(link.conn_id, None)
            await self._shut(link)

    async def _drain(self) -> None:
        core = self.core
        on_event = self._on_event
        while (out := core.next_output()) is not None:
            if isinstance(out, Event):
                on_event(out)
            elif type(out) is Send:
                await self._send(out.conn_id, out.data)
            elif isinstance(out, Connect):
                link = _Link(out.conn_id, out.host, out.port)
                self._links[out.conn_id] = link
                assert self._tg is not None
                self._tg.start_soon(self._connection, link, out.port, out.timeout)
            elif isinstance(out, StartTLS):
                self._start_tls(out)
            elif isinstance(out, Close):
                closing = self._links.pop(out.conn_id, None)
                if closing is not None:
                    await self._shut(closing)
            elif isinstance(out, HttpRequest):
                assert self._tg is not None
                self._tg.start_soon(self._http, out)

    async def _send(self, conn_id: int, data: bytes) -> None:
        link = self._links.get(conn_id)
        if link is None or link.closed:
            return
        if link.stream is None or link.upgrade or link.sending is not None:
            link.pending.append(data)  # written once connected, TLS is up, or by the writer
            return
        backend = self.backend
        link.sending = done = backend.event()
        try:
            while True:
                # once taken from the core, bytes must reach the socket even if this task is
                # being cancelled (they may be the FIN/REQ of a stop); bounded, not forever
                with backend.cancel_scope(deadline=backend.current_time() + 10.0, shield=True):
                    await link.stream.send(data)
                if not link.pending or link.upgrade:
                    break
                data = b"".join(link.pending)
                link.pending.clear()
        except backend.io_errors as exc:
            link.sending = None
            done.set()
            await self._lost(link, exc)
            return
        link.sending = None
        done.set()

    async def _shut(self, link: _Link) -> None:
        backend = self.backend
        if link.sending is not None and not link.closed:
            # let the write under way (and what queued behind it) finish first
            with backend.cancel_scope(deadline=backend.current_time() + 10.0, shield=True):
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
        if link.read_scope is not None:
            link.read_scope.cancel()

    async def _connection(self, link: _Link, port: int, timeout: float) -> None:
        backend = self.backend
        try:
            with backend.cancel_scope(deadline=backend.current_time() + timeout) as scope:
                link.stream = await backend.connect_tcp(link.host, port)
            if link.stream is None or getattr(scope, "cancelled_caught", False):
                raise TimeoutError(f"connecting to {link.host}:{port} timed out")
        except self._failures as exc:
            error = TransportError(f"connecting to {link.host}:{port} failed: {exc}")
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
                    await self._lost(link, refused or exc)
                    return
                link.read_scope = None
            if data is None:
                continue  # the read was cancelled: an upgrade or a close
            if not data:
                await self._lost(link, None)
                return
            link.tls_fresh = False
            core.receive_data(link.conn_id, data, backend.current_time())
            self.wake()

    async def _upgrade(self, link: _Link) -> bool:
        backend = self.backend
        assert link.stream is not None
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


# ---------------------------------------------------------------------------------------------
# the application-facing objects


class _Inbox:
    """Messages waiting for the application (RDY bounds how many).

    Any number of tasks may wait in :meth:`get` at once (``run(concurrency=N)`` has N
    workers): each waits on its own event, ``put`` wakes one of them per message and
    ``close`` wakes them all.
    """

    def __init__(self, backend: Backend) -> None:
        self._backend = backend
        self._items: deque[AsyncMessage] = deque()
        self._waiters: deque[EventLike] = deque()
        self.closed = False
        self._taken = 0

    def put(self, item: AsyncMessage) -> None:
        self._items.append(item)
        if self._waiters:
            self._waiters.popleft().set()

    def close(self) -> None:
        self.closed = True
        while self._waiters:
            self._waiters.popleft().set()

    def drain(self) -> list[AsyncMessage]:
        items = list(self._items)
        self._items.clear()
        return items

    async def get(self) -> AsyncMessage | None:
        """The next message, or None once closed and empty."""
        self._taken += 1
        if self._items and self._taken % _CHECKPOINT_EVERY:
            # no checkpoint: answers given meanwhile go out together when this task waits
            return self._items.popleft()
        await self._backend.checkpoint()
        while not self._items:
            if self.closed:
                return None
            event = self._backend.event()
            self._waiters.append(event)
            try:
                await event.wait()
            except BaseException:
                if event.is_set():
                    # woken for a message, then cancelled: hand the wake-up on
                    if self._items and self._waiters:
                        self._waiters.popleft().set()
                else:
                    with suppress(ValueError):
                        self._waiters.remove(event)
                raise
        return self._items.popleft()

    async def get_many(self, limit: int) -> list[AsyncMessage]:
        """Wait for the next message, then take up to ``limit`` of those waiting (an empty
        list once closed and empty)."""
        first = await self.get()
        if first is None:
            return []
        items = self._items
        if len(items) < limit:
            out = [first, *items]
            items.clear()
            return out
        out = [first]
        popleft = items.popleft
        for _ in range(limit - 1):
            out.append(popleft())
        return out


class AsyncMessage:
    """A delivered message with its answers.  Answer each message once: ``finish`` or
    ``requeue`` (``touch`` buys time first)."""

    __slots__ = ("_consumer", "_message", "_responded", "conn_id", "nsqd_address", "partition")

    def __init__(
        self,
        consumer: AsyncConsumer,
        conn_id: int,
        message: CoreMessage,
        nsqd_address: str,
        partition: int | None,
    ) -> None:
        self._consumer = consumer
        self._message = message
        self.conn_id = conn_id
        self.nsqd_address = nsqd_address
        self.partition = partition
        self._responded = False

    @property
    def id(self) -> bytes:
        return self._message.id

    @property
    def body(self) -> bytes:
        return self._message.body

    @property
    def attempts(self) -> int:
        return self._message.attempts

    @property
    def timestamp(self) -> int:
        """Nanoseconds since the epoch, when nsqd received the message."""
        return self._message.timestamp

    @property
    def trace_id(self) -> int | None:
        """The trace id (partitioned server), else None."""
        return self._message.trace_id

    @property
    def ext(self) -> dict[str, Any] | None:
        """The JSON extension header (partitioned server, extended topics), else None."""
        message = self._message
        if message.ext_version != 4 or not message.ext_data:
            return None
        try:
            value = json.loads(message.ext_data)
        except ValueError:
            return None
        return value if isinstance(value, dict) else None

    @property
    def raw(self) -> CoreMessage:
        return self._message

    @property
    def has_responded(self) -> bool:
        return self._responded

    def _mark(self) -> None:
        if self._responded:
            raise LocalProtocolError("this message has already been answered")
        self._responded = True

    async def finish(self) -> None:
        self._mark()
        self._consumer._finish(self)

    async def requeue(self, delay: float | None = None, backoff: bool = True) -> None:
        """REQ; ``delay`` None grows with attempts; ``backoff`` counts it as a failure."""
        self._mark()
        self._consumer._requeue(self, delay, backoff)

    async def touch(self) -> None:
        if self._responded:
            raise LocalProtocolError("this message has already been answered")
        self._consumer._touch(self)

    def __repr__(self) -> str:
        return f"<Message id={self.id!r} attempts={self.attempts} body={self.body[:40]!r}>"


Handler = Callable[[AsyncMessage], Awaitable[object]]
GiveUpHook = Callable[[AsyncMessage], object]


def _tls(backend: Backend, tls: object) -> tuple[bool, Any]:
    if tls is None or tls is False:
        return False, None
    if tls is True:
        return True, backend.default_ssl_context()
    if backend.is_ssl_context(tls):
        return True, tls
    raise ConfigError("tls must be an ssl.SSLContext, True or None")


def _options(backend: Backend, options: dict[str, Any], agent: str) -> dict[str, Any]:
    hostname = backend.hostname()
    options.setdefault("client_id", hostname.split(".")[0])
    options.setdefault("hostname", hostname)
    options.setdefault("user_agent", f"{agent}/{__version__}")
    if isinstance(options.get("auth_secret"), str):
        options["auth_secret"] = options["auth_secret"].encode()
    return options


class _Client:
    """``async with`` plumbing shared by the consumer and the producer."""

    _driver: Driver

    def __init__(self, backend: Backend) -> None:
        self._backend = backend
        self._clock: Callable[[], float] = backend.current_time
        self._tg_cm: AbstractAsyncContextManager[TaskGroupLike] | None = None
        self._tg: TaskGroupLike | None = None

    async def _enter(self) -> None:
        self._clock = self._backend.clock()
        self._tg_cm = self._backend.task_group()
        self._tg = await self._tg_cm.__aenter__()
        self._tg.start_soon(self._driver.run, self._tg)

    async def _exit(self, exc_info: tuple[Any, Any, Any]) -> bool | None:
        assert self._tg is not None and self._tg_cm is not None
        self._tg.cancel_scope.cancel()
        error = exc_info[1]
        if error is None or isinstance(error, self._backend.cancelled_exc_class()):
            return await self._tg_cm.__aexit__(*exc_info)
        # the body failed: close our tasks, then let its exception through as it is (not
        # wrapped in an exception group by our internal task group)
        await self._tg_cm.__aexit__(None, None, None)
        return False


class AsyncConsumer(_Client):
    """Consume ``topic``/``channel`` from nsqd (a fixed list) or from what lookupd lists.

    Every option of :class:`nsq_proto.ConsumerConfig` is a keyword argument of the same name.
    ``tls`` takes an ``ssl.SSLContext`` (or True for the default, verifying context).
    Leaving the ``async with`` block stops gracefully: CLS, then wait (up to
    ``stop_timeout``) for the messages the application holds to be answered; the rest is
    requeued.  Cancelled, it requeues what the application holds at once.
    """

    def __init__(
        self,
        backend: Backend,
        topic: str,
        channel: str,
        *,
        nsqd_tcp_addresses: Iterable[str] = (),
        lookupd_http_addresses: Iterable[str] = (),
        tls: object = None,
        tls_hostname: str | None = None,
        on_give_up: GiveUpHook | None = None,
        rng: random.Random | None = None,
        agent: str = "nsq",
        **options: Any,
    ) -> None:
        super().__init__(backend)
        use_tls, context = _tls(backend, tls)
        self.config = ConsumerConfig(tls_v1=use_tls, **_options(backend, options, agent))
        self._core = ConsumerCore(
            topic,
            channel,
            self.config,
            nsqd_tcp_addresses=nsqd_tcp_addresses,
            lookupd_http_addresses=lookupd_http_addresses,
            rng=rng,
        )
        self.topic = topic
        self.channel = channel
        self._driver = Driver(
            backend, self._core, self._on_event, ssl_context=context, tls_hostname=tls_hostname
        )
        self._on_give_up = on_give_up
        self._inbox = _Inbox(backend)
        self._closing = False
        self._stopped = backend.event()
        self._conn_info: dict[int, tuple[str, int | None]] = {}
        #: the latest error frames, lookupd failures and connection failures (bounded)
        self.errors: deque[ErrorReceived] = deque(maxlen=_KEEP_ERRORS)
        self.lookup_failures: deque[LookupFailed] = deque(maxlen=_KEEP_ERRORS)
        self.connection_errors: deque[BaseException] = deque(maxlen=_KEEP_ERRORS)
        #: the latest answer of a lookupd (None before the first)
        self.last_lookup: LookupSucceeded | None = None

    async def __aenter__(self) -> Any:
        await self._enter()
        self._core.start(self._backend.current_time())
        self._driver.wake()
        return self

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        cancelled = isinstance(exc_info[1], self._backend.cancelled_exc_class())
        # the block is over: nothing takes messages from the inbox any more, so those still
        # on their way (sent by nsqd before it read our CLS) go back at once
        self._closing = True
        await self._stop(requeue_unanswered=cancelled)
        with self._backend.cancel_scope(shield=True):
            await self._driver.aclose()
        return await self._exit(exc_info)

    async def _stop(self, *, requeue_unanswered: bool = False) -> None:
        backend = self._backend
        with backend.cancel_scope(shield=True):
            now = backend.current_time()
            self._core.stop(now, requeue_unanswered=requeue_unanswered)
            # messages delivered but never handed to the application go back at once
            for message in self._inbox.drain():
                message._responded = True
                # a message that timed out and came back is in the inbox twice: only the
                # newest copy's REQ is sent
                with suppress(LocalProtocolError):
                    self._core.requeue(
                        message.conn_id,
                        message.id,
                        now,
                        delay=0.0,
                        backoff=False,
                        attempts=message.attempts,
                    )
            if requeue_unanswered:
                # the pump task is cancelled with us: carry out the requeues and closes here
                with backend.cancel_scope(deadline=now + 5.0, shield=True):
                    await self._driver.flush()
                self._inbox.close()
                return
            self._driver.wake()
            with backend.cancel_scope(deadline=now + self.config.stop_timeout + 5.0):
                await self._stopped.wait()
            self._inbox.close()

    async def stop(self) -> None:
        """Stop gracefully now (leaving the ``async with`` block does the same)."""
        await self._stop()

    def _on_event(self, event: Event) -> None:
        if type(event) is MessageReceived:
            if self._closing:
                late = event.message
                with suppress(LocalProtocolError):
                    self._core.requeue(
                        event.conn_id,
                        late.id,
                        self._backend.current_time(),
                        delay=0.0,
                        backoff=False,
                        attempts=late.attempts,
                    )
                return
            self._inbox.put(self._wrap(event.conn_id, event.message))
        elif isinstance(event, MessageGivenUp):
            message = self._wrap(event.conn_id, event.message)
            message._responded = event.finished
            log.warning("giving up on message %r after %d attempts", message.id, message.attempts)
            if self._on_give_up is not None:
                self._on_give_up(message)
        elif isinstance(event, ErrorReceived):
            self.errors.append(event)
            log.warning("nsqd error on connection %d: %s %s", event.conn_id, event.code, event.text)
        elif isinstance(event, LookupSucceeded):
            self.last_lookup = event
        elif isinstance(event, LookupFailed):
            self.lookup_failures.append(event)
            log.warning("lookupd %s:%d failed: %s", *event.address, event.error)
        elif isinstance(event, StartFromFailed):
            self.connection_errors.append(event.error)
            log.warning(
                "start_from of partition %d not set on %s:%d: %s",
                event.partition,
                *event.address,
                event.error,
            )
        elif isinstance(event, ConnectionClosed):
            self._conn_info.pop(event.conn_id, None)
            if event.error is not None:
                self.connection_errors.append(event.error)
                cause = event.error.__cause__
                log.warning(
                    "connection %d closed: %s%s",
                    event.conn_id,
                    event.error,
                    "" if cause is None or str(cause) in str(event.error) else f" ({cause})",
                )
        elif isinstance(event, Stopped):
            self._stopped.set()
            self._inbox.close()

    def _wrap(self, conn_id: int, message: CoreMessage) -> AsyncMessage:
        info = self._conn_info.get(conn_id)
        if info is None:
            stats = self._core.connection_stats(conn_id)
            if stats is None:
                info = ("", None)
            else:
                info = (f"{stats.address[0]}:{stats.address[1]}", stats.partition)
            self._conn_info[conn_id] = info
        return AsyncMessage(self, conn_id, message, info[0], info[1])

    def _finish(self, message: AsyncMessage) -> None:
        self._core.finish(message.conn_id, message.id, self._clock(), attempts=message.attempts)
        self._driver.wake()

    def _requeue(self, message: AsyncMessage, delay: float | None, backoff: bool) -> None:
        self._core.requeue(
            message.conn_id,
            message.id,
            self._clock(),
            delay=delay,
            backoff=backoff,
            attempts=message.attempts,
        )
        self._driver.wake()

    def _touch(self, message: AsyncMessage) -> None:
        self._core.touch(message.conn_id, message.id, self._clock(), attempts=message.attempts)
        self._driver.wake()

    def __aiter__(self) -> AsyncIterator[Any]:
        return self

    async def __anext__(self) -> Any:
        message = await self._inbox.get()
        if message is None:
            raise StopAsyncIteration
        return message

    async def get_many(self, max_messages: int) -> list[AsyncMessage]:
        """Wait for a message, then take it and the others already delivered, up to
        ``max_messages`` in all; an empty list once the consumer has stopped.

        For applications that handle messages in batches (one database write for many):
        each message is still answered on its own, and RDY bounds how many can wait."""
        if max_messages < 1:
            raise ConfigError("max_messages must be at least 1")
        return await self._inbox.get_many(max_messages)

    async def finish_many(self, messages: Iterable[AsyncMessage]) -> None:
        """FIN every message of ``messages`` (as ``await message.finish()`` on each), with
        one write per connection: for applications that answer a whole batch at once.

        A message already answered, or given twice, or delivered by another consumer, is a
        :class:`LocalProtocolError` raised before any FIN is sent."""
        batch = list(messages)
        marked: list[AsyncMessage] = []
        try:
            for message in batch:
                if message._consumer is not self:
                    raise LocalProtocolError(f"{message!r} was delivered by another consumer")
                message._mark()
                marked.append(message)
        except LocalProtocolError:
            for message in marked:
                message._responded = False
            raise
        self._core.finish_many([(m.conn_id, m.id, m.attempts) for m in batch], self._clock())
        self._driver.wake()

    async def touch_many(self, messages: Iterable[AsyncMessage]) -> None:
        """TOUCH every message of ``messages`` (as ``await message.touch()`` on each), with
        one write per connection: for applications that hold many messages at once.

        A message already answered, or delivered by another consumer, is a
        :class:`LocalProtocolError` raised before any TOUCH is sent."""
        batch = list(messages)
        for message in batch:
            if message._consumer is not self:
                raise LocalProtocolError(f"{message!r} was delivered by another consumer")
            if message._responded:
                raise LocalProtocolError(f"{message!r} has already been answered")
        self._core.touch_many([(m.conn_id, m.id, m.attempts) for m in batch], self._clock())
        self._driver.wake()

    async def run(self, handler: Handler, concurrency: int | None = None) -> None:
        """Handler style: returning FINishes, raising REQueues with backoff; at most
        ``concurrency`` handlers run at once (default: max_in_flight).  Returns when the
        consumer stops."""
        n = concurrency if concurrency is not None else max(1, self.config.max_in_flight)
        if n < 1:
            raise ConfigError("concurrency must be at least 1")
        async with self._backend.task_group() as tg:
            for _ in range(n):
                tg.start_soon(self._worker, handler)

    async def _worker(self, handler: Handler) -> None:
        inbox = self._inbox
        while (message := await inbox.get()) is not None:
            try:
                await handler(message)
            except self._backend.cancelled_exc_class():
                # run() was cancelled mid-handler: the message goes back at once, so that a
                # stop does not wait stop_timeout for an answer that cannot come
                if not message.has_responded:
                    message._responded = True
                    with suppress(NSQError):
                        self._requeue(message, 0.0, False)
                raise
            except Exception:
                log.exception("handler failed for message %r", message.id)
                if not message.has_responded:
                    await message.requeue()
            else:
                if not message.has_responded:
                    await message.finish()

    def is_starved(self) -> bool:
        return self._core.is_starved()

    def set_max_in_flight(self, max_in_flight: int) -> None:
        self._core.set_max_in_flight(max_in_flight, self._backend.current_time())
        self._driver.wake()

    def stats(self) -> dict[str, Any]:
        core = self._core
        return {
            "topic": self.topic,
            "channel": self.channel,
            "max_in_flight": core.max_in_flight,
            "total_rdy": core.total_rdy,
            "backoff_level": core.backoff_level,
            "starved": core.is_starved(),
            "messages_received": core.messages_received,
            "messages_finished": core.messages_finished,
            "messages_requeued": core.messages_requeued,
            "messages_given_up": core.messages_given_up,
            "last_error": str(self.connection_errors[-1]) if self.connection_errors else None,
            "connections": [
                {
                    "conn_id": s.conn_id,
                    "address": s.key,
                    "state": s.state,
                    "rdy": s.rdy,
                    "in_flight": s.in_flight,
                    "partition": s.partition,
                    # the RDY nsqd allows on it (IDENTIFY's max_rdy_count; None before it)
                    "max_rdy_count": _max_rdy_count(core, s.conn_id),
                }
                for s in core.connections()
            ],
        }


def _max_rdy_count(core: ConsumerCore, conn_id: int) -> int | None:
    conn = core.connection(conn_id)
    features = None if conn is None else conn.features
    return None if features is None else features.max_rdy_count


class _Waiter:
    __slots__ = ("done", "error", "receipt")

    def __init__(self, done: EventLike) -> None:
        self.done = done
        self.receipt: TraceReceipt | None = None
        self.error: NSQError | None = None


class AsyncProducer(_Client):
    """Publish to nsqd over a pool of pipelined connections.

    Every option of :class:`nsq_proto.ProducerConfig` is a keyword argument of the same name.
    Give ``nsqd_tcp_addresses`` (failover across them), and ``lookupd_http_addresses`` for
    topics of the partitioned server.  Failures raise :class:`nsq_proto.NSQError`
    subclasses: ``ServerError`` (nsqd refused it), ``ConnectionClosedError``,
    ``PublishTimeout``, ``LocalProtocolError`` (bad arguments).
    """

    def __init__(
        self,
        backend: Backend,
        *,
        nsqd_tcp_addresses: Iterable[str] = (),
        lookupd_http_addresses: Iterable[str] = (),
        tls: object = None,
        tls_hostname: str | None = None,
        rng: random.Random | None = None,
        agent: str = "nsq",
        **options: Any,
    ) -> None:
        super().__init__(backend)
        use_tls, context = _tls(backend, tls)
        self.config = ProducerConfig(tls_v1=use_tls, **_options(backend, options, agent))
        self._core = ProducerCore(
            self.config,
            nsqd_tcp_addresses=nsqd_tcp_addresses,
            lookupd_http_addresses=lookupd_http_addresses,
            rng=rng,
        )
        self._driver = Driver(
            backend, self._core, self._on_event, ssl_context=context, tls_hostname=tls_hostname
        )
        self._waiters: dict[int, _Waiter] = {}
        self._closed = False

    async def __aenter__(self) -> Any:
        await self._enter()
        self._core.start(self._backend.current_time())
        self._driver.wake()
        return self

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        await self.aclose()
        return await self._exit(exc_info)

    async def aclose(self) -> None:
        """Wait (shielded, up to ``publish_timeout``) for what is in flight, then close."""
        if self._closed:
            return
        self._closed = True
        backend = self._backend
        with backend.cancel_scope(shield=True):
            now = backend.current_time()
            with backend.cancel_scope(deadline=now + self.config.publish_timeout):
                while self._waiters:
                    await next(iter(self._waiters.values())).done.wait()
            self._core.close(backend.current_time())
            with backend.cancel_scope(deadline=backend.current_time() + 5.0):
                await self._driver.flush()
            await self._driver.aclose()

    def _on_event(self, event: Event) -> None:
        if type(event) is PublishSucceeded:
            waiter = self._waiters.pop(event.request_id, None)
            if waiter is not None:
                waiter.receipt = event.receipt
                waiter.done.set()
        elif type(event) is PublishFailed:
            waiter = self._waiters.pop(event.request_id, None)
            if waiter is not None:
                waiter.error = event.error
                waiter.done.set()

    async def _wait(self, request_id: int) -> TraceReceipt | None:
        waiter = _Waiter(self._backend.event())
        self._waiters[request_id] = waiter
        self._driver.wake()
        try:
            await waiter.done.wait()
        finally:
            self._waiters.pop(request_id, None)
        if waiter.error is not None:
            raise waiter.error
        return waiter.receipt

    def _check_open(self) -> None:
        if self._closed or self._tg is None:
            raise LocalProtocolError("use the producer inside 'async with'")

    async def publish(
        self,
        topic: str,
        body: bytes,
        *,
        delay: float | None = None,
        partition: int | None = None,
        sharding_key: bytes | str | None = None,
        trace_id: int | None = None,
        ext: Mapping[str, Any] | None = None,
    ) -> TraceReceipt | None:
        """PUB (DPUB with ``delay`` seconds; PUB_TRACE with ``trace_id``, which returns the
        trace receipt).  Returns once nsqd acknowledged it."""
        self._check_open()
        rid = self._core.publish(
            topic,
            body,
            self._clock(),
            delay=delay,
            partition=partition,
            sharding_key=sharding_key,
            trace_id=trace_id,
            ext=ext,
        )
        return await self._wait(rid)

    async def publish_many(
        self,
        topic: str,
        bodies: Iterable[bytes],
        *,
        partition: int | None = None,
        sharding_key: bytes | str | None = None,
        trace_ids: Iterable[int] | None = None,
        ext: Mapping[str, Any] | None = None,
    ) -> TraceReceipt | None:
        """MPUB (MPUB_TRACE with ``trace_ids``): all or nothing, once nsqd acknowledged it."""
        self._check_open()
        rid = self._core.publish_many(
            topic,
            bodies,
            self._clock(),
            partition=partition,
            sharding_key=sharding_key,
            trace_ids=trace_ids,
            ext=ext,
        )
        return await self._wait(rid)

    def stats(self) -> dict[str, Any]:
        return {
            "pending": self._core.pending,
            "connections": [
                {"conn_id": c, "address": f"{a[0]}:{a[1]}", "state": s, "outstanding": n}
                for c, a, s, n in self._core.connections()
            ],
        }
