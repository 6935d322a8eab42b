"""What the consumer and producer cores share: many connections behind one output queue."""

from __future__ import annotations

import contextlib
import random
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import Any, Final, Generic, Protocol, TypeVar

from ._config import parse_address, parse_client_addresses
from ._connection import Connection
from ._errors import LookupdError, NSQError
from ._events import ConnId, LookupFailed
from ._lookupd import (
    HttpResponseParser,
    LookupResult,
    build_listlookup_request,
    feed_listlookup_response,
    feed_lookup_response,
)
from ._outputs import HttpRequest, Output
from ._timers import TimerKind, Timers

__all__ = ["ClientCore", "MultiConnectionCore", "ReconnectScheduler", "parse_address"]

#: requests in a row a lookupd learned from /listlookup may leave unanswered before it is dropped
_MAX_LOOKUPD_FAILURES: Final = 3


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


@dataclass(slots=True)
class _HttpCall:
    address: tuple[str, int]
    parser: HttpResponseParser
    #: the topic looked up; None for ``/listlookup`` and calls to nsqd
    topic: str | None
    #: a call to nsqd's HTTP API: what the subclass needs to handle its answer
    nsqd_call: Any = None


class _HasConnection(Protocol):
    conn: Connection


R = TypeVar("R", bound=_HasConnection)


class MultiConnectionCore(ABC, Generic[R]):
    """Routes transport events to the right :class:`Connection` and moves its outputs (through
    :meth:`_pump`, where the subclass reacts to its events) to the one queue.

    It owns what the consumer and the producer share: the output queue, the named timers,
    the table of connections, the configured nsqd and lookupd, the lookupd HTTP calls, the
    random source and the reconnect scheduler.  A subclass calls ``__init__`` first (it
    validates the addresses), then adds its own state."""

    def __init__(
        self,
        *,
        nsqd_tcp_addresses: Iterable[str | tuple[str, int]],
        lookupd_http_addresses: Iterable[str | tuple[str, int]],
        lookupd_timeout: float,
        user_agent: str | None,
        reconnect_delay: float,
        max_reconnect_delay: float,
        reconnect_jitter: float,
        rng: random.Random | None,
    ) -> None:
        """Raises :class:`ConfigError` naming the bad value for an address that is not
        ``host:port`` (a lookupd address may also be ``http://host:port``) or a string given
        for a list, and when neither nsqd nor lookupd addresses are given."""
        #: the fixed nsqd list (the producer adds the nsqd lookupd names)
        #: and every lookupd asked: the configured ones, then those learned from /listlookup
        self._nsqd, self._lookupd = parse_client_addresses(
            nsqd_tcp_addresses, lookupd_http_addresses
        )
        self._seed_lookupd = list(self._lookupd)
        self._rng = rng if rng is not None else random.Random()
        self._outputs: deque[Output] = deque()
        self._timers = Timers()
        self._conns: dict[ConnId, R] = {}
        self._next_conn_id = 1
        #: the time given with the latest call (for work done on behalf of no call: draining)
        self._now = 0.0
        self._started = False
        self._reconnects = ReconnectScheduler(
            self._rng, reconnect_delay, max_reconnect_delay, reconnect_jitter
        )
        self._http: dict[int, _HttpCall] = {}
        self._next_http_id = 1
        self._http_timeout = lookupd_timeout
        self._user_agent = user_agent or "nsq_proto"
        #: a lookup answered like the partitioned cluster: ask it for the other lookupd too
        self._cluster_seen = False
        #: lookupd -> requests in a row that got no answer (a learned one is dropped at
        #: _MAX_LOOKUPD_FAILURES; the configured ones are always kept)
        self._lookupd_failures: dict[tuple[str, int], int] = {}

    @abstractmethod
    def _pump(self, rec: R, now: float) -> None:
        """Move ``rec``'s outputs to the queue, reacting to its events."""

    def _after_input(self) -> None:
        """Called after bytes or a loss were fed in (the producer dispatches queued work)."""

    # ------------------------------------------------------------------ reconnecting

    def _schedule_reconnect(self, target: Hashable, now: float) -> None:
        """Connect to ``target`` again after the scheduler's delay: the subclass gets it back
        as the argument of a :attr:`TimerKind.RECONNECT` timer."""
        self._timers.set((TimerKind.RECONNECT, target), now + self._reconnects.delay(target))

    # ------------------------------------------------------------------ lookupd HTTP

    def _http_request(
        self, address: tuple[str, int], data: bytes, topic: str | None, *, nsqd_call: Any = None
    ) -> None:
        rid = self._next_http_id
        self._next_http_id += 1
        self._http[rid] = _HttpCall(address, HttpResponseParser(), topic, nsqd_call)
        self._outputs.append(HttpRequest(rid, address[0], address[1], data, self._http_timeout))
        self._timers.set((TimerKind.HTTP_TIMEOUT, rid), self._now + self._http_timeout)

    def _listlookup(self) -> None:
        """go-nsq (partitioned cluster): learn every lookupd of the cluster from the seeds
        (one round at a time)."""
        if any(call.topic is None for call in self._http.values()):
            return
        for host, port in self._seed_lookupd:
            data = build_listlookup_request(host, port, user_agent=self._user_agent)
            self._http_request((host, port), data, None)

    def http_data(self, request_id: int, data: bytes, now: float) -> None:
        """Bytes of a lookupd response (``b""`` at EOF)."""
        self._now = now
        call = self._http.get(request_id)
        if call is None:
            return
        if call.nsqd_call is not None:
            self._nsqd_http_data(request_id, call, data, now)
            return
        try:
            answer = (
                feed_listlookup_response(call.parser, data)
                if call.topic is None
                else feed_lookup_response(call.parser, data)
            )
        except LookupdError as exc:
            self._http_error(request_id, exc, answered=True)
            return
        if answer is None:
            return
        del self._http[request_id]
        self._timers.cancel((TimerKind.HTTP_TIMEOUT, request_id))
        self._lookupd_failures.pop(call.address, None)
        if not isinstance(answer, LookupResult):
            new = [n.http_address for n in answer if n.http_address not in self._lookupd]
            if new:
                self._lookupd.extend(new)
                self._on_lookupd_added(now)
            return
        assert call.topic is not None
        if (answer.meta is not None or answer.partitions) and not self._cluster_seen:
            self._cluster_seen = True
            self._listlookup()
        self._on_lookup(call.address, call.topic, answer, now)

    def http_failed(self, request_id: int, error: BaseException, now: float) -> None:
        """The adapter could not reach lookupd or the transfer broke."""
        self._now = now
        exc = LookupdError(f"lookupd request failed: {error}")
        exc.__cause__ = error
        self._http_error(request_id, exc)

    def _http_error(self, request_id: int, error: NSQError, *, answered: bool = False) -> None:
        """``answered``: lookupd itself said no (an error status or an unusable body), as
        opposed to a request that never got an answer."""
        call = self._http.pop(request_id, None)
        self._timers.cancel((TimerKind.HTTP_TIMEOUT, request_id))
        if call is not None and call.nsqd_call is not None:
            self._on_nsqd_failed(call.nsqd_call, error)
        elif call is not None:
            self._outputs.append(LookupFailed(call.address, error))
            self._count_lookupd_failure(call.address, answered)
            if call.topic is not None:
                self._on_lookup_failed(call.topic, error, answered)

    def _count_lookupd_failure(self, address: tuple[str, int], answered: bool) -> None:
        failures = self._lookupd_failures
        if answered:
            failures.pop(address, None)  # it is there, and said no
            return
        count = failures[address] = failures.get(address, 0) + 1
        if count >= _MAX_LOOKUPD_FAILURES and address not in self._seed_lookupd:
            # learned from /listlookup and gone: forget it; the cluster names it again
            # (the next /listlookup) if it comes back
            del failures[address]
            with contextlib.suppress(ValueError):
                self._lookupd.remove(address)

    def _nsqd_http_data(self, request_id: int, call: _HttpCall, data: bytes, now: float) -> None:
        try:
            response = call.parser.receive_data(data)
            if response is None and not data:
                raise LookupdError("nsqd closed the connection before a full response")
        except LookupdError as exc:
            self._http_error(request_id, exc)
            return
        if response is not None:
            del self._http[request_id]
            self._timers.cancel((TimerKind.HTTP_TIMEOUT, request_id))
            self._on_nsqd_answer(call.nsqd_call, response.status, response.body, now)

    def _on_nsqd_answer(self, nsqd_call: Any, status: int, body: bytes, now: float) -> None:
        """A call to nsqd's HTTP API answered."""

    def _on_nsqd_failed(self, nsqd_call: Any, error: NSQError) -> None:
        """A call to nsqd's HTTP API got no answer."""

    def _looking_up(self, topic: str) -> bool:
        return any(call.topic == topic for call in self._http.values())

    def _on_lookup(
        self, address: tuple[str, int], topic: str, result: LookupResult, now: float
    ) -> None:
        """A ``/lookup`` answered."""

    def _on_lookup_failed(self, topic: str, error: NSQError, answered: bool) -> None:
        """A ``/lookup`` failed (the LookupFailed event is already queued)."""

    def _on_lookupd_added(self, now: float) -> None:
        """``/listlookup`` named lookupd not known before."""

    def _pump_all(self) -> None:
        # commands issued on a connection (RDY, FIN, ...) wait in its buffer until drained
        for rec in list(self._conns.values()):
            self._pump(rec, self._now)

    def next_output(self) -> Output | None:
        if not self._outputs:
            self._pump_all()
        return self._outputs.popleft() if self._outputs else None

    def outputs(self) -> list[Output]:
        self._pump_all()
        out = list(self._outputs)
        self._outputs.clear()
        return out

    def next_deadline(self) -> float | None:
        deadline = self._timers.next_deadline()
        for rec in self._conns.values():
            d = rec.conn.next_deadline()
            if d is not None and (deadline is None or d < deadline):
                deadline = d
        return deadline

    def _fire_connection_timers(self, now: float) -> None:
        for rec in list(self._conns.values()):
            d = rec.conn.next_deadline()
            if d is not None and d <= now:
                rec.conn.handle_timer(now)
                self._pump(rec, now)

    def connection_made(self, conn_id: ConnId, now: float) -> None:
        self._now = now
        rec = self._conns.get(conn_id)
        if rec is not None:
            rec.conn.connection_made(now)
            self._pump(rec, now)

    def tls_established(self, conn_id: ConnId, now: float) -> None:
        self._now = now
        rec = self._conns.get(conn_id)
        if rec is not None:
            rec.conn.tls_established(now)
            self._pump(rec, now)

    def receive_data(self, conn_id: ConnId, data: bytes, now: float) -> None:
        self._now = now
        rec = self._conns.get(conn_id)
        if rec is None:
            return
        # a protocol error has already queued Close + ConnectionClosed(error=...) on the
        # connection: one broken link must not break its neighbours
        with contextlib.suppress(NSQError):
            rec.conn.receive_data(data, now)
        self._pump(rec, now)
        self._after_input()

    def connection_lost(
        self, conn_id: ConnId, now: float, error: BaseException | None = None
    ) -> None:
        self._now = now
        rec = self._conns.get(conn_id)
        if rec is not None:
            rec.conn.connection_lost(now, error)
            self._pump(rec, now)
            self._after_input()


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
