"""What an event-loop library provides to the client: the :class:`Backend` protocol.

A backend is the only place the client meets an event loop: TCP streams, TLS, events, cancel
scopes with deadlines, task groups and the loop's clock.  ``nsq_anyio`` and ``nsq_trio`` are
two backends; bring your own to run the full client on another loop or transport (see the
"custom transports" page of the documentation).  :class:`BackendBase` holds what every
backend on the standard ``ssl`` module shares.
"""

from __future__ import annotations

import math
import socket
import ssl
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import Any, Protocol, Self, runtime_checkable

__all__ = [
    "Backend",
    "BackendBase",
    "EventFactory",
    "EventLike",
    "ScopeFactory",
    "ScopeLike",
    "ScopeMaker",
    "Stream",
    "AbortStream",
    "NowaitStream",
    "PushStream",
    "TaskGroupContext",
    "TaskGroupLike",
]


class Stream(Protocol):
    """One byte stream (TCP, or TLS over TCP)."""

    async def send(self, data: bytes) -> None:
        """Write all of ``data``."""
        ...

    async def receive(self) -> bytes:
        """The next bytes that arrived; ``b""`` at the end of the stream."""
        ...

    async def aclose(self) -> None:
        """Close the stream (a TLS stream closes its socket at once, without waiting for
        the peer's close_notify)."""
        ...


class AbortStream(Stream, Protocol):
    """A stream that can also be closed at once, whatever the peer does.

    The client aborts a connection judged dead (nothing received within the read timeout,
    the handshake or a write not done in time) rather than closing it: a close could wait
    on the peer (for buffered bytes to drain, a TLS close_notify to go out) and keep the
    socket open meanwhile."""

    async def abort(self) -> None:
        """Close now: drop what was not sent and reset the connection (``SO_LINGER`` 0);
        a write waiting on the peer fails."""
        ...


class NowaitStream(Stream, Protocol):
    """A stream that can also take bytes without waiting (a transport with a buffer).

    The pump uses :meth:`send_nowait` where it has it: the write timeout then costs nothing
    on writes that cannot block."""

    def send_nowait(self, data: bytes) -> bool:
        """Write all of ``data`` now and return True if the stream can take it without
        waiting; else write nothing and return False (:meth:`send` then waits)."""
        ...


class PushStream(Stream, Protocol):
    """A stream that can hand over what arrives from the loop's own callback (an asyncio
    protocol's ``data_received``) instead of waking a reading task.

    The pump reads such a stream this way: the bytes reach the core, and its answers the
    socket, in the callback that received them, one task switch sooner than a reading task
    would (the latency of every round trip)."""

    def start_pushing(
        self,
        on_data: Callable[[bytes], None],
        on_end: Callable[[BaseException | None], None],
    ) -> None:
        """From now on call ``on_data`` with the bytes as they arrive (at once with those that
        arrived and were not read), and ``on_end`` once at the end of the stream: with None
        at its clean end, with the error when it failed.  Neither is called once
        :meth:`stop_pushing` returned."""
        ...

    def stop_pushing(self) -> None:
        """Keep what arrives from now on for :meth:`Stream.receive` (or the next
        :meth:`start_pushing`)."""
        ...


class EventLike(Protocol):
    """A one-shot event (``anyio.Event``, ``trio.Event``, ``asyncio.Event``)."""

    def set(self) -> None:
        """Set it: every task waiting in :meth:`wait` wakes (setting it again does nothing)."""
        ...

    def is_set(self) -> bool:
        """Whether it was set."""
        ...

    async def wait(self) -> object:
        """Return once it is set (at once if it is)."""
        ...


class ScopeLike(Protocol):
    """A cancel scope: a ``with`` block that can be cancelled, at a deadline or by
    :meth:`cancel` (``anyio.CancelScope``, ``trio.CancelScope``).  ``cancelled_caught`` (read
    with ``getattr``) tells whether it ended the block."""

    def cancel(self) -> None:
        """End the block now: what it awaits is cancelled (and the block ends quietly)."""
        ...

    def __enter__(self) -> Self: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
        /,
    ) -> bool | None: ...


class TaskGroupLike(Protocol):
    """A running task group (``anyio.abc.TaskGroup``, a trio nursery)."""

    def start_soon(self, func: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> object:
        """Run ``func(*args)`` in a new task of the group (called from a task, or from a
        callback of the loop)."""
        ...

    @property
    def cancel_scope(self) -> ScopeLike:
        """The scope around the group's tasks: cancelling it cancels them all."""
        ...


class TaskGroupContext(Protocol):
    """What :meth:`Backend.task_group` returns: ``async with`` it to run a task group."""

    async def __aenter__(self) -> TaskGroupLike:
        """The running group (leaving the block waits for its tasks)."""
        ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
        /,
    ) -> bool | None: ...


class Backend(Protocol):
    """The I/O and concurrency primitives of one event-loop library."""

    #: exceptions that mean "this transport failed"
    io_errors: tuple[type[BaseException], ...]
    #: TLS failures (anywhere in an exception's chain of causes) ...
    tls_errors: tuple[type[BaseException], ...]
    #: ... except these, which are the network's fault, not the handshake's
    transient_tls_errors: tuple[type[BaseException], ...]

    def current_time(self) -> float:
        """The loop's clock, in seconds (deadlines are on it)."""
        ...

    def clock(self) -> Callable[[], float]:
        """A cheap callable reading the running loop's clock (called inside the loop)."""
        ...

    def event(self) -> EventLike:
        """A new one-shot event of the loop."""
        ...

    def cancel_scope(self, *, deadline: float = math.inf, shield: bool = False) -> ScopeLike:
        """A cancel scope that ends its block at ``deadline`` (on :meth:`current_time`'s
        clock; ``inf``: never by itself); ``shield`` keeps cancellations from outside out."""
        ...

    def task_group(self) -> TaskGroupContext:
        """A new task group (it waits for its tasks when its block ends)."""
        ...

    def cancelled_exc_class(self) -> type[BaseException]:
        """The exception a cancelled task sees (``asyncio.CancelledError``,
        ``trio.Cancelled``)."""
        ...

    async def checkpoint(self) -> None:
        """Let other tasks run (and deliver a pending cancellation)."""
        ...

    async def connect_tcp(self, host: str, port: int) -> Stream:
        """A TCP connection to ``host:port``; fails with one of :attr:`io_errors` (the
        caller bounds it with a cancel scope)."""
        ...

    async def start_tls(self, stream: Stream, ssl_context: Any, hostname: str | None) -> Stream:
        """The TLS client handshake over ``stream``; ``hostname`` None skips the name check."""
        ...

    def default_ssl_context(self) -> Any:
        """The context of ``tls=True``: verifying, the system's trust store."""
        ...

    def ssl_check_hostname(self, ssl_context: Any) -> bool:
        """Whether ``ssl_context`` checks the server's name (then it is given one)."""
        ...

    def is_ssl_context(self, value: object) -> bool:
        """Whether ``value`` is an SSL context of the library :meth:`start_tls` takes."""
        ...

    def hostname(self) -> str:
        """This machine's name (IDENTIFY's defaults ``client_id`` and ``hostname``)."""
        ...


@runtime_checkable
class EventFactory(Protocol):
    """A backend that can say once, inside the running loop, how to make its events cheaply
    (an optional part of :class:`Backend`, as :meth:`Backend.clock` is for the clock): the
    client then makes one per publish and per wait without looking the loop up each time."""

    def event_factory(self) -> Callable[[], EventLike]:
        """A cheap callable making one-shot events of the running loop (called inside it)."""
        ...


def event_factory(backend: Backend) -> Callable[[], EventLike]:
    """What makes the running loop's events: the backend's :meth:`EventFactory.event_factory`
    where it has one, else its :meth:`Backend.event` (call it inside the loop)."""
    if isinstance(backend, EventFactory):
        return backend.event_factory()
    return backend.event


#: what :class:`ScopeFactory` gives: makes a cancel scope as :meth:`Backend.cancel_scope` does
ScopeMaker = Callable[..., ScopeLike]


@runtime_checkable
class ScopeFactory(Protocol):
    """A backend that can say once, inside the running loop, how to make its cancel scopes
    cheaply (an optional part of :class:`Backend`, as :class:`EventFactory` is for events):
    the client makes one for each read, each write that waits and each pass of its pump."""

    def scope_factory(self) -> ScopeMaker:
        """A cheap callable taking :meth:`Backend.cancel_scope`'s keywords (``deadline``,
        ``shield``) and making a cancel scope of the running loop (called inside it)."""
        ...


def scope_factory(backend: Backend) -> ScopeMaker:
    """What makes the running loop's cancel scopes: the backend's
    :meth:`ScopeFactory.scope_factory` where it has one, else its :meth:`Backend.cancel_scope`
    (call it inside the loop)."""
    if isinstance(backend, ScopeFactory):
        return backend.scope_factory()
    return backend.cancel_scope


class BackendBase:
    """What backends on the standard ``ssl`` module share: a subclass adds the loop's
    primitives and streams, and extends ``io_errors`` with its library's own."""

    io_errors: tuple[type[BaseException], ...] = (OSError, ssl.SSLError)
    tls_errors: tuple[type[BaseException], ...] = (ssl.SSLError,)
    transient_tls_errors: tuple[type[BaseException], ...] = (
        ssl.SSLEOFError,
        ssl.SSLZeroReturnError,
        ssl.SSLSyscallError,
    )

    def default_ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context()

    def ssl_check_hostname(self, ssl_context: Any) -> bool:
        return bool(ssl_context.check_hostname)

    def is_ssl_context(self, value: object) -> bool:
        return isinstance(value, ssl.SSLContext)

    def hostname(self) -> str:
        return socket.gethostname()
