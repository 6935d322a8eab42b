"""The producer core: publishing over pooled, pipelined connections to one or more nsqd.

Requests are validated when they are made, queued, and handed to a ready connection with room
(``max_outstanding`` unanswered requests per connection).  Single publishes that wait for the
same topic and route when a connection has room go out together as one MPUB (coalescing, as
Kafka's producer batches what is queued, with no added delay); each caller still gets the
answer of its own message.  nsqd answers in order, so each connection matches responses to
requests FIFO.  A request that fails because its connection
went away is retried on another connection (failover) up to ``max_publish_attempts`` times; one that nsqd
refused with an error frame fails with that :class:`ServerError`, except the partitioned
server's cluster errors, which trigger a new lookup and a retry (as go-nsq does).
"""

from __future__ import annotations

import contextlib
import math
import random
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Final, Protocol

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
from ._lookupd_schedule import RouteRefresh
from ._names import check_topic
from ._outputs import Connect, Output
from ._partitioned import TOPOLOGY_CHANGED, partition_for_key
from ._state import ConnectionState
from ._timers import TimerKind, Timers

__all__ = ["ProducerConfig", "Producer", "PublishTimeout"]

_NO_DPUB: Final = "the partitioned server has no DPUB (deferred publish): publish without a delay"
#: go-nsq's pause before the n-th retry of a publish: 8 ms + 10 ms * 2^n
_RETRY_BASE: Final = 0.008
_RETRY_STEP: Final = 0.010
#: nsqd's refusals of an MPUB for one of its bodies (or, on the partitioned server, one
#: message's header): a coalesced MPUB refused so is split, each publish sent again alone, so
#: that only the caller whose message is bad gets the error
_SPLIT_ON: Final = frozenset({"E_BAD_MESSAGE", "E_BAD_BODY", "E_INVALID_JSON_HEADER"})


class _Kind(Enum):
    """What a publish sends (the form on the wire also depends on its partition, trace ids
    and extension header)."""

    # members are singletons: identity hashing is exact and much cheaper than Enum's
    __hash__ = object.__hash__

    PUB = "PUB"
    MPUB = "MPUB"
    DPUB = "DPUB"


@dataclass(slots=True)
class _Request:
    request_id: int
    topic: str
    kind: _Kind
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
    #: the connection it was last assigned to (0: never)
    conn_id: ConnId = 0
    #: the partition it was last assigned to (None: the server's choice)
    sent_partition: int | None = None
    #: not sent again before this time (the retry backoff)
    not_before: float = 0.0
    #: the ordered partition ``(topic, partition)`` it was sent to, while unanswered
    stream: tuple[str, int] | None = None
    #: (partition count, partition) its sharding key was mapped to
    hashed: tuple[int, int] | None = None
    #: never coalesced with others (a coalesced MPUB carrying it was refused for a body)
    alone: bool = False


@dataclass(slots=True)
class _PConn:
    conn_id: ConnId
    conn: Connection
    address: tuple[str, int]
    slot: int
    #: the connection's own publish id (``Connection.publish_encoded``) -> our request, or
    #: the requests a coalesced MPUB carries (in call order)
    outstanding: dict[int, _Request | list[_Request]] = field(default_factory=dict)
    #: requests assigned to it by the dispatch under way, not yet written
    assigned: int = 0
    #: the TCP connection came up (a loss before it is a failed connection attempt)
    connected: bool = False


# ------------------------------------------------------------------------------ routing


@dataclass(slots=True)
class _TopicRoute:
    partition_num: int
    partitions: dict[int, tuple[str, int]]
    ordered: bool
    next_rr: int = 0


class Routes:
    """Where each topic's publishes go: routing and sharding.

    Without lookupd every publish goes to any connection of the pool.  With lookupd, a topic
    is routed once its lookup answered: a standard server's topic to any connection, a
    partitioned topic to the leader of a partition (the publish's own, its sharding key's, or
    the next one round-robin).  It knows no connection: it names addresses and partitions."""

    __slots__ = ("_hasher", "_lookupd", "routes")

    def __init__(self, *, lookupd: bool, hasher: Callable[[bytes], int] | None) -> None:
        self._lookupd = lookupd
        self._hasher = hasher
        #: topic -> its route, once a lookup answered
        self.routes: dict[str, _TopicRoute] = {}

    def known(self, topic: str) -> bool:
        return topic in self.routes

    def partitioned(self, topic: str) -> bool:
        """lookupd named partitions for ``topic``."""
        route = self.routes.get(topic)
        return route is not None and bool(route.partitions)

    def wanted(self, address: tuple[str, int]) -> bool:
        """Some topic's partition is led from ``address``."""
        return any(address in r.partitions.values() for r in self.routes.values())

    def leaders(self) -> list[tuple[str, int]]:
        """The address of every partition leader known (with repeats)."""
        return [a for route in self.routes.values() for a in route.partitions.values()]

    def apply(self, topic: str, result: LookupResult) -> list[tuple[str, int]] | None:
        """A lookup of ``topic`` answered: the partition leaders to connect to, sorted (empty
        for a standard server); None when the answer is kept out (it lists no partition where
        a route with partitions is known: what is known stays until a useful answer)."""
        meta = result.meta
        partitions = {pid: p.address for pid, p in result.partitions.items()}
        old = self.routes.get(topic)
        if old is not None and old.partitions and not partitions:
            return None
        # no count from lookupd: 0, never the number of partitions listed (one may be missing)
        num = meta.partition_num if meta is not None and meta.partition_num > 0 else 0
        route = _TopicRoute(num, partitions, bool(meta and meta.ordered))
        if old is not None:
            route.next_rr = old.next_rr
        self.routes[topic] = route
        return sorted(set(partitions.values()))

    def forget(self, topic: str) -> None:
        """The topology changed (a partitioned server's error): look ``topic`` up again."""
        self.routes.pop(topic, None)

    def route(self, req: _Request) -> tuple[tuple[str, int] | None, int | None] | None:
        """Where a request goes: (address or None for any, partition); None: not yet known.
        Raises LocalProtocolError where it can go nowhere."""
        if not self._lookupd:
            return None, req.partition
        route = self.routes.get(req.topic)
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
                cached = req.hashed = (num, partition_for_key(req.sharding_key, num, self._hasher))
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

    def stream(self, req: _Request, partition: int | None) -> tuple[str, int] | None:
        """The ordered partition ``req`` belongs to: a publish with a sharding key, or to a
        partition of an ordered topic; None where call order is not promised."""
        if partition is None:
            return None
        if req.sharding_key is None and req.partition is None:
            return None
        if req.sharding_key is None:
            route = self.routes.get(req.topic)
            if route is None or not route.ordered:
                return None
        return (req.topic, partition)


# ------------------------------------------------------------------------------ the queue


class Pool(Protocol):
    """The connections a :class:`PublishQueue` assigns requests to, by id."""

    def pick(self, address: tuple[str, int] | None) -> ConnId | None:
        """The least loaded ready connection with room (to ``address``; None: any), counting
        what this dispatch assigned already; None when there is none."""
        ...

    def take(self, conn_id: ConnId) -> None:
        """One more request is assigned to ``conn_id`` in this dispatch."""
        ...

    def partitioned(self, conn_id: ConnId) -> bool:
        """The connection is to the partitioned server."""
        ...


@dataclass(frozen=True, slots=True)
class Refuse:
    """Dispatch: fail ``request`` with ``error`` (it can go nowhere)."""

    request: _Request
    error: NSQError


@dataclass(frozen=True, slots=True)
class Coalesced:
    """Dispatch: write ``requests`` (single publishes of one topic to one route, in call
    order) as one MPUB on ``requests[0].conn_id``, to ``requests[0].sent_partition``."""

    requests: list[_Request]


@dataclass(frozen=True, slots=True)
class OpenPool:
    """Dispatch: open the pool's connections to ``address`` (a partition's leader)."""

    address: tuple[str, int]


#: what one dispatch decided, in order: a request (assigned: write it on ``request.conn_id``,
#: to ``request.sent_partition``), requests coalesced into one MPUB, a request to refuse, or
#: a pool to open
Step = _Request | Coalesced | Refuse | OpenPool


def _coalescable(req: _Request) -> bool:
    """A single publish that may share an MPUB: PUB or PUB_EXT, with no trace receipt to give
    back (MPUB_TRACE answers with the first message's alone) and not sent alone."""
    return req.kind is _Kind.PUB and req.trace_ids is None and not req.ext_traced and not req.alone


def _mpub_size(req: _Request) -> int:
    """What a single publish adds to an MPUB's body: its length prefix, its header, its body."""
    ext = req.ext
    return 4 + len(req.bodies[0]) + (0 if ext is None else 2 + len(ext))


class PublishQueue:
    """The producer's requests, from ``publish`` to their answer: request ids and deadlines,
    the queue in call order, the retries and their backoff, and the ordered partitions with a
    request on the wire.

    :meth:`assign` decides where queued requests go and returns its decisions; the producer
    carries them out (encodes and writes, fails, opens connections), as httpcore's pool
    assigns requests to connections and leaves the I/O to its caller."""

    __slots__ = (
        "_last_deadline",
        "_max_attempts",
        "_max_bytes",
        "_max_messages",
        "_next_id",
        "full",
        "requests",
        "streams",
        "waiting",
    )

    def __init__(
        self, *, max_attempts: int, max_messages: int = 1, max_bytes: int = 5 * 1024 * 1024
    ) -> None:
        self._max_attempts = max_attempts
        #: the bounds of a coalesced MPUB (1 message: no coalescing)
        self._max_messages = max_messages
        self._max_bytes = max_bytes
        #: queued requests, in call order (a retry goes back to its place)
        self.waiting: deque[_Request] = deque()
        #: requests not yet answered, oldest first (so by deadline: see add)
        self.requests: dict[int, _Request] = {}
        #: ordered partitions with a request on the wire: (topic, partition) -> request id
        self.streams: dict[tuple[str, int], int] = {}
        self._last_deadline = -math.inf
        self._next_id = 1
        #: the latest :meth:`assign` left a request for any connection waiting for room, and
        #: nothing but :meth:`add` changed the queue since: a request added now waits too
        self.full = False

    def __len__(self) -> int:
        """Requests not yet answered (queued or sent)."""
        return len(self.requests)

    def add(
        self,
        topic: str,
        kind: _Kind,
        bodies: list[bytes],
        deadline: float,
        *,
        partition: int | None = None,
        sharding_key: bytes | None = None,
        trace_ids: list[int] | None = None,
        delay: float = 0.0,
        ext: bytes | None = None,
        ext_traced: bool = False,
    ) -> _Request:
        """A new request, queued; it expires at ``deadline``, or with the one before it."""
        rid = self._next_id
        self._next_id += 1
        # deadlines never decrease in the order requests are made (under a clock that goes
        # back, one waits for the one before it): the first request is the next to expire
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
        self.requests[rid] = req
        self.waiting.append(req)
        return req

    def next_deadline(self) -> float | None:
        """When the oldest request expires (no scan of every request)."""
        if not self.requests:
            return None
        return next(iter(self.requests.values())).deadline

    def expired(self, now: float) -> list[_Request]:
        """The requests whose deadline is past at ``now``, oldest first."""
        expired: list[_Request] = []
        for req in self.requests.values():
            if req.deadline > now:
                break  # the rest expire later (see add)
            expired.append(req)
        return expired

    def answered(self, req: _Request) -> None:
        """nsqd acknowledged ``req``."""
        self.full = False
        if req.stream is not None:
            self._release(req)
        self.requests.pop(req.request_id, None)

    def remove(self, req: _Request) -> None:
        """``req`` fails: it is no longer waiting, sent or retried."""
        self.full = False
        self._release(req)
        self.requests.pop(req.request_id, None)
        with contextlib.suppress(ValueError):
            self.waiting.remove(req)

    def retry(self, req: _Request, error: NSQError, now: float) -> float | None:
        """``req`` failed on its connection with ``error``: the time it may be sent again
        (queued again in call order, after go-nsq's backoff of 8 ms + 10 ms * 2^n), or None
        when it fails (nsqd refused it, its attempts are spent, or its deadline passed).  A
        loss of the connection is retried, and so are the partitioned server's errors that
        say the topology changed."""
        self._release(req)
        retryable = not isinstance(error, ServerError) or error.code in TOPOLOGY_CHANGED
        if not (retryable and req.attempts < self._max_attempts and req.deadline > now):
            return None
        req.not_before = now + _RETRY_BASE + _RETRY_STEP * (1 << req.attempts)
        self._requeue(req)
        return req.not_before

    def split(self, reqs: list[_Request]) -> None:
        """A coalesced MPUB carrying ``reqs`` was refused for one of its bodies: each goes
        again alone and at once, the attempt not counted (a neighbour's body failed it)."""
        for req in reqs:
            self._release(req)
            req.attempts -= 1
            req.alone = True
            req.not_before = 0.0
            self._requeue(req)

    def _requeue(self, req: _Request) -> None:
        """``req`` waits again, in its place in call order."""
        self.full = False
        waiting = self.waiting
        rid = req.request_id
        index = len(waiting)
        while index and waiting[index - 1].request_id > rid:
            index -= 1
        waiting.insert(index, req)

    def _release(self, req: _Request) -> None:
        stream = req.stream
        if stream is not None:
            req.stream = None
            if self.streams.get(stream) == req.request_id:
                del self.streams[stream]

    def assign(self, now: float, routes: Routes, pool: Pool) -> list[Step]:
        """Decide where the queued requests go now, in call order: each one that can go is
        assigned to a connection of ``pool`` (its attempt counted) and taken off the queue;
        the others stay queued, in order.  A request waits while its route is unknown, while
        its retry backs off, while an earlier request of its ordered partition is on the wire
        or waiting, and while no connection has room (a request for any connection then holds
        back every later one: FIFO).  Returns the decisions, in order."""
        waiting = self.waiting
        streams = self.streams
        self.full = False
        steps: list[Step] = []
        #: ordered partitions whose earliest queued request cannot go now: later ones wait
        blocked: set[tuple[str, int]] = set()
        skipped: list[_Request] = []
        while waiting:
            req = waiting.popleft()
            try:
                routed = routes.route(req)
            except LocalProtocolError as exc:
                steps.append(Refuse(req, exc))
                continue
            if routed is None:
                skipped.append(req)
                continue
            address, partition = routed
            stream = routes.stream(req, partition)
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
            conn_id = pool.pick(address)
            if conn_id is None:
                if address is not None:
                    steps.append(OpenPool(address))
                skipped.append(req)
                if stream is not None:
                    blocked.add(stream)
                if address is None:
                    self.full = True
                    break  # every connection is busy: keep FIFO order
                continue
            if req.kind is _Kind.DPUB and pool.partitioned(conn_id):
                steps.append(Refuse(req, LocalProtocolError(_NO_DPUB)))
                continue
            pool.take(conn_id)
            members = None
            if waiting and self._max_messages > 1 and _coalescable(req):
                members = self._join(req, address, partition, stream, now, routes)
            if members is None:
                req.attempts += 1
                req.conn_id = conn_id
                req.sent_partition = partition
                if stream is not None:
                    req.stream = stream
                    streams[stream] = req.request_id
                steps.append(req)
                continue
            for member in members:
                member.attempts += 1
                member.conn_id = conn_id
                member.sent_partition = partition
                member.stream = stream
            if stream is not None:
                # held by the last: the members expire in call order, so the partition is
                # free again only once none of them is on the wire
                streams[stream] = members[-1].request_id
            steps.append(Coalesced(members))
        waiting.extendleft(reversed(skipped))
        return steps

    def _join(
        self,
        head: _Request,
        address: tuple[str, int] | None,
        partition: int | None,
        stream: tuple[str, int] | None,
        now: float,
        routes: Routes,
    ) -> list[_Request] | None:
        """The single publishes queued after ``head`` that go with it as one MPUB (taken off
        the queue), ``head`` first; None when none can.  They are of its topic and go where it
        goes; an ordered partition's take no publish past one of theirs that cannot join."""
        max_messages = self._max_messages
        max_bytes = self._max_bytes
        size = 4 + _mpub_size(head)
        if size > max_bytes:
            return None
        waiting = self.waiting
        topic = head.topic
        has_ext = head.ext is not None
        members = [head]
        kept: list[_Request] = []
        while waiting and len(members) < max_messages:
            cand = waiting.popleft()
            if cand.topic != topic:
                kept.append(cand)
                continue
            joins = (
                cand.kind is _Kind.PUB
                and cand.trace_ids is None
                and not cand.ext_traced
                and not cand.alone
                and (cand.ext is not None) is has_ext
                and cand.not_before <= now
            )
            if joins and (cand.sharding_key is not None or cand.partition is not None):
                try:
                    routed = routes.route(cand)
                except LocalProtocolError:
                    routed = None  # refused by the dispatch, in its turn
                joins = routed == (address, partition) and routes.stream(cand, partition) == stream
            # (a publish to any partition goes to this one)
            if not joins:
                kept.append(cand)
                if stream is not None:
                    break  # it may be of the ordered partition: nothing overtakes it
                continue
            ext = cand.ext
            added = 4 + len(cand.bodies[0]) + (0 if ext is None else 2 + len(ext))
            if size + added > max_bytes:
                kept.append(cand)
                break
            size += added
            members.append(cand)
        waiting.extendleft(reversed(kept))
        return members if len(members) > 1 else None


class _ConnectionPool:
    """The producer's connections as the :class:`Pool` its queue assigns requests to."""

    __slots__ = ("_conns", "limit")

    def __init__(self, conns: dict[ConnId, _PConn], cap: int) -> None:
        self._conns = conns
        #: commands a connection may have unanswered for it to be picked (``max_outstanding``;
        #: 1 while a publish call dispatches: only an idle connection then)
        self.limit = cap

    def pick(self, address: tuple[str, int] | None) -> ConnId | None:
        cap = self.limit
        best: _PConn | None = None
        best_load = 0
        for rec in self._conns.values():
            if address is not None and rec.address != address:
                continue
            load = len(rec.outstanding) + rec.assigned
            if rec.conn.state is not ConnectionState.READY or load >= cap:
                continue
            if best is None or load < best_load:
                best = rec
                best_load = load
        return None if best is None else best.conn_id

    def take(self, conn_id: ConnId) -> None:
        self._conns[conn_id].assigned += 1

    def room(self, cap: int) -> bool:
        """Some ready connection has fewer than ``cap`` commands unanswered."""
        return any(
            rec.conn.state is ConnectionState.READY and len(rec.outstanding) < cap
            for rec in self._conns.values()
        )

    def partitioned(self, conn_id: ConnId) -> bool:
        features = self._conns[conn_id].conn.features
        return features is not None and features.partitioned


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
        self._refresh = RouteRefresh(self._timers, interval=cfg.lookupd_poll_interval)
        self._conn_config = cfg.connection_config()
        self._slots: dict[tuple[tuple[str, int], int], ConnId] = {}
        self._queue = PublishQueue(
            max_attempts=cfg.max_publish_attempts,
            max_messages=cfg.max_coalesced_messages,
            max_bytes=cfg.max_coalesced_bytes,
        )
        self._pool = _ConnectionPool(self._conns, cfg.max_outstanding)
        self._routes = Routes(lookupd=bool(lookupd), hasher=cfg.hasher)
        self._lookup_pending: set[str] = set()
        self._closing = False
        #: see :attr:`held_back`
        self._held_back = False
        #: when the publishes a call queued behind busy connections are sent (a deadline: the
        #: driver calls handle_timer once it has run what is ready, the other publishers
        #: included, so that they go together); None: nothing to send
        self._flush_at: float | None = None
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
        first = self._queue.next_deadline()
        if first is not None and (deadline is None or first < deadline):
            deadline = first
        flush = self._flush_at
        if flush is not None and (deadline is None or flush < deadline):
            deadline = flush
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
        for req in self._queue.expired(now):
            lookup_error = self._lookup_errors.get(req.topic)
            if lookup_error is not None and not self._routes.known(req.topic):
                why = f" (no route: {lookup_error})"
            elif self._last_error:
                why = f" (last connection error: {self._last_error})"
            else:
                why = ""
            self._fail_request(
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
            # a connection's publish events carry its own publish id: re-emitted with ours
            if type(item) is PublishSucceeded:
                sent = rec.outstanding.pop(item.request_id, None)
                if type(sent) is _Request:
                    self._queue.answered(sent)
                    out.append(PublishSucceeded(rec.conn_id, sent.request_id, item.receipt))
                elif isinstance(sent, list):
                    answered = self._queue.answered
                    for req in sent:
                        answered(req)
                        out.append(PublishSucceeded(rec.conn_id, req.request_id))
            elif type(item) is PublishFailed:
                sent = rec.outstanding.pop(item.request_id, None)
                if type(sent) is _Request:
                    self._failed_on_connection(sent, item.error)
                elif isinstance(sent, list):
                    self._coalesced_failed(sent, item.error)
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
        for sent in list(rec.outstanding.values()):
            for req in list(sent) if isinstance(sent, list) else [sent]:
                self._failed_on_connection(req, ConnectionClosedError("connection closed"))
        rec.outstanding.clear()
        if self._closing:
            return
        if rec.address in self._nsqd or self._routes.wanted(rec.address):
            target = (rec.address, rec.slot)
            self._timers.set((TimerKind.RECONNECT, target), now + self._reconnects.delay(target))

    def _partitioned(self, topic: str) -> bool:
        """Known to be served by the partitioned server (its lookup, or a connection)."""
        if self._routes.partitioned(topic):
            return True
        pool = self._pool
        return any(pool.partitioned(conn_id) for conn_id in self._conns)

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
        keys.update((a, slot) for a in self._routes.leaders() for slot in slots)
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
        """``req`` failed on its connection: retried after a backoff, or failed."""
        if isinstance(error, ServerError) and error.code in TOPOLOGY_CHANGED:
            self._invalidate_route(req.topic)
        retry_at = self._queue.retry(req, error, self._now)
        if retry_at is None:
            self._fail_request(req, error)
        else:
            self._timers.set((TimerKind.RETRY, req.request_id), retry_at)

    def _coalesced_failed(self, reqs: list[_Request], error: NSQError) -> None:
        """A coalesced MPUB failed: refused for a body, each of its publishes goes again
        alone; otherwise the failure is each one's (retried or failed as its own)."""
        if isinstance(error, ServerError) and error.code in _SPLIT_ON:
            self._queue.split(reqs)
            return
        for req in reqs:
            self._failed_on_connection(req, fresh_copy(error))

    def _fail_request(self, req: _Request, error: NSQError) -> None:
        """``req`` fails with ``error`` (a :class:`PublishFailed` event)."""
        self._queue.remove(req)
        self._timers.cancel((TimerKind.RETRY, req.request_id))
        for rec in self._conns.values():
            for rid, sent in list(rec.outstanding.items()):
                # a late answer is then ignored
                if sent is req:
                    del rec.outstanding[rid]
                elif type(sent) is list:
                    for index, member in enumerate(sent):
                        if member is req:
                            del sent[index]
                            break
                    if not sent:
                        del rec.outstanding[rid]
        self._outputs.append(PublishFailed(req.conn_id, req.request_id, error))

    # ------------------------------------------------------------------ publishing

    def _new_request(
        self,
        topic: str,
        kind: _Kind,
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
        req = self._queue.add(
            topic,
            kind,
            bodies,
            now + self.config.publish_timeout,
            partition=partition,
            sharding_key=sharding_key,
            trace_ids=trace_ids,
            delay=delay,
            ext=ext,
            ext_traced=ext_traced,
        )
        return self._queued(req)

    def _queued(self, req: _Request) -> int:
        """``req`` was queued: send what can go now (or nothing, when it is held back)."""
        queue = self._queue
        if (
            queue.full
            and len(queue.waiting) > 1
            and not self._lookupd.addresses
            and not self._permanent
            and not self._unreachable
        ):
            # behind others that wait for a connection with room (FIFO): nothing to do now
            self._held_back = True
            return req.request_id
        self._held_back = False
        topic = req.topic
        if self._lookupd.addresses and not self._routes.known(topic):
            self._lookup(topic)
        # at once on an idle connection (a lone caller waits for nothing); behind a busy one,
        # at the flush, with every publish the other callers make meanwhile (one MPUB)
        pool = self._pool
        cap = pool.limit = 1
        try:
            self._dispatch(flush=False)
        finally:
            cap = pool.limit = self.config.max_outstanding
        if queue.waiting and self._flush_at is None and pool.room(cap):
            self._flush_at = self._now
        return req.request_id

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
        if (
            type(body) is bytes
            and body
            and partition is None
            and sharding_key is None
            and trace_id is None
            and delay is None
            and ext is None
            and not self._closing
        ):
            # the everyday publish: checked here, queued at once
            self._now = now
            check_topic(topic)
            return self._queued(
                self._queue.add(topic, _Kind.PUB, [body], now + self.config.publish_timeout)
            )
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
        kind = _Kind.DPUB if delay is not None else _Kind.PUB
        if kind is _Kind.DPUB and self._partitioned(topic):
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
            _Kind.MPUB,
            items,
            now,
            partition=partition,
            sharding_key=sharding_key,
            trace_ids=traces,
            ext=None if ext is None else cmd.encode_ext_header(ext),
        )

    def _encode(self, req: _Request, partition: int | None) -> tuple[bytes, bool]:
        traced = req.trace_ids is not None
        kind = req.kind
        if kind is _Kind.DPUB:
            return cmd.dpub(req.topic, round(req.delay * 1000), req.bodies[0]), False
        if req.ext is not None:
            if kind is _Kind.PUB:
                return cmd.pub_ext(req.topic, req.bodies[0], req.ext, partition), req.ext_traced
            return cmd.mpub_ext(req.topic, [(req.ext, b) for b in req.bodies], partition), False
        if kind is _Kind.PUB:
            if req.trace_ids is not None:
                return cmd.pub_trace(req.topic, req.trace_ids[0], req.bodies[0], partition), True
            return cmd.pub_unchecked(req.topic, req.bodies[0], partition), False
        if req.trace_ids is not None:
            return cmd.mpub_trace(
                req.topic, list(zip(req.trace_ids, req.bodies, strict=True)), partition
            ), True
        return cmd.mpub_unchecked(req.topic, req.bodies, partition), traced

    def _dispatch(self, *, flush: bool = True) -> None:
        """Send what can go now: the queue decides, then every decision is carried out here,
        in order (the only place a publish is written).  ``flush``: up to ``max_outstanding``
        commands per connection (what the flush deadline waits for)."""
        if flush:
            self._flush_at = None
        queue = self._queue
        if not queue.waiting:
            return
        if self._permanent or self._unreachable:
            broken = self._broken()
            if broken is not None:
                # no retry will get through: fail now, with the cause, not at the deadline
                for req in list(queue.waiting):
                    self._fail_request(req, fresh_copy(broken))
                return
        conns = self._conns
        for step in queue.assign(self._now, self._routes, self._pool):
            if type(step) is _Request:
                rec = conns[step.conn_id]
                rec.assigned -= 1
                data, traced = self._encode(step, step.sent_partition)
                rec.outstanding[rec.conn.publish_encoded(data, traced=traced)] = step
            elif type(step) is Coalesced:
                reqs = step.requests
                head = reqs[0]
                rec = conns[head.conn_id]
                rec.assigned -= 1
                if head.ext is None:
                    data = cmd.mpub_unchecked(
                        head.topic, [r.bodies[0] for r in reqs], head.sent_partition
                    )
                else:
                    data = cmd.mpub_ext(
                        head.topic, [(r.ext or b"", r.bodies[0]) for r in reqs], head.sent_partition
                    )
                rec.outstanding[rec.conn.publish_encoded(data)] = reqs
            elif isinstance(step, Refuse):
                self._fail_request(step.request, step.error)
            elif isinstance(step, OpenPool):
                for slot in range(self.config.pool_size):
                    self._open(step.address, slot)

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
            if self._refusals.get(topic, 0) >= 2 and not self._routes.known(topic):
                # lookupd said no twice (e.g. "Topic has no channel, should init at least one
                # for the new topic"): the waiting publishes fail now, with its answer
                for req in [r for r in self._queue.waiting if r.topic == topic]:
                    failure = LookupdError(f"no route to topic {topic!r}: {error}")
                    failure.__cause__ = error
                    self._fail_request(req, failure)
                self._refusals.pop(topic, None)
            # try again a little later; other waiting requests time out on their deadline
            self._refresh.failed(topic, self._now)

    def _apply_lookup(self, topic: str, result: LookupResult) -> None:
        self._refusals.pop(topic, None)
        self._lookup_errors.pop(topic, None)
        if not self._lookupd.looking_up(topic):
            self._lookup_pending.discard(topic)
        leaders = self._routes.apply(topic, result)
        if leaders is None:
            return  # keep what we know until an answer says something useful
        if not leaders and not self._nsqd:
            # standard nsqd behind lookupd: publish to the nsqd it lists
            for peer in result.producers:
                if peer.address not in self._nsqd:
                    self._nsqd.append(peer.address)
                    for slot in range(self.config.pool_size):
                        self._open(peer.address, slot)
        for address in leaders:
            for slot in range(self.config.pool_size):
                self._open(address, slot)
        self._refresh.answered(topic, self._now)

    def _invalidate_route(self, topic: str) -> None:
        self._routes.forget(topic)
        if self._lookupd.addresses:
            self._lookup(topic)

    # ------------------------------------------------------------------ closing

    def close(self, now: float) -> None:
        """Close every connection; requests not yet answered fail."""
        self._now = now
        self._closing = True
        self._flush_at = None
        self._timers.clear()
        for req in list(self._queue.waiting):
            self._fail_request(req, ConnectionClosedError("producer closed"))
        for rec in list(self._conns.values()):
            rec.conn.close("producer closed")
            self._drain(rec, self._now)
        # what was sent and not answered is put back for a retry by the connection's loss:
        # no retry comes after close, so it fails now (not at publish_timeout)
        for req in list(self._queue.requests.values()):
            self._fail_request(req, ConnectionClosedError("producer closed"))
        self._timers.clear()

    @property
    def pending(self) -> int:
        """Requests not yet answered (queued or sent)."""
        return len(self._queue)

    @property
    def held_back(self) -> bool:
        """The latest ``publish*`` call only queued its request behind others that wait for a
        connection with room: it produced no output and moved no deadline, so a driver has
        nothing to carry out for it (it goes with them, when an answer makes room)."""
        return self._held_back

    def connections(self) -> list[tuple[ConnId, tuple[str, int], str, int]]:
        return [
            (r.conn_id, r.address, r.conn.state.value, len(r.outstanding))
            for r in self._conns.values()
        ]
