"""What the consumer and producer cores share: many connections behind one output queue."""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

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

__all__ = ["ClientCore", "MultiConnectionCore"]

#: requests in a row a lookupd learned from /listlookup may leave unanswered before it is dropped
_MAX_LOOKUPD_FAILURES = 3


class ClientCore(Protocol):
    """The interface every driver (an adapter, the in-memory network) uses on a core."""

    def start(self, now: float) -> None: ...
    def next_output(self) -> Output | None: ...
    def next_deadline(self) -> float | None: ...
    def handle_timer(self, now: float) -> None: ...
    def connection_made(self, conn_id: ConnId, now: float) -> None: ...
    def tls_established(self, conn_id: ConnId, now: float) -> None: ...
    def receive_data(self, conn_id: ConnId, data: bytes, now: float) -> None: ...
    def connection_lost(
        self, conn_id: ConnId, now: float, error: BaseException | None = None
    ) -> None: ...
    def http_data(self, request_id: int, data: bytes, now: float) -> None: ...
    def http_failed(self, request_id: int, error: BaseException, now: float) -> None: ...


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
    :meth:`_pump`, where the subclass reacts to its events) to the one queue."""

    _conns: dict[ConnId, R]
    _outputs: deque[Output]
    _timers: Timers
    _now: float

    @abstractmethod
    def _pump(self, rec: R, now: float) -> None:
        """Move ``rec``'s outputs to the queue, reacting to its events."""

    def _after_input(self) -> None:
        """Called after bytes or a loss were fed in (the producer dispatches queued work)."""

    # ------------------------------------------------------------------ lookupd HTTP

    _lookupd: list[tuple[str, int]]
    _seed_lookupd: list[tuple[str, int]]
    _http: dict[int, _HttpCall]
    _next_http_id: int
    _http_timeout: float
    _user_agent: str
    _cluster_seen: bool
    _lookupd_failures: dict[tuple[str, int], int]

    def _init_lookupd(
        self, addresses: list[tuple[str, int]], timeout: float, user_agent: str | None
    ) -> None:
        self._lookupd = addresses
        self._seed_lookupd = list(addresses)
        self._http = {}
        self._next_http_id = 1
        self._http_timeout = timeout
        self._user_agent = user_agent or "nsq_proto"
        #: a lookup answered like the partitioned cluster: ask it for the other lookupd too
        self._cluster_seen = False
        #: lookupd -> requests in a row that got no answer (a learned one is dropped at
        #: _MAX_LOOKUPD_FAILURES; the configured ones are always kept)
        self._lookupd_failures = {}

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
