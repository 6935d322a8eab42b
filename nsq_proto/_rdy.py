"""RDY distribution and backoff of one consumer: how many messages each connection may be sent.

:class:`~nsq_proto.Consumer` owns one :class:`RdyPlanner`, the way aioquic's
``QuicConnection`` owns its ``QuicPacketRecovery``: the consumer routes bytes, keeps the books
of messages in flight and runs discovery; the planner decides every ``RDY``.  It keeps its own
state (one :class:`ConnRdy` record per connection that can be given RDY, the backoff level and
its two deadlines), knows nothing of :class:`~nsq_proto.Connection`, and, like the rest of the
core, does no I/O and reads no clock: every input carries ``now``.

Inputs (the consumer calls these; none of them raises):

* the connection set, by id -- :meth:`~RdyPlanner.connection_ready` once a connection has
  sent SUB (it may be given RDY from now on; with its ``ordered`` flag and its nsqd's
  ``max_rdy_count``; it returns the planner's :class:`ConnRdy` record of it),
  :meth:`~RdyPlanner.connection_closing` once it can take no more RDY (closing or closed,
  before the consumer has seen it go), :meth:`~RdyPlanner.connection_closed` once it is
  gone;
* traffic, per message, so by the record rather than by id (no lookup on the hot path) --
  :meth:`~RdyPlanner.message_received` for every message a connection delivers,
  :meth:`~RdyPlanner.answered` after the application answered one (FIN or REQ);
* results, for backoff -- :meth:`~RdyPlanner.success` (a FIN) and
  :meth:`~RdyPlanner.failure` (a REQ that counts as a failure); one result counts per
  backoff window (go-nsq's ``startStopContinueBackoff``);
* time -- :meth:`~RdyPlanner.start` (redistribute every ``rdy_redistribute_interval`` from
  now on), and :meth:`~RdyPlanner.handle_timer` once :meth:`~RdyPlanner.next_deadline` is
  reached (the aioquic pair ``get_loss_detection_time`` / ``on_loss_detection_timeout``);
* the application -- :meth:`~RdyPlanner.set_max_in_flight` and :meth:`~RdyPlanner.stop`
  (the consumer's graceful stop: no RDY is sent after it).

Outputs:

* RDY decisions, through the ``send_rdy(conn_id, count)`` callback given at construction
  (called synchronously, in decision order; the consumer writes ``RDY count`` to that
  connection): a callback rather than a returned list, so that the per-message inputs
  allocate nothing.  The planner mirrors each in its record (``rdy``, ``remaining``: messages
  the connection may still send before its next RDY, ``last_rdy_at``), which
  :meth:`~RdyPlanner.rdy` and :meth:`~RdyPlanner.last_message_at` read back for statistics;
* one deadline, :meth:`~RdyPlanner.next_deadline` (None: nothing scheduled): the earlier of
  the end of the backoff window (test the waters with RDY 1) and the next periodic
  redistribution; :meth:`~RdyPlanner.handle_timer` runs what is due (early: nothing);
* :class:`~nsq_proto.BackoffChanged` events, through the ``on_event`` callback (the consumer
  appends them to its output queue, in order with everything else).

What holds: no connection is given more than its nsqd's ``max_rdy_count`` (an ordered,
SUB_ORDERED connection no more than 1); RDY is only sent on a connection between
:meth:`~RdyPlanner.connection_ready` and :meth:`~RdyPlanner.connection_closing` (or
``connection_closed``); no RDY above 0 is sent while a backoff window is open, and only RDY 1
while in backoff between windows; nothing is sent after :meth:`~RdyPlanner.stop`.  The RDY
counts of the connections that can take RDY sum to at most ``max_in_flight`` (in backoff, to
at most 1); the last RDY of a closing connection still counts against that budget until
:meth:`~RdyPlanner.connection_closed`.

Where go-nsq refines the client guide, the planner does what go-nsq does; those places say so.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from ._events import BackoffChanged, ConnId

__all__ = ["Backoff", "ConnRdy", "RdyPlanner"]


class ConnRdy:
    """The planner's record of one connection that can be (or was) given RDY.  The planner
    alone writes it; the consumer keeps it as a handle for the per-message inputs."""

    __slots__ = (
        "can_rdy",
        "conn_id",
        "last_msg_at",
        "last_rdy_at",
        "max_rdy_count",
        "ordered",
        "rdy",
        "remaining",
    )

    def __init__(self, conn_id: ConnId, ordered: bool, max_rdy_count: int) -> None:
        self.conn_id = conn_id
        #: SUB_ORDERED on the partitioned server: one message in flight at a time
        self.ordered = ordered
        #: nsqd's ``max_rdy_count`` for this connection
        self.max_rdy_count = max_rdy_count
        #: RDY may be sent (subscribed, not closing)
        self.can_rdy = True
        #: the last RDY sent
        self.rdy = 0
        #: messages nsqd may still send before the next RDY
        self.remaining = 0
        self.last_msg_at = 0.0
        self.last_rdy_at = 0.0


class Backoff:
    """go-nsq's backoff level, without timers or RDY: a failure raises the level, a success
    lowers it, and each level has a window of ``multiplier * 2**level`` seconds, capped at
    ``max_duration``."""

    __slots__ = ("level", "max_duration", "multiplier")

    def __init__(self, multiplier: float, max_duration: float) -> None:
        self.level = 0
        self.multiplier = multiplier
        self.max_duration = max_duration

    def duration(self, level: int) -> float:
        """How long the window of ``level`` lasts."""
        return float(min(self.max_duration, self.multiplier * 2**level))

    def record(self, success: bool) -> int | None:
        """Count one result.  Returns the new level when a window must start (any level above
        0, the same one included) or backoff is over (0); None when nothing changed."""
        level = self.level
        if success:
            if level == 0:
                return None
            level -= 1
        elif level == 0 or self.multiplier * 2 ** (level + 1) <= self.max_duration:
            # go-nsq: the level rises while its uncapped window fits under the cap (and
            # always from 0, so that a first failure backs off even with a tiny cap)
            level += 1
        # else: at the top level; another window of the same length starts
        self.level = level
        return level


class RdyPlanner:
    """RDY distribution and backoff for the connections of one consumer (see the module
    docstring for its inputs and outputs)."""

    __slots__ = (
        "_backoff",
        "_backoff_enabled",
        "_backoff_end",
        "_conns",
        "_last_id",
        "_low_rdy_idle_timeout",
        "_low_rdy_timeout",
        "_max_in_flight",
        "_need_redistribute",
        "_on_event",
        "_redistribute_at",
        "_redistribute_first",
        "_redistribute_interval",
        "_rng",
        "_send_rdy",
        "_share",
        "_stopped",
        "_total_rdy",
    )

    def __init__(
        self,
        rng: random.Random,
        *,
        send_rdy: Callable[[ConnId, int], None],
        on_event: Callable[[BackoffChanged], None],
        max_in_flight: int,
        backoff: bool,
        backoff_multiplier: float,
        max_backoff_duration: float,
        low_rdy_idle_timeout: float,
        low_rdy_timeout: float,
        rdy_redistribute_interval: float,
    ) -> None:
        """``rng``: the consumer's random source (which connection tests the waters, which gets
        RDY first); ``send_rdy(conn_id, count)``: carries out one RDY decision;
        ``on_event``: takes each :class:`~nsq_proto.BackoffChanged`."""
        self._rng = rng
        self._send_rdy = send_rdy
        self._on_event = on_event
        #: conn id -> its record, in ascending id order (the consumer's connection order):
        #: the order RDY is granted in and random choices are drawn from
        self._conns: dict[ConnId, ConnRdy] = {}
        #: the highest id in ``_conns`` (an id below it is inserted in order)
        self._last_id: ConnId | None = None
        self._backoff = Backoff(backoff_multiplier, max_backoff_duration)
        self._backoff_enabled = backoff
        self._low_rdy_idle_timeout = low_rdy_idle_timeout
        self._low_rdy_timeout = low_rdy_timeout
        self._redistribute_interval = rdy_redistribute_interval
        self._max_in_flight = max_in_flight
        #: the sum of every connection's RDY
        self._total_rdy = 0
        #: some connection was refused RDY (or lost it): rotate at the next redistribution
        self._need_redistribute = False
        #: the per-connection share of max_in_flight; None: to be computed again
        self._share: int | None = None
        self._stopped = False
        #: the end of the open backoff window (None: no window is open)
        self._backoff_end: float | None = None
        #: the next periodic redistribution (None: not started, or stopped)
        self._redistribute_at: float | None = None
        #: both deadlines equal: the redistribution was scheduled first, so it runs first
        self._redistribute_first = False

    # ------------------------------------------------------------------ introspection

    @property
    def max_in_flight(self) -> int:
        return self._max_in_flight

    @property
    def total_rdy(self) -> int:
        return self._total_rdy

    @property
    def backoff_level(self) -> int:
        return self._backoff.level

    @property
    def in_backoff_window(self) -> bool:
        """A backoff window is open: no RDY above 0 until it closes."""
        return self._backoff_end is not None

    def rdy(self, conn_id: ConnId) -> int:
        """The last RDY given to the connection (0 if it never was, or is gone)."""
        rec = self._conns.get(conn_id)
        return rec.rdy if rec is not None else 0

    def last_message_at(self, conn_id: ConnId) -> float:
        """When the connection last delivered a message (0.0: never, or it is gone)."""
        rec = self._conns.get(conn_id)
        return rec.last_msg_at if rec is not None else 0.0

    # ------------------------------------------------------------------ time

    def next_deadline(self) -> float | None:
        """When :meth:`handle_timer` must next be called (None: nothing is scheduled)."""
        end = self._backoff_end
        at = self._redistribute_at
        if end is None:
            return at
        if at is None or end < at:
            return end
        return at

    def handle_timer(self, now: float) -> None:
        """Run what is due at ``now``, in deadline order: the end of the backoff window (test
        the waters with RDY 1), the periodic redistribution.  Early: nothing happens."""
        end = self._backoff_end
        at = self._redistribute_at
        window_over = end is not None and end <= now
        redistribute = at is not None and at <= now
        # both are taken off first, as a timer wheel pops every due timer before running them
        if window_over:
            self._backoff_end = None
        if redistribute:
            self._redistribute_at = None
        if window_over and redistribute:
            assert end is not None and at is not None
            if at < end or (at == end and self._redistribute_first):
                self._redistribute_due(now)
                self._backoff_window_over(now)
            else:
                self._backoff_window_over(now)
                self._redistribute_due(now)
        elif window_over:
            self._backoff_window_over(now)
        elif redistribute:
            self._redistribute_due(now)

    def _set_backoff_end(self, deadline: float) -> None:
        self._backoff_end = deadline
        self._redistribute_first = self._redistribute_at is not None

    def _set_redistribute_at(self, deadline: float) -> None:
        self._redistribute_at = deadline
        self._redistribute_first = False

    # ------------------------------------------------------------------ inputs

    def start(self, now: float) -> None:
        """The consumer started: redistribute every ``rdy_redistribute_interval``."""
        self._set_redistribute_at(now + self._redistribute_interval)

    def stop(self) -> None:
        """The consumer is stopping: no RDY from now on, no more backoff or redistribution."""
        self._stopped = True
        self._backoff_end = None
        self._redistribute_at = None

    def connection_ready(
        self, conn_id: ConnId, now: float, *, ordered: bool, max_rdy_count: int
    ) -> ConnRdy:
        """The connection completed its handshake and sent SUB: it can take RDY from now on
        (at most ``max_rdy_count``; at most 1 when ``ordered``).  Returns the planner's record
        of it: the handle :meth:`message_received` and :meth:`answered` take (no lookup by
        id on the per-message path)."""
        rec = ConnRdy(conn_id, ordered, max_rdy_count)
        conns = self._conns
        last = self._last_id
        conns[conn_id] = rec
        if last is None or conn_id > last:
            self._last_id = conn_id
        elif conn_id < last:
            # ready before a connection opened earlier: keep the id order
            ordered_conns = sorted(conns.items())
            conns.clear()
            conns.update(ordered_conns)
        self._share = None
        # go-nsq's "pre-emptive signal": lower the others' share first, so that the budget
        # for the newcomer exists; then the guide's RDY 1, so that no connection is favoured
        for other in list(conns.values()):
            if other is not rec:
                self._maybe_update_rdy(other, now)
        if (
            self._max_in_flight > 0
            and self._backoff.level == 0
            and self._backoff_end is None
            and not self._stopped
        ):
            self._update_rdy(rec, 1, now)
        return rec

    def connection_closing(self, conn_id: ConnId) -> None:
        """The connection can take no more RDY (it is closing or closed; its RDY still counts
        until :meth:`connection_closed`).  Unknown ids are ignored."""
        rec = self._conns.get(conn_id)
        if rec is not None:
            rec.can_rdy = False

    def connection_closed(self, conn_id: ConnId, now: float) -> None:
        """The connection is gone (ready or not): its RDY goes to the others."""
        self._share = None
        rec = self._conns.pop(conn_id, None)
        if rec is not None:
            if conn_id == self._last_id:
                self._last_id = max(self._conns, default=None)
            self._total_rdy -= rec.rdy
            rec.rdy = 0
            rec.can_rdy = False  # a handle kept after this gets nothing more
        if self._stopped:
            return
        self._need_redistribute = True
        self._rebalance(now)

    def message_received(self, rec: ConnRdy, now: float, passed_on: bool, count: int = 1) -> None:
        """The connection of ``rec`` (see :meth:`connection_ready`) delivered ``count``
        messages (of one read); ``passed_on``: the application got them (not copies the
        consumer dropped or messages it gave up on), so RDY may be refilled now: one
        decision for them all."""
        remaining = rec.remaining - count
        rec.remaining = remaining = remaining if remaining > 0 else 0
        rec.last_msg_at = now
        # go-nsq refreshes RDY when a message arrives (not only once it is answered), so a
        # consumer that holds messages to batch them still gets its full share
        if passed_on and (remaining <= 1 or remaining < rec.rdy / 4):
            self._maybe_update_rdy(rec, now)

    def answered(self, rec: ConnRdy, now: float) -> None:
        """The application answered a message of the connection of ``rec`` (after
        :meth:`success` or :meth:`failure`, if it counts for backoff): refill its RDY if it
        ran low."""
        remain = rec.remaining
        share = self._share
        last = rec.rdy
        if (
            share is not None
            and remain > 1
            and remain * 4 >= last
            and share >= last
            and not rec.ordered
        ):
            return  # plenty left and the share did not fall: what _maybe_update_rdy says
        self._maybe_update_rdy(rec, now)

    def success(self, now: float) -> None:
        """A message was processed (FIN): one step out of backoff, if in it."""
        if self._backoff.level == 0:
            return  # the common case: nothing to leave
        self._result(True, now)

    def failure(self, now: float) -> None:
        """A message failed (REQ with backoff): one step into backoff."""
        self._result(False, now)

    def set_max_in_flight(self, max_in_flight: int, now: float) -> None:
        """The application changed max_in_flight (validated; 0 pauses the consumer)."""
        self._max_in_flight = max_in_flight
        self._share = None
        if self._backoff.level > 0 or self._backoff_end is not None:
            if max_in_flight == 0:
                for rec in self._conns.values():
                    if rec.rdy:
                        self._update_rdy(rec, 0, now)
            return
        self._rebalance(now)
        self._need_redistribute = True

    # ------------------------------------------------------------------ timers

    def _backoff_window_over(self, now: float) -> None:
        """The backoff window closed: test the waters with RDY 1 on one connection."""
        if self._stopped:
            return
        if self._max_in_flight == 0:
            return
        if self._total_rdy > 0:
            # a redistribution due at the same moment already gave a connection its RDY 1:
            # the window is tested with one message, not two
            return
        conns = [r for r in self._conns.values() if r.can_rdy]
        if not conns:
            # nothing to test the waters with: try again in a second (go-nsq)
            self._set_backoff_end(now + 1.0)
            return
        choice = conns[self._rng.randrange(len(conns))]
        if not self._update_rdy(choice, 1, now):
            self._set_backoff_end(now + 1.0)

    def _redistribute_due(self, now: float) -> None:
        """The periodic redistribution: go-nsq's redistributeRDY, then schedule the next."""
        self._redistribute(now)
        if not self._stopped:
            self._set_redistribute_at(now + self._redistribute_interval)

    # ------------------------------------------------------------------ backoff

    def _result(self, success: bool, now: float) -> None:
        """go-nsq's startStopContinueBackoff: one result counts per backoff window."""
        if not self._backoff_enabled or self._stopped:
            return
        if self._backoff_end is not None:
            return
        level = self._backoff.record(success)
        if level is None:
            return
        if level == 0:
            self._on_event(BackoffChanged(0, 0.0))
            self._rebalance(now)
            return
        duration = self._backoff.duration(level)
        for rec in self._conns.values():
            if rec.rdy:
                self._update_rdy(rec, 0, now)
        self._set_backoff_end(now + duration)
        self._on_event(BackoffChanged(level, duration))

    # ------------------------------------------------------------------ RDY

    def _per_conn_max_in_flight(self) -> int:
        # go-nsq: min(max(1, max_in_flight / conns), max_in_flight); cached, because it is
        # asked after every answer and changes only when connections come and go
        share = self._share
        if share is None:
            mif = self._max_in_flight
            n = sum(1 for r in self._conns.values() if r.can_rdy) or 1
            share = self._share = min(max(1, mif // n), mif)
        return share

    def _update_rdy(self, rec: ConnRdy, count: int, now: float) -> bool:
        """Send RDY ``count`` if the invariants allow it (go-nsq's updateRDY); nothing once
        stopped (the consumer sent CLS)."""
        if not rec.can_rdy or self._stopped:
            return False
        if rec.ordered and count > 1:
            count = 1
        max_rdy = rec.max_rdy_count
        if count > max_rdy:
            count = max_rdy
        max_possible = self._max_in_flight - self._total_rdy + rec.rdy
        if 0 < max_possible < count:
            count = max_possible
        if max_possible <= 0 and count > 0:
            self._need_redistribute = True
            return False
        self._send_rdy(rec.conn_id, count)
        self._total_rdy += count - rec.rdy
        rec.rdy = count
        rec.remaining = count
        rec.last_rdy_at = now
        return True

    def _maybe_update_rdy(self, rec: ConnRdy, now: float) -> None:
        if self._backoff.level > 0 or self._stopped:
            return
        if self._backoff_end is not None:
            return
        count = self._share
        if count is None:
            count = self._per_conn_max_in_flight()
        if rec.ordered:
            count = min(count, 1)
        remain = rec.remaining
        last = rec.rdy
        if count == last and remain == last:
            return  # nothing consumed since the last RDY and the share did not change
        # refill at 0/1 or below 25 % of the last RDY; shrink when the share fell
        if remain <= 1 or remain < last / 4 or count < last:
            self._update_rdy(rec, count, now)

    def _rebalance(self, now: float, *, only_idle: bool = False) -> None:
        """Bring every connection to the current share: shrink first, then grow (with
        ``only_idle``, grow only connections at RDY 0: a connection still at its first RDY 1
        waits for its first answered message, as the client guide says)."""
        if self._backoff.level > 0 or self._stopped:
            return
        if self._backoff_end is not None:
            return
        share = self._per_conn_max_in_flight()
        conns = [r for r in self._conns.values() if r.can_rdy]
        for rec in conns:
            if rec.rdy > share:
                self._update_rdy(rec, share, now)
        if self._total_rdy > self._max_in_flight:
            # more connections than max_in_flight: take RDY back from the idlest ones
            for rec in sorted(conns, key=_last_msg_at):
                if self._total_rdy <= self._max_in_flight:
                    break
                if rec.rdy:
                    self._update_rdy(rec, 0, now)
                    self._need_redistribute = True
        for rec in conns:
            if rec.rdy < share and (rec.rdy == 0 or not only_idle):
                self._update_rdy(rec, share, now)

    def _redistribute(self, now: float) -> None:
        """go-nsq's redistributeRDY: rotate RDY to idle-free connections when there are more
        connections than max_in_flight, or while in backoff with several connections."""
        if self._stopped or self._backoff_end is not None:
            return
        conns = [r for r in self._conns.values() if r.can_rdy]
        if not conns:
            return
        level = self._backoff.level
        if len(conns) > self._max_in_flight:
            self._need_redistribute = True
        if level > 0 and len(conns) > 1:
            self._need_redistribute = True
        if level > 0 and self._total_rdy == 0:
            self._need_redistribute = True  # never stay at RDY 0 everywhere in backoff
        if not self._need_redistribute:
            if level == 0:
                self._rebalance(now, only_idle=True)
            return
        self._need_redistribute = False
        possible = []
        for rec in conns:
            if rec.rdy > 0 and (
                now - rec.last_msg_at > self._low_rdy_idle_timeout
                or now - rec.last_rdy_at > self._low_rdy_timeout
            ):
                self._update_rdy(rec, 0, now)
            possible.append(rec)
        if level > 0:
            available = 1 - self._total_rdy
        elif len(conns) <= self._max_in_flight:
            self._rebalance(now)
            return
        else:
            available = self._max_in_flight - self._total_rdy
        while possible and available > 0:
            rec = possible.pop(self._rng.randrange(len(possible)))
            if rec.rdy > 0:
                continue
            if self._update_rdy(rec, 1, now):
                available -= 1


def _last_msg_at(rec: ConnRdy) -> float:
    return rec.last_msg_at
