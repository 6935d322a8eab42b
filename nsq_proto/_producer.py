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
    NSQError,
    PublishTimeout,
    ServerError,
    fresh_copy,
)
from ._events import (
    ConnectionClosed,
    ConnId,
    PublishesSucceeded,
    PublishFailed,
    PublishSucceeded,
    Ready,
)
from ._lookupd_client import HttpAnswer
from ._names import check_topic
from ._outputs import Connect, Output
from ._partitioned import TOPOLOGY_CHANGED
from ._publish_queue import NO_DPUB, Coalesced, Kind, OpenPool, PublishQueue, Refuse, Request
from ._reachability import Reachability
from ._routes import Routes
from ._state import ConnectionState
from ._timers import TimerKind, Timers
from ._topic_lookups import Routed, TopicLookups

__all__ = ["ProducerConfig", "Producer", "ProducerConnectionInfo", "PublishTimeout"]

#: nsqd's refusals of an MPUB for one of its bodies (or, on the partitioned server, one
#: message's header): a coalesced MPUB refused so is split, each publish sent again alone, so
#: that only the caller whose message is bad gets the error
_SPLIT_ON: Final = frozenset({"E_BAD_MESSAGE", "E_BAD_BODY", "E_INVALID_JSON_HEADER"})

#: the early flush (see Producer._flush_early): publishes waiting behind busy connections go
#: before the flush deadline once at least this many wait...
_EARLY_MIN: Final = 16
#: ...and the producer's latest wait for nsqd was this many times as long as they gathered
_EARLY_QUIET: Final = 4.0
#: ...and they are at least 1 / this of the publishes in flight, and a connection has room for
#: this many more commands after them (at most half its ``max_outstanding``)
_EARLY_SHARE: Final = 4


@dataclass(frozen=True, slots=True)
class ProducerConnectionInfo:
    """One of a :class:`Producer`'s connections, as :meth:`Producer.connections` reports it."""

    #: the connection's id (the one its ``Connect`` carried)
    conn_id: ConnId
    #: the nsqd it goes to, ``(host, port)``
    address: tuple[str, int]
    #: its :class:`ConnectionState`'s value (``"INIT"``, ..., ``"READY"``, ``"CLOSED"``)
    state: str
    #: publishes sent on it that nsqd has not answered yet
    outstanding: int


@dataclass(slots=True)
class _PConn:
    conn_id: ConnId
    conn: Connection
    address: tuple[str, int]
    slot: int
    #: the connection's own publish id (``Connection.publish_encoded``) -> our request, or
    #: the requests a coalesced MPUB carries (in call order)
    outstanding: dict[int, Request | list[Request]] = field(default_factory=dict)
    #: requests assigned to it by the dispatch under way, not yet written
    assigned: int = 0
    #: the TCP connection came up (a loss before it is a failed connection attempt)
    connected: bool = False
    #: a command was charged with the connection's end (see behind_the_cause)
    blamed: bool = False
    #: the request last assigned to it goes alone (see PublishQueue.assign): nothing else
    #: goes on it while that one is unanswered
    alone: bool = False

    def behind_the_cause(self, error: NSQError) -> bool:
        """A command on this connection failed with ``error``: True when another is to blame
        for it.  nsqd reads a connection's commands in order, so when it ends without a word,
        the first unanswered command is the one it ended on; those behind it were perhaps
        never read, and their attempt is not counted (a body that makes nsqd close the
        connection may lose its error frame to the reset, and would otherwise use up its
        neighbours' attempts)."""
        if isinstance(error, ServerError):
            self.blamed = self.blamed or error.fatal  # nsqd named the one it ended on
            return False
        blamed = self.blamed
        self.blamed = True
        return blamed


class _ConnectionPool:
    """The producer's connections as the :class:`Pool` its queue assigns requests to."""

    __slots__ = ("_conns", "limit")

    def __init__(self, conns: dict[ConnId, _PConn], cap: int) -> None:
        self._conns = conns
        #: commands a connection may have unanswered for it to be picked (``max_outstanding``;
        #: 1 while a publish call dispatches: only an idle connection then)
        self.limit = cap

    def pick(self, address: tuple[str, int] | None, alone: bool = False) -> ConnId | None:
        cap = 1 if alone else self.limit
        best: _PConn | None = None
        best_load = 0
        for rec in self._conns.values():
            if address is not None and rec.address != address:
                continue
            load = len(rec.outstanding) + rec.assigned
            if rec.conn.state is not ConnectionState.READY or load >= cap:
                continue
            if rec.alone and load:
                continue  # kept for a request alone
            if best is None or load < best_load:
                best = rec
                best_load = load
        return None if best is None else best.conn_id

    def take(self, conn_id: ConnId, alone: bool = False) -> None:
        rec = self._conns[conn_id]
        rec.assigned += 1
        # (picked: idle, or not kept, so this request says whether it is kept now)
        rec.alone = alone

    def room(self, cap: int) -> bool:
        """Some ready connection has fewer than ``cap`` commands unanswered."""
        return any(
            rec.conn.state is ConnectionState.READY and len(rec.outstanding) < cap
            for rec in self._conns.values()
        )

    def partitioned(self, conn_id: ConnId) -> bool:
        features = self._conns[conn_id].conn.features
        return features is not None and features.partitioned


def encode_request(req: Request, partition: int | None) -> tuple[bytes, bool]:
    """The command of ``req`` (not coalesced) to ``partition``, and whether it is traced."""
    traced = req.trace_ids is not None
    kind = req.kind
    if kind is Kind.DPUB:
        return cmd.dpub(req.topic, round(req.delay * 1000), req.bodies[0]), False
    if req.ext is not None:
        if kind is Kind.PUB:
            return cmd.pub_ext(req.topic, req.bodies[0], req.ext, partition), req.ext_traced
        return cmd.mpub_ext(req.topic, [(req.ext, b) for b in req.bodies], partition), False
    if kind is Kind.PUB:
        if req.trace_ids is not None:
            return cmd.pub_trace(req.topic, req.trace_ids[0], req.bodies[0], partition), True
        return cmd.pub_unchecked(req.topic, req.bodies[0], partition), False
    if req.trace_ids is not None:
        return cmd.mpub_trace(
            req.topic, list(zip(req.trace_ids, req.bodies, strict=True)), partition
        ), True
    return cmd.mpub_unchecked(req.topic, req.bodies, partition), traced


class Producer:
    """Producer core (a :class:`ClientCore`).  ``publish*`` return a request id; the answer
    comes as a :class:`PublishSucceeded` or :class:`PublishFailed` event carrying it.

    Composed of its connection table (ids, routing, the connections' deadlines), its lookupd
    client (the HTTP calls), its topic lookups, its reconnect scheduler, its publish queue,
    routes and failure diagnosis; it owns the pool and carries out their decisions.

    With ``answer_batches``, the answer to a coalesced MPUB (single publishes sent as one
    command) is one :class:`PublishesSucceeded` instead of a :class:`PublishSucceeded` each:
    one event per command, for a client that wakes each caller itself."""

    def __init__(
        self,
        config: ProducerConfig | None = None,
        *,
        nsqd_tcp_addresses: Iterable[str | tuple[str, int]] = (),
        lookupd_http_addresses: Iterable[str | tuple[str, int]] = (),
        rng: random.Random | None = None,
        answer_batches: bool = False,
    ) -> None:
        self.config = cfg = config if config is not None else ProducerConfig()
        self._answer_batches = answer_batches
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
        self._conn_config = cfg.connection_config()
        self._slots: dict[tuple[tuple[str, int], int], ConnId] = {}
        self._queue = PublishQueue(
            max_attempts=cfg.max_publish_attempts,
            max_messages=cfg.max_coalesced_messages,
            max_bytes=cfg.max_coalesced_bytes,
        )
        self._pool = _ConnectionPool(self._conns, cfg.max_outstanding)
        self._routes = Routes(lookupd=bool(lookupd), hasher=cfg.hasher)
        self._lookups = lookups = TopicLookups(
            cfg, self._nsqd, lookupd, self._routes, timers=self._timers, send=self._outputs.append
        )
        #: its lookupd client (the HTTP calls)
        self._lookupd = lookups.client
        self._closing = False
        #: see :attr:`held_back`
        self._held_back = False
        #: when the publishes a call queued behind busy connections are sent (a deadline: the
        #: driver calls handle_timer once it has run what is ready, the other publishers
        #: included, so that they go together); None: nothing to send
        self._flush_at: float | None = None
        #: the longest the producer lately waited for nsqd with nothing else to do: the time
        #: from its latest call to the read that ended the wait, halved at each later read
        #: (see _flush_early)
        self._quiet = 0.0
        self._last_error: NSQError | None = None
        #: how the last connection of each (address, slot) ended: the failure diagnosis
        self._reach = Reachability()

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
                self._lookups.lookup(arg, now)
            # TimerKind.RETRY: a backoff is over; the dispatch below sends it
        for req in self._queue.expired(now):
            lookup_error = self._lookups.error(req.topic)
            if lookup_error is not None:
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
            self._reach.connected((rec.address, rec.slot))
        self._table.connection_made(conn_id, now)

    def tls_established(self, conn_id: ConnId, now: float) -> None:
        self._now = now
        self._table.tls_established(conn_id, now)

    def receive_data(self, conn_id: ConnId, data: bytes, now: float) -> None:
        gap = now - self._now
        quiet = self._quiet * 0.5
        self._quiet = gap if gap > quiet else quiet
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
        step = self._lookups.answer(answer, self._now)
        if isinstance(step, Routed):
            self._nsqd.extend(step.nsqd)
            for address in (*step.nsqd, *step.leaders):
                for slot in range(self.config.pool_size):
                    self._open(address, slot)
            self._dispatch()
        elif step is not None:
            # lookupd refused the topic: its waiting publishes fail with the answer
            for req in [r for r in self._queue.waiting if r.topic == step.topic]:
                self._fail_request(req, fresh_copy(step.error))

    def _drain(self, rec: _PConn, now: float) -> None:
        conn = rec.conn
        out = self._outputs
        while (item := conn.next_output()) is not None:
            # a connection's publish events carry its own publish id: re-emitted with ours
            if type(item) is PublishSucceeded:
                sent = rec.outstanding.pop(item.request_id, None)
                if type(sent) is Request:
                    self._queue.answered(sent)
                    out.append(PublishSucceeded(rec.conn_id, sent.request_id, item.receipt))
                elif isinstance(sent, list):
                    answered = self._queue.answered
                    for req in sent:
                        answered(req)
                    if self._answer_batches:
                        ids = [req.request_id for req in sent]
                        out.append(PublishesSucceeded(rec.conn_id, ids))
                    else:
                        out.extend([PublishSucceeded(rec.conn_id, r.request_id) for r in sent])
            elif type(item) is PublishFailed:
                sent = rec.outstanding.pop(item.request_id, None)
                # (asked even of a command that failed already: it may be the one nsqd ended on)
                behind = rec.behind_the_cause(item.error)
                if sent is not None and behind:
                    for req in sent if isinstance(sent, list) else [sent]:
                        req.attempts -= 1  # behind the command the connection ended on
                if type(sent) is Request:
                    self._failed_on_connection(sent, item.error)
                elif isinstance(sent, list):
                    self._coalesced_failed(sent, item.error)
            elif isinstance(item, Ready):
                out.append(item)
                self._reconnects.connected((rec.address, rec.slot))
                self._reach.ready((rec.address, rec.slot))
            elif isinstance(item, ConnectionClosed):
                out.append(item)
                if item.error is not None:
                    self._last_error = item.error
                self._reach.closed((rec.address, rec.slot), item.error, was_connected=rec.connected)
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

    def extended(self, topic: str) -> bool:
        """lookupd said ``topic`` takes JSON extension headers (``ext=``: an extended topic
        of the partitioned server), once its lookup answered; False before, and without
        lookupd."""
        return self._routes.extended(topic)

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
        if not self._reach.failing:
            return None
        slots = range(self.config.pool_size)
        places = {(a, slot) for a in self._nsqd for slot in slots}
        places.update((a, slot) for a in self._routes.leaders() for slot in slots)
        places.update(self._slots)
        return self._reach.diagnosis(places, set(self._slots))

    def _failed_on_connection(self, req: Request, error: NSQError) -> None:
        """``req`` failed on its connection: retried after a backoff, or failed."""
        if isinstance(error, ServerError):
            if error.code in TOPOLOGY_CHANGED:
                self._lookups.forget(req.topic, self._now)
            self._queue.refused(error)
        retry_at = self._queue.retry(req, error, self._now)
        if retry_at is None:
            self._fail_request(req, error)
        else:
            self._timers.set((TimerKind.RETRY, req.request_id), retry_at)

    def _coalesced_failed(self, reqs: list[Request], error: NSQError) -> None:
        """A coalesced MPUB failed: refused for a body, each of its publishes goes again
        alone; otherwise the failure is each one's (retried or failed as its own)."""
        if isinstance(error, ServerError) and error.code in _SPLIT_ON:
            self._queue.refused(error)
            for req in self._queue.split(reqs, error):
                self._fail_request(req, fresh_copy(error))
            return
        for req in reqs:
            self._failed_on_connection(req, fresh_copy(error))

    def _fail_request(self, req: Request, error: NSQError) -> None:
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
        kind: Kind,
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

    def _queued(self, req: Request) -> int:
        """``req`` was queued: send what can go now (or nothing, when it is held back)."""
        queue = self._queue
        if (
            queue.full
            and len(queue.waiting) > 1
            and not self._lookupd.addresses
            and not self._reach.failing
        ):
            # behind others that wait for a connection with room (FIFO): nothing to do now,
            # unless enough wait to go early
            if len(queue.waiting) < _EARLY_MIN or not self._flush_early(queue):
                self._held_back = True
                return req.request_id
            self._held_back = False
            self._dispatch()
            return req.request_id
        self._held_back = False
        topic = req.topic
        if self._lookupd.addresses and not self._routes.known(topic):
            self._lookups.lookup(topic, self._now)
        # at once on an idle connection (a lone caller waits for nothing); behind a busy one,
        # at the flush, with every publish the other callers make meanwhile (one MPUB)
        pool = self._pool
        cap = pool.limit = 1
        try:
            self._dispatch(flush=False)
        finally:
            cap = pool.limit = self.config.max_outstanding
        if queue.waiting and pool.room(cap):
            if len(queue.waiting) >= _EARLY_MIN and self._flush_early(queue):
                self._dispatch()
            elif self._flush_at is None:
                self._flush_at = self._now
        return req.request_id

    def _flush_early(self, queue: PublishQueue) -> bool:
        """The publishes waiting behind busy connections go now, before the flush deadline
        (the end of the driver's pass over its ready tasks).  On loopback that deadline costs
        nothing; across a network the MPUB would leave only once hundreds of callers had run,
        a delay added to every round trip.  So they go early when the producer's latest wait
        for nsqd, with nothing else to do, was more than 4 times as long as they have been
        gathering (its time goes to waiting, not to work: on loopback it does not), they are
        a command's share of the publishes in flight (a quarter, and at least 16), and a
        connection keeps room for 4 more commands after them (for the next shares; half of
        ``max_outstanding`` when it is under 8)."""
        waiting = queue.waiting
        gathered = self._now - (waiting[0].deadline - self.config.publish_timeout)
        if gathered * _EARLY_QUIET >= self._quiet:
            return False
        cap = self.config.max_outstanding
        share = min(_EARLY_SHARE, cap // 2) or 1
        # a connection keeps room for the next share
        return len(waiting) * share >= len(queue) and self._pool.room(max(1, cap - share))

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
                self._queue.add(topic, Kind.PUB, [body], now + self.config.publish_timeout)
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
        kind = Kind.DPUB if delay is not None else Kind.PUB
        if kind is Kind.DPUB and self._partitioned(topic):
            raise LocalProtocolError(NO_DPUB)
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
            Kind.MPUB,
            items,
            now,
            partition=partition,
            sharding_key=sharding_key,
            trace_ids=traces,
            ext=None if ext is None else cmd.encode_ext_header(ext),
        )

    def _dispatch(self, *, flush: bool = True) -> None:
        """Send what can go now: the queue decides, then every decision is carried out here,
        in order (the only place a publish is written).  ``flush``: up to ``max_outstanding``
        commands per connection (what the flush deadline waits for)."""
        if flush:
            self._flush_at = None
        queue = self._queue
        if not queue.waiting:
            return
        if self._reach.failing:
            broken = self._broken()
            if broken is not None:
                # no retry will get through: fail now, with the cause, not at the deadline
                for req in list(queue.waiting):
                    self._fail_request(req, fresh_copy(broken))
                return
        conns = self._conns
        for step in queue.assign(self._now, self._routes, self._pool):
            if type(step) is Request:
                rec = conns[step.conn_id]
                rec.assigned -= 1
                data, traced = encode_request(step, step.sent_partition)
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

    # ------------------------------------------------------------------ closing

    def close(self, now: float) -> None:
        """Close every connection; requests not yet answered fail."""
        self._now = now
        self._closing = True
        self._lookups.close()
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

    def connections(self) -> list[ProducerConnectionInfo]:
        """Each open connection: its id, nsqd, state and unanswered publishes."""
        return [
            ProducerConnectionInfo(r.conn_id, r.address, r.conn.state.value, len(r.outstanding))
            for r in self._conns.values()
        ]
