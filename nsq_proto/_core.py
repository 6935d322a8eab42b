"""What the consumer and producer cores share: the driver's contract (:class:`ClientCore`), the
table of their connections (:class:`ConnectionTable`) and the reconnect delays
(:class:`ReconnectScheduler`).  Each core is composed of these parts, the lookupd client of
``_lookupd_client.py`` and its own; no base class holds their state."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Hashable
from typing import Generic, Protocol, TypeVar

from ._config import parse_address
from ._connection import Connection
from ._errors import NSQError
from ._events import ConnId
from ._outputs import Output

__all__ = [
    "ClientCore",
    "ConnectionTable",
    "HasConnection",
    "ReconnectScheduler",
    "parse_address",
    "reconnect_delay",
]


class ClientCore(Protocol):
    """The interface every driver (an adapter, the in-memory network) uses on a core:
    :class:`~nsq_proto.Consumer` and :class:`~nsq_proto.Producer` implement it.

    A core does no I/O and reads no clock.  The driver feeds it what happened (transport
    events, timers; the application makes its own calls, such as ``finish`` or ``publish``)
    and carries out what it asks for, in order.  The contract, in the manner of h11's
    ``receive_data``:

    **Time.**  Every input takes ``now``: seconds on one monotonic clock of the driver's
    choosing, never going backwards from one call to the next (the event loop's clock,
    ``time.monotonic()``, or a virtual one).  Every deadline the core gives is on that clock.

    **Order of calls.**  :meth:`start` once, first.  Then, for each connection, as the
    outputs ask: a :class:`~nsq_proto.Connect` output -> :meth:`connection_made` once the TCP
    connection is up (or :meth:`connection_lost` with the error if it could not be opened);
    :meth:`receive_data` for every chunk read, in order; after a
    :class:`~nsq_proto.StartTLS` output, no more bytes until the handshake is done (feed
    ``StartTLS.buffered`` to the TLS layer first), then :meth:`tls_established`, then
    :meth:`receive_data` with the decrypted bytes; and :meth:`connection_lost` once, when
    the transport ends.  For each :class:`~nsq_proto.HttpRequest` output:
    :meth:`http_data` for every chunk of the response, then ``http_data(request_id, b"",
    now)`` at EOF; or :meth:`http_failed` if it could not be sent or read.  Calls may come
    in any interleaving across connections and requests, and from inside the application's
    event handlers.

    **End of a connection.**  EOF on a TCP connection is ``connection_lost(conn_id, now,
    None)``, not ``receive_data(conn_id, b"", now)`` (an empty chunk is not an end); a
    transport error is ``connection_lost(conn_id, now, error)``.  After the core's own
    :class:`~nsq_proto.Close` output the driver closes the transport and need not call
    :meth:`connection_lost` (a call then is ignored).  Calls naming a connection or request
    the core no longer knows (closed, timed out, answered) are ignored.

    **What the calls raise.**  Nothing a server sends makes a call raise: bytes that break
    the protocol close that one connection (a ``Close`` output and a
    :class:`~nsq_proto.ConnectionClosed` event carrying the :class:`RemoteProtocolError`),
    and a bad lookupd answer becomes a :class:`~nsq_proto.LookupFailed` event.  Driver bugs
    raise :class:`LocalProtocolError`: :meth:`start` twice; :meth:`connection_made` or
    :meth:`tls_established` for a connection not waiting for it.  Bytes fed to a connection
    that cannot take them yet (before ``connection_made``, during the TLS handshake) are
    dropped.  The application's calls raise :class:`LocalProtocolError` for misuse (e.g.
    answering a message that is not in flight).

    **Draining outputs.**  After every call (the driver's and the application's, including
    :meth:`handle_timer`) take :meth:`next_output` until it returns None and carry each out
    in queue order: an action (``Connect``, ``Send``, ``StartTLS``, ``Close``,
    ``HttpRequest``) or an event for the application.  Commands the application issues
    (FIN, REQ, RDY, ...) wait in their connection's buffer and come out as one ``Send``
    when drained, so drain before blocking; nothing is lost by draining late, but nothing
    is sent either.  A call made while draining (an event handler answering a message) adds
    to the same queue.

    **Deadlines.**  :meth:`next_deadline` is the absolute time (on the driver's clock) at
    which :meth:`handle_timer` must next be called, or None when nothing is scheduled.  Ask
    again after every call and every drain: any call may move it.  Calling
    :meth:`handle_timer` early does nothing; calling it late fires everything that is due
    by then (the connections' read and handshake timeouts first, then the core's own timers
    in deadline order: reconnects, lookupd polls, backoff, RDY redistribution, request
    timeouts), so a driver that wakes up late loses nothing."""

    def start(self, now: float) -> None:
        """Begin: connect to the configured nsqd and/or query lookupd.  Raises
        :class:`LocalProtocolError` the second time."""
        ...

    def next_output(self) -> Output | None:
        """The next action or event, in order; None when there is nothing to do."""
        ...

    def next_deadline(self) -> float | None:
        """When :meth:`handle_timer` must next be called (None: no timer is set)."""
        ...

    def handle_timer(self, now: float) -> None:
        """Fire every timer due at ``now`` (none: nothing happens)."""
        ...

    def connection_made(self, conn_id: ConnId, now: float) -> None:
        """The TCP connection a ``Connect`` asked for is up."""
        ...

    def tls_established(self, conn_id: ConnId, now: float) -> None:
        """The TLS handshake a ``StartTLS`` asked for completed."""
        ...

    def receive_data(self, conn_id: ConnId, data: bytes, now: float) -> None:
        """Bytes read from the connection (after TLS), in order; never ``b""`` for EOF."""
        ...

    def connection_lost(
        self, conn_id: ConnId, now: float, error: BaseException | None = None
    ) -> None:
        """The transport ended: ``error`` None at EOF, else why (a failed dial included)."""
        ...

    def http_data(self, request_id: int, data: bytes, now: float) -> None:
        """Bytes of the response to an ``HttpRequest``; ``b""`` at EOF."""
        ...

    def http_failed(self, request_id: int, error: BaseException, now: float) -> None:
        """The ``HttpRequest`` could not be sent or its response not read."""
        ...


class HasConnection(Protocol):
    """A record of a :class:`ConnectionTable`: whatever a core keeps about one connection,
    with the connection itself as ``conn``."""

    conn: Connection


R = TypeVar("R", bound=HasConnection)


class ConnectionTable(Generic[R]):
    """The connections of one core, by id: it hands out the ids, routes the driver's transport
    calls to the right :class:`Connection`, owns the connections' deadlines, and drains a
    connection after each input through the ``drain`` callable it is given (where the core
    moves that connection's outputs to its own queue, reacting to its events).

    It decides nothing about a connection's life: the core adds a record when it asks for a
    ``Connect`` and removes it when the connection closed.  Ids start at 1 and are never used
    twice, so an id the table no longer holds names a connection that is gone, and a call for
    it is ignored."""

    __slots__ = ("_drain", "_next_id", "by_id")

    def __init__(self, drain: Callable[[R, float], None]) -> None:
        #: the records by connection id, in the order added (the core reads them; only the
        #: table's :meth:`add` and :meth:`remove` change them)
        self.by_id: dict[ConnId, R] = {}
        self._drain = drain
        self._next_id = 1

    def new_id(self) -> ConnId:
        """The id of the next connection."""
        conn_id = self._next_id
        self._next_id = conn_id + 1
        return conn_id

    def add(self, conn_id: ConnId, rec: R) -> None:
        self.by_id[conn_id] = rec

    def remove(self, conn_id: ConnId) -> None:
        """Forget the connection (closed): later calls naming it are ignored."""
        self.by_id.pop(conn_id, None)

    def __len__(self) -> int:
        return len(self.by_id)

    # ------------------------------------------------------------------ routing

    def connection_made(self, conn_id: ConnId, now: float) -> R | None:
        """Route the driver's call; returns the record (None: the id is not held)."""
        rec = self.by_id.get(conn_id)
        if rec is not None:
            rec.conn.connection_made(now)
            self._drain(rec, now)
        return rec

    def tls_established(self, conn_id: ConnId, now: float) -> R | None:
        rec = self.by_id.get(conn_id)
        if rec is not None:
            rec.conn.tls_established(now)
            self._drain(rec, now)
        return rec

    def receive_data(self, conn_id: ConnId, data: bytes, now: float) -> R | None:
        rec = self.by_id.get(conn_id)
        if rec is None:
            return None
        # a protocol error has already queued Close + ConnectionClosed(error=...) on the
        # connection: one broken link must not break its neighbours
        with contextlib.suppress(NSQError):
            rec.conn.receive_data(data, now)
        self._drain(rec, now)
        return rec

    def connection_lost(self, conn_id: ConnId, now: float, error: BaseException | None) -> R | None:
        rec = self.by_id.get(conn_id)
        if rec is not None:
            rec.conn.connection_lost(now, error)
            self._drain(rec, now)
        return rec

    def drain_all(self, now: float) -> None:
        """Drain every connection: commands issued on one (RDY, FIN, ...) wait in its buffer
        until then."""
        drain = self._drain
        for rec in list(self.by_id.values()):
            drain(rec, now)

    # ------------------------------------------------------------------ deadlines

    def next_deadline(self) -> float | None:
        """The earliest deadline of any connection (read and handshake timeouts)."""
        deadline = None
        for rec in self.by_id.values():
            d = rec.conn.next_deadline()
            if d is not None and (deadline is None or d < deadline):
                deadline = d
        return deadline

    def handle_timer(self, now: float) -> None:
        """Fire the timers of every connection due at ``now``, draining each after its own."""
        for rec in list(self.by_id.values()):
            d = rec.conn.next_deadline()
            if d is not None and d <= now:
                rec.conn.handle_timer(now)
                self._drain(rec, now)


def reconnect_delay(attempt: int, base: float, cap: float, jitter: float, u: float) -> float:
    """``base``, then doubling per attempt up to ``cap``, less up to ``jitter`` of it (``u`` is
    a uniform draw from the core's random source)."""
    delay: float = min(cap, base * 2.0 ** (attempt - 1))
    return delay * (1 - jitter * u)


class ReconnectScheduler:
    """How long to wait before connecting again to a target (an nsqd, or one slot or
    partition of it) that was lost: :func:`reconnect_delay` of the attempts in a row.

    :meth:`delay` counts one more attempt; :meth:`connected` starts the count again once a
    connection to the target completed its handshake.  Used by both cores, which arm a
    ``RECONNECT`` timer with the delay."""

    __slots__ = ("_attempts", "_base", "_cap", "_jitter", "_rng")

    def __init__(self, rng: random.Random, base: float, cap: float, jitter: float) -> None:
        self._rng = rng
        self._base = base
        self._cap = cap
        self._jitter = jitter
        self._attempts: dict[Hashable, int] = {}

    def delay(self, target: Hashable) -> float:
        """Seconds until the next attempt at ``target`` (counts that attempt)."""
        attempt = self._attempts[target] = self._attempts.get(target, 0) + 1
        return reconnect_delay(attempt, self._base, self._cap, self._jitter, self._rng.random())

    def connected(self, target: Hashable) -> None:
        """A connection to ``target`` is up: the next loss waits ``base`` again."""
        self._attempts.pop(target, None)
