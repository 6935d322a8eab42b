"""The producer core: publishing over pooled, pipelined connections to one or more nsqd.

Requests are validated when they are made, queued, and handed to a ready connection with room
(``max_outstanding`` unanswered requests per connection).  nsqd answers in order, so each
connection matches responses to requests FIFO.  A request that fails because its connection
went away is retried on another connection (failover) up to ``max_publish_attempts`` times; one that nsqd
refused with an error frame fails with that :class:`ServerError`, except the partitioned
server's cluster errors, which trigger a new lookup and a retry (as go-nsq does).
"""

from __future__ import annotations

import contextlib
import math
import random
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from . import commands as cmd
from ._config import ProducerConfig, parse_client_addresses
from ._connection import Connection
from ._core import ConnectionTable, ReconnectScheduler
from ._errors import (
    ConnectionClosedError,
    LocalProtocolError,
    LookupdError,
    NSQError,
    PublishTimeout,
    ServerError,
    fresh_copy,
    permanent_cause,
)
from ._events import (
    ConnectionClosed,
    ConnId,
    LookupFailed,
    PublishFailed,
    PublishSucceeded,
    Ready,
)
from ._lookupd import LookupResult
from ._lookupd_client import HttpAnswer, LookupAnswered, LookupdClient, LookupdFailed
from ._names import check_topic
from ._outputs import Connect, Output
from ._partitioned import TOPOLOGY_CHANGED, partition_for_key
from ._state import ConnectionState
from ._timers import TimerKind, Timers

__all__ = ["ProducerConfig", "Producer", "PublishTimeout"]

_S = ConnectionState

_PUB: Final = "PUB"
_NO_DPUB: Final = "the partitioned server has no DPUB (deferred publish): publish without a delay"
_MPUB: Final = "MPUB"
_DPUB: Final = "DPUB"
#: go-nsq's pause before the n-th retry of a publish: 8 ms + 10 ms * 2^n
_RETRY_BASE: Final = 0.008
_RETRY_STEP: Final = 0.010


@dataclass(slots=True)
class _Request:
    request_id: int
    topic: str
    kind: str
    bodies: list[bytes]
    partition: int | None
    sharding_key: bytes | None
    trace_ids: list[int] | None
    delay: float
    deadline: float
    #: the JSON extension header (PUB_EXT/MPUB_EXT), if any
    ext: bytes | None = None
    #: the header has the key ``##trace_id``: the server answers PUB_EXT with a receipt
    ext_traced: bool = False
    attempts: int = 0
    conn_id: ConnId = 0
    #: not sent again before this time (the retry backoff)
    not_before: float = 0.0
    #: the ordered partition ``(topic, partition)`` it was sent to, while unanswered
    stream: tuple[str, int] | None = None
    #: (partition count, partition) its sharding key was mapped to
    hashed: tuple[int, int] | None = None


@dataclass(slots=True)
class _PConn:
    conn_id: ConnId
    conn: Connection
    address: tuple[str, int]
    slot: int
    #: connection-level request id -> our request
    outstanding: dict[int, _Request] = field(default_factory=dict)
    #: the TCP connection came up (a loss before it is a failed connection attempt)
    connected: bool = False


@dataclass(slots=True)
class _TopicRoute:
    partition_num: int
    partitions: dict[int, tuple[str, int]]
    ordered: bool
    next_rr: int = 0


class Producer:
    """Producer core (a :class:`ClientCore`).  ``publish*`` return a request id; the answer
    comes as a :class:`PublishSucceeded` or :class:`PublishFailed` event carrying it.

    Composed of its connection table (ids, routing, the connections' deadlines), its lookupd
    client (the HTTP calls) and its reconnect scheduler; it owns the pool, the routes and the
    requests."""

    def __init__(
        self,
        config: ProducerConfig | None = None,
        *,
        nsqd_tcp_addresses: Iterable[str | tuple[str, int]] = (),
        lookupd_http_addresses: Iterable[str | tuple[str, int]] = (),
        rng: random.Random | None = None,
    ) -> None:
        self.config = cfg = config if config is not None else ProducerConfig()
        #: the fixed nsqd list, and the nsqd lookupd names for a standard server's topic
        self._nsqd, lookupd = parse_client_addresses(nsqd_tcp_addresses, lookupd_http_addresses)
        self._rng = rng if rng is not None else random.Random()
        self._outputs: deque[Output] = deque()
        self._timers = Timers()
        self._table: ConnectionTable[_PConn] = ConnectionTable(self._drain)
        #: the table's records (the table adds and removes them)
        self._conns = self._table.by_id
        #: the time given with the latest call (for work done on behalf of no call: draining)
        self._now = 0.0
        self._started = False
        self._reconnects = ReconnectScheduler(
            self._rng, cfg.reconnect_delay, cfg.max_reconnect_delay, cfg.reconnect_jitter
        )
        self._lookupd = LookupdClient(
            lookupd,
            timeout=cfg.lookupd_poll_timeout,
            user_agent=cfg.user_agent,
            timers=self._timers,
            send=self._outputs.append,
        )
        self._conn_config = cfg.connection_config()
        self._slots: dict[tuple[tuple[str, int], int], ConnId] = {}
        self._queue: deque[_Request] = deque()
        #: ordered partitions with a request on the wire: (topic, partition) -> request id
        self._streams: dict[tuple[str, int], int] = {}
        #: publishes not yet answered, oldest first (so by deadline: see publish)
        self._requests: dict[int, _Request] = {}
        self._last_deadline = -math.inf
        self._routes: dict[str, _TopicRoute] = {}
        self._lookup_pending: set[str] = set()
        self._next_request_id = 1
        self._closing = False
        self._last_error: NSQError | None = None
        #: topic -> lookupd's latest failure for it, and how often lookupd refused it lately
        self._lookup_errors: dict[str, NSQError] = {}
        self._refusals: dict[str, int] = {}
        #: (address, slot) -> the permanent failure of its last connection (TLS refused,
        #: AUTH failed, ...); cleared once a connection there is ready again
        self._permanent: dict[tuple[tuple[str, int], int], NSQError] = {}
        #: (address, slot) -> why its last connection attempt failed (refused, no route, dial
        #: timeout); cleared once a connection there is up again
        self._unreachable: dict[tuple[tuple[str, int], int], NSQError] = {}

    # ------------------------------------------------------------------ outputs and time

    def next_output(self) -> Output | None:
        if not self._outputs:
            self._table.drain_all(self._now)
        return self._outputs.popleft() if self._outputs else None

    def outputs(self) -> list[Output]:
        self._table.drain_all(self._now)
        out = list(self._outputs)
        self._outputs.clear()
        return out

    def next_deadline(self) -> float | None:
        deadline = self._timers.next_deadline()
        conns = self._table.next_deadline()
        if conns is not None and (deadline is None or conns < deadline):
            deadline = conns
        if self._requests:
            # the oldest request expires first (see publish): no scan of every request
            first = next(iter(self._requests.values())).deadline
            if deadline is None or first < deadline:
                deadline = first
        return deadline

    def handle_timer(self, now: float) -> None:
        self._now = now
        self._table.handle_timer(now)
        for kind, arg in self._timers.pop_due(now):
            if kind is TimerKind.RECONNECT:
                assert isinstance(arg, tuple)
                address, slot = arg
                self._open(address, slot)
            elif kind is TimerKind.HTTP_TIMEOUT:
                assert isinstance(arg, int)
                self._on_http_answer(self._lookupd.timed_out(arg))
            elif kind is TimerKind.LOOKUPD_POLL:
                assert isinstance(arg, str)
                self._lookup(arg)
            # TimerKind.RETRY: a backoff is over; the dispatch below sends it
        expired: list[_Request] = []
        for req in self._requests.values():
            if req.deadline > now:
                break  # the rest expire later (see publish)
            expired.append(req)
        for req in expired:
            lookup_error = self._lookup_errors.get(req.topic)
            if lookup_error is not None and req.topic not in self._routes:
                why = f" (no route: {lookup_error})"
            elif self._last_error:
                why = f" (last connection error: {self._last_error})"
            else:
                why = ""
            self._fail(
                req, PublishTimeout(f"publish {req.request_id} not acknowledged in time{why}")
            )
        self._dispatch()

    # ------------------------------------------------------------------ connections

    def start(self, now: float) -> None:
        """Open the pool to every configured nsqd."""
        self._now = now
        if self._started:
            raise LocalProtocolError("the producer is already started")
        self._started = True
        for address in self._nsqd:
            for slot in range(self.config.pool_size):
                self._open(address, slot)

    def _open(self, address: tuple[str, int], slot: int) -> None:
        if self._closing or (address, slot) in self._slots:
            return
        conn_id = self._table.new_id()
        conn = Connection(self._conn_config, conn_id, address=address)
        rec = _PConn(conn_id, conn, address, slot)
        self._table.add(conn_id, rec)
        self._slots[(address, slot)] = conn_id
        self._outputs.append(Connect(conn_id, address[0], address[1], self.config.dial_timeout))

    # ------------------------------------------------------------------ transport events
    # (routed by the connection table, which drains the connection through _drain)

    def connection_made(self, conn_id: ConnId, now: float) -> None:
        self._now = now
        rec = self._conns.get(conn_id)
        if rec is not None:
            rec.connected = True
            self._unreachable.pop((rec.address, rec.slot), None)
        self._table.connection_made(conn_id, now)

    def tls_established(self, conn_id: ConnId, now: float) -> None:
        self._now = now
        self._table.tls_established(conn_id, now)

    def receive_data(self, conn_id: ConnId, data: bytes, now: float) -> None:
        self._now = now
        if self._table.receive_data(conn_id, data, now) is not None:
            self._dispatch()

    def connection_lost(
        self, conn_id: ConnId, now: float, error: BaseException | None = None
    ) -> None:
        self._now = now
        if self._table.connection_lost(conn_id, now, error) is not None:
            self._dispatch()

    def http_data(self, request_id: int, data: bytes, now: float) -> None:
        """Bytes of a lookupd response (``b""`` at EOF)."""
        self._now = now
        self._on_http_answer(self._lookupd.http_data(request_id, data, now))

    def http_failed(self, request_id: int, error: BaseException, now: float) -> None:
        """The driver could not reach lookupd or the transfer broke."""
        self._now = now
        self._on_http_answer(self._lookupd.http_failed(request_id, error))

    def _on_http_answer(self, answer: HttpAnswer | None) -> None:
        if isinstance(answer, LookupAnswered):
            self._apply_lookup(answer.topic, answer.result)
            self._dispatch()
        elif isinstance(answer, LookupdFailed):
            self._outputs.append(LookupFailed(answer.address, answer.error))
            if answer.topic is not None:
                self._on_lookup_failed(answer.topic, answer.error, answer.answered)
        # LookupdsLearned: asked at the next lookup; the producer makes no calls to nsqd

    def _drain(self, rec: _PConn, now: float) -> None:
        conn = rec.conn
        out = self._outputs
        while (item := conn.next_output()) is not None:
            if type(item) is PublishSucceeded:
                req = rec.outstanding.pop(item.request_id, None)
                if req is not None:
                    if req.stream is not None:
                        self._release(req)
                    self._requests.pop(req.request_id, None)
                    out.append(PublishSucceeded(rec.conn_id, req.request_id, item.receipt))
            elif type(item) is PublishFailed:
                req = rec.outstanding.pop(item.request_id, None)
                if req is not None:
                    self._failed_on_connection(req, item.error)
            elif isinstance(item, Ready):
                out.append(item)
                self._reconnects.connected((rec.address, rec.slot))
                self._permanent.pop((rec.address, rec.slot), None)
            elif isinstance(item, ConnectionClosed):
                out.append(item)
                if item.error is not None:
                    self._last_error = item.error
                    if not rec.connected:
                        self._unreachable[(rec.address, rec.slot)] = item.error
                permanent = permanent_cause(item.error)
                if permanent is not None:
                    self._permanent[(rec.address, rec.slot)] = permanent
                self._on_closed(rec, now)
            else:
                out.append(item)

    def _on_closed(self, rec: _PConn, now: float) -> None:
        self._table.remove(rec.conn_id)
        if self._slots.get((rec.address, rec.slot)) == rec.conn_id:
            del self._slots[(rec.address, rec.slot)]
        for req in list(rec.outstanding.values()):
            self._failed_on_connection(req, ConnectionClosedError("connection closed"))
        rec.outstanding.clear()
        if self._closing:
            return
        if rec.address in self._nsqd or self._wanted_address(rec.address):
            target = (rec.address, rec.slot)
            self._timers.set((TimerKind.RECONNECT, target), now + self._reconnects.delay(target))

    def _wanted_address(self, address: tuple[str, int]) -> bool:
        return any(address in r.partitions.values() for r in self._routes.values())

    def _partitioned(self, topic: str) -> bool:
        """Known to be served by the partitioned server (its lookup, or a connection)."""
        route = self._routes.get(topic)
        if route is not None and route.partitions:
            return True
        return any(self._is_partitioned(rec) for rec in self._conns.values())

    @staticmethod
    def _is_partitioned(rec: _PConn) -> bool:
        features = rec.conn.features
        return features is not None and features.partitioned

    def _broken(self) -> NSQError | None:
        """A permanent failure, when every place a request could go has one; or, when every
        one of them failed its last connection attempt and none is being tried again, the
        refusals (a publish then fails with them, not at ``publish_timeout``)."""
        permanent = self._permanent
        unreachable = self._unreachable
        if not permanent and not unreachable:
            return None
        slots = range(self.config.pool_size)
        keys = {(a, slot) for a in self._nsqd for slot in slots}
        for route in self._routes.values():
            keys.update((a, slot) for a in route.partitions.values() for slot in slots)
        keys.update(self._slots)
        if not keys:
            return None
        if keys <= permanent.keys():
            return next(reversed(permanent.values()))
        causes: dict[tuple[str, int], str] = {}
        for key in sorted(keys):
            error = permanent.get(key)
            if error is None:
                error = unreachable.get(key)
                if error is None or key in self._slots:
                    return None  # connected, or an attempt is under way
                cause = error.__cause__ if error.__cause__ is not None else error
            else:
                cause = error
            address = key[0]
            name = f"{address[0]}:{address[1]}"
            text = str(cause)
            causes[address] = text if name in text else f"{name}: {text}"
        failure = ConnectionClosedError(
            f"could not connect to any nsqd: {'; '.join(causes.values())}"
        )
        failure.__cause__ = next(reversed(unreachable.values()))
        return failure

    def _failed_on_connection(self, req: _Request, error: NSQError) -> None:
        self._release(req)
        retryable = not isinstance(error, ServerError) or error.code in TOPOLOGY_CHANGED
        if isinstance(error, ServerError) and error.code in TOPOLOGY_CHANGED:
            self._invalidate_route(req.topic)
        if (
            retryable
            and req.attempts < self.config.max_publish_attempts
            and req.deadline > self._now
        ):
            self._retry_later(req)
            return
        self._fail(req, error)

    def _retry_later(self, req: _Request) -> None:
        """Queue ``req`` again in call order, after go-nsq's backoff (8 ms + 10 ms * 2^n)."""
        req.not_before = self._now + _RETRY_BASE + _RETRY_STEP * (1 << req.attempts)
        self._timers.set((TimerKind.RETRY, req.request_id), req.not_before)
        queue = self._queue
        rid = req.request_id
        index = len(queue)
        while index and queue[index - 1].request_id > rid:
            index -= 1
        queue.insert(index, req)

    def _release(self, req: _Request) -> None:
        stream = req.stream
        if stream is not None:
            req.stream = None
            if self._streams.get(stream) == req.request_id:
                del self._streams[stream]

    def _fail(self, req: _Request, error: NSQError) -> None:
        self._release(req)
        self._timers.cancel((TimerKind.RETRY, req.request_id))
        self._requests.pop(req.request_id, None)
        with contextlib.suppress(ValueError):
            self._queue.remove(req)
        for rec in self._conns.values():
            for rid, r in list(rec.outstanding.items()):
                if r is req:
                    del rec.outstanding[rid]  # a late answer is then ignored
        self._outputs.append(PublishFailed(req.conn_id, req.request_id, error))

    # ------------------------------------------------------------------ publishing

    def _new_request(
        self,
        topic: str,
        kind: str,
        bodies: list[bytes],
        now: float,
        *,
        partition: int | None = None,
        sharding_key: bytes | str | None = None,
        trace_ids: list[int] | None = None,
        delay: float = 0.0,
        ext: bytes | None = None,
        ext_traced: bool = False,
    ) -> int:
        if self._closing:
            raise LocalProtocolError("the producer is closing")
        self._now = now
        check_topic(topic)
        if not bodies:
            raise LocalProtocolError("nothing to publish")
        # looked at as given (Any): the compiled build would check each item is bytes first
        given: Sequence[Any] = bodies
        for body in given:
            if type(body) is not bytes or not body:
                if not isinstance(body, bytes | bytearray | memoryview) or not len(body):
                    raise LocalProtocolError("message bodies must be non-empty bytes")
                bodies = [bytes(b) for b in given]
                break
        if partition is not None and sharding_key is not None:
            raise LocalProtocolError("give a partition or a sharding key, not both")
        if partition is not None and (isinstance(partition, bool) or partition < 0):
            raise LocalProtocolError(f"partition must be a non-negative int, not {partition!r}")
        if isinstance(sharding_key, str):
            sharding_key = sharding_key.encode()
        if sharding_key is not None and not self._lookupd.addresses:
            raise LocalProtocolError("a sharding key needs lookupd (to learn the partition count)")
        if delay < 0:
            raise LocalProtocolError("delay cannot be negative")
        rid = self._next_request_id
        self._next_request_id += 1
        # deadlines never decrease in the order requests are made (under a clock that goes
        # back, one waits for the one before it): the first request is the next to expire
        deadline = now + self.config.publish_timeout
        if deadline < self._last_deadline:
            deadline = self._last_deadline
        self._last_deadline = deadline
        req = _Request(
            rid,
            topic,
            kind,
            bodies,
            partition,
            sharding_key,
            trace_ids,
            delay,
            deadline,
            ext,
            ext_traced,
        )
        self._requests[rid] = req
        self._queue.append(req)
        if self._lookupd.addresses and topic not in self._routes:
            self._lookup(topic)
        self._dispatch()
        return rid

    def publish(
        self,
        topic: str,
        body: bytes,
        now: float,
        *,
        partition: int | None = None,
        sharding_key: bytes | str | None = None,
        trace_id: int | None = None,
        delay: float | None = None,
        ext: Mapping[str, Any] | None = None,
    ) -> int:
        """PUB (DPUB with ``delay`` seconds, PUB_TRACE with ``trace_id``, PUB_EXT with an
        ``ext`` JSON header on the partitioned server)."""
        if delay is not None and (trace_id is not None or partition is not None or ext):
            raise LocalProtocolError("DPUB takes no partition, trace id or extension header")
        if trace_id is not None:
            cmd.pub_trace("t", trace_id, b"x")  # validates the trace id now
        header = None
        ext_traced = False
        if ext is not None:
            fields = dict(ext)
            if trace_id is not None:
                fields["##trace_id"] = str(trace_id)  # PUB_EXT carries the trace id itself
                trace_id = None
            header = cmd.encode_ext_header(fields)
            # decided by the header's keys, never by its text (a value may read "##trace_id")
            ext_traced = "##trace_id" in fields
        kind = _DPUB if delay is not None else _PUB
        if kind == _DPUB and self._partitioned(topic):
            raise LocalProtocolError(_NO_DPUB)
        return self._new_request(
            topic,
            kind,
            [body],
            now,
            partition=partition,
            sharding_key=sharding_key,
            trace_ids=None if trace_id is None else [trace_id],
            delay=delay or 0.0,
            ext=header,
            ext_traced=ext_traced,
        )

    def publish_many(
        self,
        topic: str,
        bodies: Iterable[bytes],
        now: float,
        *,
        partition: int | None = None,
        sharding_key: bytes | str | None = None,
        trace_ids: Iterable[int] | None = None,
        ext: Mapping[str, Any] | None = None,
    ) -> int:
        """MPUB (MPUB_TRACE with ``trace_ids``, one per body; MPUB_EXT with an ``ext`` JSON
        header given to every message)."""
        items = list(bodies)
        traces = None if trace_ids is None else list(trace_ids)
        if traces is not None:
            if ext is not None:
                raise LocalProtocolError("MPUB_EXT takes no trace ids")
            if len(traces) != len(items):
                raise LocalProtocolError("give one trace id per body")
            cmd.mpub_trace("t", [(t, b"x") for t in traces])
        return self._new_request(
            topic,
            _MPUB,
            items,
            now,
            partition=partition,
            sharding_key=sharding_key,
            trace_ids=traces,
            ext=None if ext is None else cmd.encode_ext_header(ext),
        )

    def _encode(self, req: _Request, partition: int | None) -> tuple[bytes, bool]:
        traced = req.trace_ids is not None
        if req.kind == _DPUB:
            return cmd.dpub(req.topic, round(req.delay * 1000), req.bodies[0]), False
        if req.ext is not None:
            if req.kind == _PUB:
                return cmd.pub_ext(req.topic, req.bodies[0], req.ext, partition), req.ext_traced
            return cmd.mpub_ext(req.topic, [(req.ext, b) for b in req.bodies], partition), False
        if req.kind == _PUB:
            if req.trace_ids is not None:
                return cmd.pub_trace(req.topic, req.trace_ids[0], req.bodies[0], partition), True
            return cmd.pub_unchecked(req.topic, req.bodies[0], partition), False
        if req.trace_ids is not None:
            return cmd.mpub_trace(
                req.topic, list(zip(req.trace_ids, req.bodies, strict=True)), partition
            ), True
        return cmd.mpub_unchecked(req.topic, req.bodies, partition), traced

    def _route(self, req: _Request) -> tuple[tuple[str, int] | None, int | None] | None:
        """Where a request goes: (address or None for any, partition); None: not yet known.
        Raises LocalProtocolError where it can go nowhere."""
        if not self._lookupd.addresses:
            return None, req.partition
        route = self._routes.get(req.topic)
        if route is None:
            return None
        if not route.partitions:
            return None, req.partition  # standard server behind lookupd: any of our nsqd
        if req.sharding_key is not None:
            if route.partition_num <= 0:
                raise LocalProtocolError(
                    f"lookupd gave no partition count (meta.partition_num) for topic "
                    f"{req.topic!r}: a sharding key cannot be mapped to a partition"
                )
            num = route.partition_num
            cached = req.hashed
            if cached is None or cached[0] != num:
                cached = req.hashed = (
                    num,
                    partition_for_key(req.sharding_key, num, self.config.hasher),
                )
            pid = cached[1]
        elif req.partition is not None:
            pid = req.partition
        else:
            pids = sorted(route.partitions)
            pid = pids[route.next_rr % len(pids)]
            route.next_rr += 1
        address = route.partitions.get(pid)
        if address is None:
            num = route.partition_num
            if num and not 0 <= pid < num:
                raise LocalProtocolError(
                    f"topic {req.topic!r} has {num} partitions (0..{num - 1}): no partition {pid}"
                )
            return None
        return address, pid

    def _pick(self, address: tuple[str, int] | None) -> _PConn | None:
        cap = self.config.max_outstanding
        best: _PConn | None = None
        for rec in self._conns.values():
            if address is not None and rec.address != address:
                continue
            if rec.conn.state is not _S.READY or len(rec.outstanding) >= cap:
                continue
            if best is None or len(rec.outstanding) < len(best.outstanding):
                best = rec
        return best

    def _dispatch(self) -> None:
        queue = self._queue
        if queue and (self._permanent or self._unreachable):
            broken = self._broken()
            if broken is not None:
                # no retry will get through: fail now, with the cause, not at the deadline
                for req in list(queue):
                    self._fail(req, fresh_copy(broken))
                return
        now = self._now
        streams = self._streams
        #: ordered partitions whose earliest queued request cannot go now: later ones wait
        blocked: set[tuple[str, int]] = set()
        skipped: list[_Request] = []
        while queue:
            req = queue.popleft()
            try:
                routed = self._route(req)
            except LocalProtocolError as exc:
                self._fail(req, exc)
                continue
            if routed is None:
                skipped.append(req)
                continue
            address, partition = routed
            stream = self._stream(req, partition)
            if stream is not None and (stream in blocked or stream in streams):
                # one request on the wire per ordered partition: a refusal or a loss can then
                # never let a later publish overtake an earlier one
                skipped.append(req)
                blocked.add(stream)
                continue
            if req.not_before > now:
                skipped.append(req)  # backing off before a retry
                if stream is not None:
                    blocked.add(stream)
                continue
            rec = self._pick(address)
            if rec is None:
                if address is not None:
                    for slot in range(self.config.pool_size):
                        self._open(address, slot)
                skipped.append(req)
                if stream is not None:
                    blocked.add(stream)
                if address is None:
                    break  # every connection is busy: keep FIFO order
                continue
            if req.kind == _DPUB and self._is_partitioned(rec):
                self._fail(req, LocalProtocolError(_NO_DPUB))
                continue
            data, traced = self._encode(req, partition)
            req.attempts += 1
            req.conn_id = rec.conn_id
            crid = rec.conn.publish_encoded(data, traced=traced)
            rec.outstanding[crid] = req
            if stream is not None:
                req.stream = stream
                streams[stream] = req.request_id
        queue.extendleft(reversed(skipped))

    def _stream(self, req: _Request, partition: int | None) -> tuple[str, int] | None:
        """The ordered partition ``req`` belongs to: a publish with a sharding key, or to a
        partition of an ordered topic; None where call order is not promised."""
        if partition is None:
            return None
        if req.sharding_key is None and req.partition is None:
            return None
        if req.sharding_key is None:
            route = self._routes.get(req.topic)
            if route is None or not route.ordered:
                return None
        return (req.topic, partition)

    # ------------------------------------------------------------------ partitioned lookup

    def _lookup(self, topic: str) -> None:
        if topic in self._lookup_pending or self._closing:
            return
        self._lookup_pending.add(topic)
        self._lookupd.refresh_cluster(self._now)  # the cluster's lookupd may have changed
        self._lookupd.lookup(topic, "w", self._now)

    def _on_lookup_failed(self, topic: str, error: NSQError, answered: bool) -> None:
        self._lookup_errors[topic] = error
        if answered:
            self._refusals[topic] = self._refusals.get(topic, 0) + 1
        if not self._lookupd.looking_up(topic):
            self._lookup_pending.discard(topic)
            if self._refusals.get(topic, 0) >= 2 and topic not in self._routes:
                # lookupd said no twice (e.g. "Topic has no channel, should init at least one
                # for the new topic"): the waiting publishes fail now, with its answer
                for req in [r for r in self._queue if r.topic == topic]:
                    failure = LookupdError(f"no route to topic {topic!r}: {error}")
                    failure.__cause__ = error
                    self._fail(req, failure)
                self._refusals.pop(topic, None)
            # try again a little later; other waiting requests time out on their deadline
            self._timers.set((TimerKind.LOOKUPD_POLL, topic), self._now + 1.0)

    def _apply_lookup(self, topic: str, result: LookupResult) -> None:
        self._refusals.pop(topic, None)
        self._lookup_errors.pop(topic, None)
        if not self._lookupd.looking_up(topic):
            self._lookup_pending.discard(topic)
        meta = result.meta
        partitions = {pid: p.address for pid, p in result.partitions.items()}
        old = self._routes.get(topic)
        if old is not None and old.partitions and not partitions:
            return  # keep what we know until an answer says something useful
        # no count from lookupd: 0, never the number of partitions listed (one may be missing)
        num = meta.partition_num if meta is not None and meta.partition_num > 0 else 0
        route = _TopicRoute(num, partitions, bool(meta and meta.ordered))
        if old is not None:
            route.next_rr = old.next_rr
        self._routes[topic] = route
        if not partitions and not self._nsqd:
            # standard nsqd behind lookupd: publish to the nsqd it lists
            for producer in result.producers:
                if producer.address not in self._nsqd:
                    self._nsqd.append(producer.address)
                    for slot in range(self.config.pool_size):
                        self._open(producer.address, slot)
        for address in sorted(set(partitions.values())):
            for slot in range(self.config.pool_size):
                self._open(address, slot)
        self._timers.set(
            (TimerKind.LOOKUPD_POLL, topic), self._now + self.config.lookupd_poll_interval
        )

    def _invalidate_route(self, topic: str) -> None:
        self._routes.pop(topic, None)
        if self._lookupd.addresses:
            self._lookup(topic)

    # ------------------------------------------------------------------ closing

    def close(self, now: float) -> None:
        """Close every connection; requests not yet answered fail."""
        self._now = now
        self._closing = True
        self._timers.clear()
        for req in list(self._queue):
            self._fail(req, ConnectionClosedError("producer closed"))
        for rec in list(self._conns.values()):
            rec.conn.close("producer closed")
            self._drain(rec, self._now)
        # what was sent and not answered is put back for a retry by the connection's loss:
        # no retry comes after close, so it fails now (not at publish_timeout)
        for req in list(self._requests.values()):
            self._fail(req, ConnectionClosedError("producer closed"))
        self._timers.clear()

    @property
    def pending(self) -> int:
        """Requests not yet answered (queued or sent)."""
        return len(self._requests)

    def connections(self) -> list[tuple[ConnId, tuple[str, int], str, int]]:
        return [
            (r.conn_id, r.address, r.conn.state.value, len(r.outstanding))
            for r in self._conns.values()
        ]
