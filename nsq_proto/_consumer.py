"""The consumer core: every connection of one topic/channel subscription, without I/O.

It owns the connections (one :class:`Connection` each) and ``max_attempts``, and wires its
parts, each keeping its own books: which nsqd to connect to (:class:`~._discovery.Discovery`:
the fixed list, lookups, reconnects and rechecks), RDY and backoff
(:class:`~._rdy.RdyPlanner`, whose RDY decisions the consumer writes), each connection's
in-flight book (:class:`~._in_flight.InFlight`, which also groups the bulk answers) and, on
ordered connections, its repeats (:class:`~._ordered.OrderedRepeats`), the partitions' start
positions (:class:`~._start_positions.StartPositions`), the graceful stop
(:class:`~._stopping.StopProcedure`) and its own life (:class:`~._lifecycle.Lifecycle`).
Like the connection it is driven by transport events, application calls and timers, each taking
``now``, and it speaks through one ordered output queue.

Where go-nsq refines the client guide, this core does what go-nsq does; those places say so.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ._config import ConfigError, ConsumerConfig, parse_client_addresses
from ._connection import Connection
from ._core import ConnectionTable, ReconnectScheduler, parse_address
from ._discovery import Discovery
from ._events import (
    CloseWaitReceived,
    ConnectionClosed,
    ConnId,
    ErrorReceived,
    MessagesReceived,
    Ready,
    Stopped,
)
from ._features import DEFAULT_MAX_RDY_COUNT
from ._in_flight import (
    Answer,
    Bulk,
    InFlight,
    newest_many,
    not_in_flight,
    take_delivered,
    take_many,
)
from ._intake import Intake
from ._lifecycle import (
    NEW,
    REQUEUEING,
    RUNNING,
    STOPPED,
    STOPPING,
    after_all_closed,
    after_start,
    after_stop,
    is_stopping,
)
from ._message import Message
from ._names import check_channel, check_topic
from ._ordered import OrderedRepeats, Repeat
from ._outputs import Connect, Output
from ._rdy import ConnRdy, RdyPlanner
from ._state import CAN_RDY
from ._stopping import REQUEUE_GRACE, Step, StopProcedure, closes_now, left_to_answer
from ._timers import TimerKind, Timers

__all__ = ["REQUEUE_GRACE", "ConsumerConfig", "Consumer", "ConnectionStats", "parse_address"]


@dataclass(slots=True)
class _Conn:
    conn_id: ConnId
    conn: Connection
    key: str
    address: tuple[str, int]
    partition: int | None
    ordered: bool
    #: what the application holds of this connection (the book changes it)
    in_flight: InFlight
    #: ordered connections: the server's repeats (None on the others)
    repeats: OrderedRepeats | None
    #: the RdyPlanner's record of this connection once it subscribed: the handle its
    #: per-message inputs take (the planner owns it; the consumer only passes it on)
    planned: ConnRdy | None = None
    ready_at: float | None = None

    def take(self, msg_id: bytes, attempts: int | None) -> tuple[Message, bool]:
        """An answer (FIN or REQ): one delivery of ``msg_id`` off the book, and the repeats
        part told; the newest delivery, and whether the answer is an older (stale) copy's."""
        message, stale = self.in_flight.take(msg_id, attempts)
        if self.repeats is not None:
            self.repeats.answered(msg_id, message.attempts)
        return message, stale

    def repeat(self, held: Message | None, message: Message) -> bool:
        """Whether a delivery on this ordered connection is the server's repeat (not passed
        on); the FIN its repeats part decides on is sent."""
        assert self.repeats is not None  # (every ordered connection has its repeats)
        repeat = self.repeats.delivered(held, message)
        if repeat is Repeat.NONE:
            return False
        if repeat is Repeat.FIN:
            self.conn.finish(message.id)
        return True

    def stats(self, rdy: RdyPlanner) -> ConnectionStats:
        """A snapshot of this connection; ``rdy``: the planner, which keeps its RDY."""
        conn_id = self.conn_id
        return ConnectionStats(
            conn_id,
            self.key,
            self.conn.state.value,
            rdy.rdy(conn_id),
            len(self.in_flight.held),
            rdy.last_message_at(conn_id),
            self.address,
            self.partition,
        )


@dataclass(frozen=True, slots=True)
class ConnectionStats:
    """One connection of a consumer, as it stood when asked: its state (a
    :class:`ConnectionState` value), its RDY, the messages the application holds of it, when
    its latest message arrived (``now`` of that call; 0.0 before any), the nsqd it is to and
    the partition it consumes (None outside a partitioned topic)."""

    conn_id: ConnId
    key: str
    state: str
    rdy: int
    in_flight: int
    last_message_at: float
    address: tuple[str, int] = ("", 0)
    partition: int | None = None


class Consumer:
    """Consumer core of one ``topic``/``channel`` subscription (a :class:`ClientCore`).

    Composed of its connection table (ids, routing, the connections' deadlines), its
    discovery (targets, reconnects, lookupd's calls and polls, start positions), its RDY
    planner (RDY and backoff), its stop procedure and, per connection, an in-flight book and
    (ordered) a repeats part; it owns ``max_attempts``, and carries out their decisions.

    Each message the application gets is a :class:`MessageReceived`; with
    ``message_batches``, the messages of one read of a connection are one
    :class:`MessagesReceived` instead (in the order nsqd sent them), for a client that hands
    them on together: one event, and one RDY decision, per read.  The messages are of
    ``message_class``: :class:`Message`, or a client's subclass of it."""

    def __init__(
        self,
        topic: str,
        channel: str,
        config: ConsumerConfig | None = None,
        *,
        nsqd_tcp_addresses: Iterable[str | tuple[str, int]] = (),
        lookupd_http_addresses: Iterable[str | tuple[str, int]] = (),
        rng: random.Random | None = None,
        message_batches: bool = False,
        message_class: type[Message] = Message,
    ) -> None:
        self.topic = check_topic(topic)
        self.channel = check_channel(channel)
        self.config = cfg = config if config is not None else ConsumerConfig()
        #: the fixed nsqd list
        self._nsqd, lookupd = parse_client_addresses(nsqd_tcp_addresses, lookupd_http_addresses)
        self._rng = rng if rng is not None else random.Random()
        self._outputs: deque[Output] = deque()
        self._timers = Timers()
        self._table: ConnectionTable[_Conn] = ConnectionTable(self._drain)
        #: the table's records (the table adds and removes them)
        self._conns = self._table.by_id
        #: the time given with the latest call (for work done on behalf of no call: draining)
        self._now = 0.0
        self._life = NEW
        self._reconnects = ReconnectScheduler(
            self._rng, cfg.reconnect_delay, cfg.max_reconnect_delay, cfg.reconnect_jitter
        )
        self._discovery = Discovery(
            self.topic,
            self.channel,
            cfg,
            self._nsqd,
            lookupd,
            rng=self._rng,
            timers=self._timers,
            reconnects=self._reconnects,
            connect=self._connect,
            send=self._outputs.append,
        )
        self._stop = StopProcedure(self._timers, cfg.stop_timeout)
        self._rdy = RdyPlanner(
            self._rng,
            send_rdy=self._send_rdy,
            on_event=self._outputs.append,
            max_in_flight=cfg.max_in_flight,
            backoff=cfg.backoff,
            backoff_multiplier=cfg.backoff_multiplier,
            max_backoff_duration=cfg.max_backoff_duration,
            low_rdy_idle_timeout=cfg.low_rdy_idle_timeout,
            low_rdy_timeout=cfg.low_rdy_timeout,
            rdy_redistribute_interval=cfg.rdy_redistribute_interval,
        )
        self._intake = Intake(cfg, self._rdy, self._outputs, message_batches)
        self._message_class = message_class
        self.messages_finished = 0
        #: the application's REQs (the intake counts those of the messages it sets aside)
        self._requeued = 0

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
        planned = self._rdy.next_deadline()
        if planned is not None and (deadline is None or planned < deadline):
            return planned
        return deadline

    def handle_timer(self, now: float) -> None:
        self._now = now
        self._table.handle_timer(now)
        rdy = self._rdy
        planned = rdy.next_deadline()
        if planned is None or planned > now:
            for kind, arg in self._timers.pop_due(now):
                self._fire(kind, arg, now)
            return
        # the planner's timers are due too: run everything in deadline order (the consumer's
        # own first on a tie)
        for deadline, (kind, arg) in self._timers.pop_due_timed(now):
            if planned is not None and planned < deadline:
                rdy.handle_timer(now)
                planned = None
            self._fire(kind, arg, now)
        if planned is not None:
            rdy.handle_timer(now)

    def _fire(self, kind: TimerKind, arg: object, now: float) -> None:
        if kind is TimerKind.LOOKUPD_POLL:
            self._discovery.poll(now)
        elif kind is TimerKind.LOOKUPD_RECHECK:
            self._discovery.recheck(now)
        elif kind is TimerKind.HTTP_TIMEOUT:
            assert isinstance(arg, int)
            self._discovery.http_timed_out(arg, now)
        elif kind is TimerKind.RECONNECT:
            assert isinstance(arg, tuple)
            address, partition = arg
            self._connect(address, partition, False)
        elif kind is TimerKind.STOP_TIMEOUT:
            self._leave_all(Step.TIMEOUT, now)
            self._check_stopped(now)

    def _send_rdy(self, conn_id: ConnId, count: int) -> None:
        """Carry out one of the planner's RDY decisions."""
        self._conns[conn_id].conn.rdy(count)

    # ------------------------------------------------------------------ transport events
    # (routed by the connection table, which drains the connection through _drain)

    def connection_made(self, conn_id: ConnId, now: float) -> None:
        self._now = now
        self._table.connection_made(conn_id, now)

    def tls_established(self, conn_id: ConnId, now: float) -> None:
        self._now = now
        self._table.tls_established(conn_id, now)

    def receive_data(self, conn_id: ConnId, data: bytes, now: float) -> None:
        self._now = now
        self._stop.heard(now)  # (a requeueing stop: nsqd still sends, its CLOSE_WAIT will come)
        self._table.receive_data(conn_id, data, now)

    def connection_lost(
        self, conn_id: ConnId, now: float, error: BaseException | None = None
    ) -> None:
        self._now = now
        self._table.connection_lost(conn_id, now, error)

    def http_data(self, request_id: int, data: bytes, now: float) -> None:
        """Bytes of a lookupd (or nsqd HTTP API) response (``b""`` at EOF)."""
        self._now = now
        self._discovery.http_data(request_id, data, now)

    def http_failed(self, request_id: int, error: BaseException, now: float) -> None:
        """The driver could not reach lookupd (or nsqd's HTTP API) or the transfer broke."""
        self._now = now
        self._discovery.http_failed(request_id, error, now)

    # ------------------------------------------------------------------ start and discovery
    # (which nsqd to connect to is decided by the Discovery of _discovery.py, which asks
    # lookupd; it hands the targets to _connect)

    def start(self, now: float) -> None:
        """Connect to the fixed nsqd list and/or send the first lookupd poll."""
        self._now = now
        self._life = after_start(self._life)
        self._discovery.start(now)
        self._rdy.start(now)

    def poll_lookupd_now(self, now: float, delay: float = 0.0) -> None:
        """Poll lookupd at ``now + delay`` unless a poll is already due sooner."""
        self._now = now
        self._discovery.poll_within(now, delay)  # (nothing once stopping)

    # ------------------------------------------------------------------ connections

    def _connect(
        self, address: tuple[str, int], partition: int | None, extend_support: bool
    ) -> None:
        """Open a connection to a target of the discovery (unless one is open already)."""
        if is_stopping(self._life):
            return
        discovery = self._discovery
        key = discovery.wanted(address, partition)
        if key is None:
            return
        conn_id = self._table.new_id()
        config = self.config.connection_config(
            extend_support=extend_support or self.config.extend_support
        )
        ordered = discovery.ordered(partition)
        conn = Connection(
            config,
            conn_id,
            address=address,
            message_batches=True,
            message_class=self._message_class,
        )
        repeats = OrderedRepeats() if ordered else None
        rec = _Conn(conn_id, conn, key, address, partition, ordered, InFlight(conn_id), repeats)
        self._table.add(conn_id, rec)
        discovery.connecting(key, conn_id)
        self._outputs.append(Connect(conn_id, address[0], address[1], self.config.dial_timeout))

    def _drain(self, rec: _Conn, now: float) -> None:
        """Move a connection's outputs to ours, reacting to its events on the way."""
        conn = rec.conn
        rdy = self._rdy
        while items := conn.outputs():
            planned = rec.planned
            if planned is not None and planned.can_rdy and conn.state not in CAN_RDY:
                # closing or closed (its events are in ``items``): no more RDY on it
                rdy.connection_closing(rec.conn_id)
            self._drain_items(rec, conn, items, now)
            if self._life is REQUEUEING and closes_now(conn.state, len(rec.in_flight.held)):
                # nsqd may write a message it took before our CLS right after its CLOSE_WAIT:
                # closed once what this read carried is requeued
                conn.close("consumer stopped")

    def _drain_items(self, rec: _Conn, conn: Connection, items: list[Output], now: float) -> None:
        intake = self._intake
        # (no item of one read moves the consumer into REQUEUEING: that is the application's)
        requeueing = self._life is REQUEUEING
        repeat = rec.repeat if rec.ordered else None
        for item in items:
            if type(item) is MessagesReceived:  # a run of messages: the intake's
                intake.take(item, conn, rec.in_flight, rec.planned, repeat, requeueing, now)
            elif isinstance(item, Ready):
                self._outputs.append(item)
                self._on_ready(rec, now)
            elif isinstance(item, ConnectionClosed):
                self._outputs.append(item)
                self._on_closed(rec, item, now)
            elif isinstance(item, ErrorReceived):
                if (
                    item.code == "E_FIN_FAILED"
                    and rec.repeats is not None
                    and rec.repeats.fin_failed()
                ):
                    continue  # the answer to the FIN of a repeat, as expected
                self._outputs.append(item)
                self._discovery.nsqd_error(item.code, now)
            elif isinstance(item, CloseWaitReceived):
                self._outputs.append(item)
                if self._life is STOPPING and not rec.in_flight.held:  # (at its CLOSE_WAIT)
                    conn.close("consumer stopped")
            else:
                self._outputs.append(item)

    def _on_ready(self, rec: _Conn, now: float) -> None:
        rec.ready_at = now
        self._discovery.connected(rec.address, rec.partition)
        if is_stopping(self._life):
            rec.conn.close("consumer stopping")
            return
        rec.conn.subscribe(self.topic, self.channel, rec.partition, ordered=rec.ordered)
        features = rec.conn.features
        rec.planned = self._rdy.connection_ready(
            rec.conn_id,
            now,
            ordered=rec.ordered,
            max_rdy_count=(
                features.max_rdy_count if features is not None else DEFAULT_MAX_RDY_COUNT
            ),
        )

    def _on_closed(self, rec: _Conn, event: ConnectionClosed, now: float) -> None:
        self._table.remove(rec.conn_id)
        self._discovery.lost(rec.key, rec.conn_id)
        # its RDY goes to the others (nothing is sent once stopping)
        self._rdy.connection_closed(rec.conn_id, now)
        # messages still held by the application come back from nsqd after msg_timeout
        rec.in_flight.drop_all()
        if is_stopping(self._life):
            self._check_stopped(now)
        else:
            self._discovery.replace(rec.key, rec.address, rec.partition, now)

    # ------------------------------------------------------------------ RDY and backoff
    # (decided by the RdyPlanner of _rdy.py; the consumer tells it what happened)

    def set_max_in_flight(self, max_in_flight: int, now: float) -> None:
        """Change max_in_flight (0 pauses the consumer)."""
        self._now = now
        if (
            isinstance(max_in_flight, bool)
            or not isinstance(max_in_flight, int)
            or max_in_flight < 0
        ):
            raise ConfigError(f"max_in_flight must be an int >= 0, not {max_in_flight!r}")
        self._rdy.set_max_in_flight(max_in_flight, now)

    @property
    def max_in_flight(self) -> int:
        return self._rdy.max_in_flight

    @property
    def messages_received(self) -> int:
        return self._intake.received

    @property
    def messages_requeued(self) -> int:
        return self._requeued + self._intake.requeued

    @property
    def messages_given_up(self) -> int:
        return self._intake.given_up

    @property
    def repeats_dropped(self) -> int:
        """Identical deliveries of a held message on an ordered connection, not passed on."""
        return self._intake.repeats_dropped

    @property
    def total_rdy(self) -> int:
        return self._rdy.total_rdy

    @property
    def backoff_level(self) -> int:
        return self._rdy.backoff_level

    # ------------------------------------------------------------------ message answers

    def finish(
        self, conn_id: ConnId, msg_id: bytes, now: float, *, attempts: int | None = None
    ) -> bool:
        """FIN.  Returns False when the connection is gone (nsqd will redeliver).

        ``attempts`` names the delivery being answered: a message can be held twice when
        nsqd delivered it again (its msg_timeout passed).  The FIN of an older copy is sent
        all the same (the work is done; nsqd answers the non-fatal ``E_FIN_FAILED`` when it
        had nothing to finish), as go-nsq does."""
        return self.finish_left(conn_id, msg_id, now, attempts=attempts) >= 0

    def finish_left(
        self, conn_id: ConnId, msg_id: bytes, now: float, *, attempts: int | None = None
    ) -> int:
        """:meth:`finish`, telling how many messages of the connection the application still
        holds (-1: the connection is gone).  For an adapter that chooses when to write: at
        0, no other answer of the connection will come to share the write."""
        self._now = now
        rec = self._conns.get(conn_id)
        if rec is not None and not rec.ordered and not (book := rec.in_flight).copies:
            # the common case, per message: one delivery held, no ordered books to keep (the
            # book's take and, while running, what follows an answer, inline)
            held = book.held
            message = held.pop(msg_id, None)
            if message is None:
                raise not_in_flight(msg_id, conn_id)
            self.messages_finished += 1
            rec.conn.finish_delivered(msg_id)
            rdy = self._rdy
            if attempts is None or attempts >= message.attempts:
                rdy.success(now)
            if self._life is not RUNNING:
                self._after_answer(rec, now)
            elif (planned := rec.planned) is not None:
                rdy.answered(planned, now)
            return len(held)
        if rec is None:
            return -1  # the connection is gone: nsqd will deliver the message again
        _, stale = rec.take(msg_id, attempts)
        self.messages_finished += 1
        rec.conn.finish_delivered(msg_id)
        if rec.repeats is not None and rec.repeats.finished(msg_id):
            rec.conn.finish(msg_id)  # the server's repeat of it, which it waits for too
        if not stale:
            self._rdy.success(now)
        self._after_answer(rec, now)
        return len(rec.in_flight.held)

    def finish_many(self, messages: Iterable[Answer], now: float) -> int:
        """FIN each ``(conn_id, msg_id, attempts)``, as :meth:`finish` would, with one write
        and one RDY decision per connection.  Returns how many FINs were sent: messages of a
        connection that is gone are skipped (nsqd will redeliver them).  A message that is
        not in flight raises :class:`LocalProtocolError`, after the others were finished."""
        bulk = take_many(self._conns, messages, lambda c, m, a: self.finish(c, m, now, attempts=a))
        return self._finish_bulk(bulk, now)

    def _finish_bulk(self, bulk: Bulk[_Conn], now: float) -> int:
        self._now = now
        groups = bulk.groups.values()
        for rec, ids in groups:
            rec.conn.finish_many_delivered(ids)  # ids its book held: checked when read
            self.messages_finished += len(ids)
        if bulk.fresh:
            self._rdy.success(now)
        for rec, _ in groups:
            self._after_answer(rec, now)
        if bulk.error is not None:
            raise bulk.error
        return bulk.sent

    def finish_messages(self, conn_id: ConnId, messages: Sequence[Message], now: float) -> int:
        """:meth:`finish_many` of the message objects connection ``conn_id`` delivered (as its
        :class:`MessagesReceived` carried them), without a tuple each."""
        bulk = take_delivered(self._conns.get(conn_id), conn_id, messages, self.finish, now)
        return self._finish_bulk(bulk, now)

    def requeue(
        self,
        conn_id: ConnId,
        msg_id: bytes,
        now: float,
        *,
        delay: float | None = None,
        backoff: bool = True,
        attempts: int | None = None,
    ) -> bool:
        """REQ.  ``delay`` None grows with attempts (go-nsq: default_requeue_delay x attempts,
        capped at max_requeue_delay).  ``backoff`` makes it count as a failure for backoff.
        On a SUB_ORDERED connection the REQ goes out without a delay: the partitioned server
        ignores a delayed REQ there, and the partition cannot move on past the message anyway.

        The REQ of an older copy (``attempts`` below the newest delivery's) is not sent: it
        would requeue the newer delivery, which the application is still processing."""
        self._now = now
        rec = self._conns.get(conn_id)
        if rec is None:
            return False  # the connection is gone: nsqd will deliver the message again
        message, stale = rec.take(msg_id, attempts)
        if stale:
            self._after_answer(rec, now)
            return True
        cfg = self.config
        if delay is None:
            delay = min(cfg.default_requeue_delay * message.attempts, cfg.max_requeue_delay)
        if rec.ordered:
            # the partitioned server ignores a REQ with a delay on an ordered channel (the
            # message would come back only after msg_timeout): requeue it at once
            delay = 0.0
        self._requeued += 1
        if backoff:
            # RDY 0 goes out before the REQ (go-nsq sends it after): otherwise nsqd may hand
            # out another message in the slot the REQ frees, inside the backoff window
            self._rdy.failure(now)
        rec.conn.requeue(msg_id, delay)
        self._after_answer(rec, now)
        return True

    def touch(
        self, conn_id: ConnId, msg_id: bytes, now: float, *, attempts: int | None = None
    ) -> bool:
        """TOUCH (never automatic).  Returns False when the connection is gone.  An older
        copy's TOUCH (``attempts`` below the newest delivery's) is not sent."""
        self._now = now
        rec = self._conns.get(conn_id)
        if rec is None:
            return False
        if rec.in_flight.newest(msg_id, attempts):
            rec.conn.touch(msg_id)
        return True

    def touch_many(self, messages: Iterable[Answer], now: float) -> int:
        """TOUCH each ``(conn_id, msg_id, attempts)``, as :meth:`touch` would, with one write
        per connection.  Returns how many TOUCHes were sent: messages of a connection that is
        gone, and older copies, are skipped.  A message that is not in flight raises
        :class:`LocalProtocolError`, after the others were touched."""
        self._now = now
        bulk = newest_many(self._conns, messages)
        for rec, ids in bulk.groups.values():
            rec.conn.touch_many(ids)
        if bulk.error is not None:
            raise bulk.error
        return bulk.sent

    def _after_answer(self, rec: _Conn, now: float) -> None:
        if self._life is RUNNING:
            if rec.planned is not None:
                self._rdy.answered(rec.planned, now)
        elif closes_now(rec.conn.state, len(rec.in_flight.held)):
            rec.conn.close("consumer stopped")
            self._drain(rec, now)
        # the commands wait in the connection's buffer: the next outputs() call sends every
        # answer given since in one write

    def in_flight(self, conn_id: ConnId) -> Sequence[Message]:
        """The messages of the connection the application holds (the newest delivery of each,
        in the order first delivered); empty once the connection is gone."""
        rec = self._conns.get(conn_id)
        return rec.in_flight.messages() if rec is not None else ()

    def in_flight_count(self, conn_id: ConnId) -> int:
        """How many messages of the connection the application holds (0 once it is gone)."""
        rec = self._conns.get(conn_id)
        return len(rec.in_flight.held) if rec is not None else 0

    # ------------------------------------------------------------------ stopping

    def stop(self, now: float, *, requeue_unanswered: bool = False) -> None:
        """Graceful stop: CLS everywhere, no more RDY; connections close once the application
        answered their in-flight messages (or after ``stop_timeout``, which requeues them).
        With ``requeue_unanswered`` (the application can answer nothing more, e.g. it was
        cancelled) every unanswered message is requeued at once, and so is every message that
        still arrives; each connection closes once nsqd confirmed the CLS (CLOSE_WAIT), or once
        none sent a byte for :data:`REQUEUE_GRACE` seconds (within ``stop_timeout``)."""
        self._now = now
        if not is_stopping(self._life):
            self._life = after_stop(self._life, False)
            self._rdy.stop()
            self._discovery.stop(now)
            self._leave_all(Step.STOP, now)
            self._stop.begin(now)
        elif not requeue_unanswered:
            return
        if requeue_unanswered:
            # every unanswered message now and every one still arriving is requeued; a
            # connection closes on CLOSE_WAIT (or at once when it is not waiting for one)
            self._life = after_stop(self._life, True)
            self._stop.hurry(now)
            self._leave_all(Step.REQUEUE, now)
        self._check_stopped(now)

    def _leave_all(self, step: Step, now: float) -> None:
        """Carry out, on every connection, what the stop procedure decides for ``step``."""
        leave = self._stop.leave
        for rec in list(self._conns.values()):
            conn = rec.conn
            decision = leave(step, conn.state)
            if decision.requeue:
                ids = left_to_answer(conn.state, rec.in_flight.drop_all())
                for msg_id in ids:
                    conn.requeue(msg_id, 0.0)
                self._requeued += len(ids)
            if decision.cls:
                conn.start_close()
            elif decision.close is not None:
                conn.close(decision.close)
            self._drain(rec, now)

    def _check_stopped(self, now: float) -> None:
        if self._life is not STOPPING and self._life is not REQUEUEING:
            return
        for rec in list(self._conns.values()):
            if closes_now(rec.conn.state, len(rec.in_flight.held)):
                rec.conn.close("consumer stopped")
                self._drain(rec, now)
        if not self._conns:
            self._life = after_all_closed(self._life)
            self._stop.done()
            self._outputs.append(Stopped())

    @property
    def stopping(self) -> bool:
        return is_stopping(self._life)

    @property
    def stopped(self) -> bool:
        return self._life is STOPPED

    # ------------------------------------------------------------------ introspection

    def is_starved(self) -> bool:
        """The client guide's test: some connection has in-flight messages at >= 85 % of its
        last RDY, so the application should process the batch it holds."""
        rdy = self._rdy
        for rec in self._conns.values():
            n = len(rec.in_flight.held)
            if n > 0 and n >= rdy.rdy(rec.conn_id) * 0.85:
                return True
        return False

    def connections(self) -> list[ConnectionStats]:
        """A snapshot of every connection (connecting, subscribed or closing), in the order
        opened: see :class:`ConnectionStats`."""
        return [rec.stats(self._rdy) for rec in self._conns.values()]

    def connection_stats(self, conn_id: ConnId) -> ConnectionStats | None:
        """A snapshot of one connection (as :meth:`connections` gives), or None once it is
        gone."""
        rec = self._conns.get(conn_id)
        return rec.stats(self._rdy) if rec is not None else None

    def connection(self, conn_id: ConnId) -> Connection | None:
        """The connection's own machine (its state, negotiated features, layout), or None
        once it is gone; for reading: commands go through the consumer, which keeps its
        books."""
        rec = self._conns.get(conn_id)
        return rec.conn if rec is not None else None

    def close_connection(
        self, conn_id: ConnId, now: float, reason: str = "closed by the application"
    ) -> None:
        """Close one connection now (without CLS); it is replaced as any lost one is."""
        self._now = now
        rec = self._conns.get(conn_id)
        if rec is not None:
            rec.conn.close(reason)
            self._drain(rec, now)
