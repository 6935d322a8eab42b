"""RDY distribution and backoff of one consumer: how many messages each connection may be sent.

:class:`~nsq_proto.Consumer` owns one :class:`RdyPlanner`, the way aioquic's
``QuicConnection`` owns its ``QuicPacketRecovery``: the consumer routes bytes, keeps the books
of messages in flight and runs discovery; the planner decides every ``RDY``.  Like the rest of
the core it does no I/O and reads no clock: every input carries ``now``.

Inputs (the consumer calls these; none of them raises):

* the connection set -- the planner reads the consumer's table of connections (a mapping of
  :class:`RdyConn` records it never adds to nor removes from) and is told when it changes:
  :meth:`~RdyPlanner.connection_ready` once a connection has sent SUB,
  :meth:`~RdyPlanner.connection_closed` once one is gone (already out of the table);
* traffic -- :meth:`~RdyPlanner.message_received` for every message a connection delivers,
  :meth:`~RdyPlanner.answered` after the application answered one (FIN or REQ);
* results, for backoff -- :meth:`~RdyPlanner.success` (a FIN) and
  :meth:`~RdyPlanner.failure` (a REQ that counts as a failure); one result counts per
  backoff window (go-nsq's ``startStopContinueBackoff``);
* time -- :meth:`~RdyPlanner.start`; :meth:`~RdyPlanner.backoff_window_over` and
  :meth:`~RdyPlanner.redistribute` when the consumer pops the planner's timers;
* the application -- :meth:`~RdyPlanner.set_max_in_flight` and :meth:`~RdyPlanner.stop`
  (the consumer's graceful stop: no RDY is sent after it).

Outputs:

* RDY counts per connection: ``rec.conn.rdy(n)`` (the command waits in that connection's
  write buffer until the consumer drains it), mirrored in ``rec.rdy``, ``rec.remaining``
  (messages the connection may still send before its next RDY) and ``rec.last_rdy_at``;
* deadlines, in the consumer's :class:`~nsq_proto._timers.Timers`:
  ``(TimerKind.BACKOFF_END, None)`` (the backoff window closes: test the waters with RDY 1)
  and ``(TimerKind.RDY_REDISTRIBUTE, None)`` (every ``rdy_redistribute_interval``);
* :class:`~nsq_proto.BackoffChanged` events, appended to the consumer's output queue.

What holds: no connection is given more than its nsqd's ``max_rdy_count`` (an ordered,
SUB_ORDERED connection no more than 1); RDY is only sent on a subscribed connection; no RDY
above 0 is sent while a backoff window is open, and only RDY 1 while in backoff between
windows; nothing is sent after :meth:`stop`.  The RDY counts sum to at most ``max_in_flight``
(in backoff, to at most 1).

Where go-nsq refines the client guide, the planner does what go-nsq does; those places say so.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Mapping
from typing import Final, Protocol

from ._connection import Connection
from ._events import BackoffChanged, ConnId
from ._features import DEFAULT_MAX_RDY_COUNT
from ._outputs import Output
from ._state import ACTIVE, CAN_RDY
from ._timers import TimerKind, Timers

__all__ = ["Backoff", "RdyConn", "RdyPlanner"]

# built once: they are looked up on every answer
_BACKOFF_END: Final = (TimerKind.BACKOFF_END, None)
_REDISTRIBUTE: Final = (TimerKind.RDY_REDISTRIBUTE, None)


class RdyConn(Protocol):
    """What the planner reads and writes on one of the consumer's connection records.

    The planner owns ``rdy``, ``remaining``, ``last_msg_at`` and ``last_rdy_at``; the consumer
    only reads them (for statistics).  ``conn`` and ``ordered`` are the consumer's."""

    conn: Connection
    #: SUB_ORDERED on the partitioned server: one message in flight at a time
    ordered: bool
    #: the last RDY sent
    rdy: int
    #: messages nsqd may still send before the next RDY
    remaining: int
    last_msg_at: float
    last_rdy_at: float


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
        "_conns",
        "_events",
        "_low_rdy_idle_timeout",
        "_low_rdy_timeout",
        "_max_in_flight",
        "_need_redistribute",
        "_redistribute_interval",
        "_rng",
        "_share",
        "_stopped",
        "_timers",
        "_total_rdy",
    )

    def __init__(
        self,
        conns: Mapping[ConnId, RdyConn],
        timers: Timers,
        events: deque[Output],
        rng: random.Random,
        *,
        max_in_flight: int,
        backoff: bool,
        backoff_multiplier: float,
        max_backoff_duration: float,
        low_rdy_idle_timeout: float,
        low_rdy_timeout: float,
        rdy_redistribute_interval: float,
    ) -> None:
        """``conns``: the consumer's table of connections, read (never changed) by the planner;
        ``timers``, ``events``: where its deadlines and events go; ``rng``: the consumer's
        random source (which connection tests the waters, which gets RDY first)."""
        self._conns = conns
        self._timers = timers
        self._events = events
        self._rng = rng
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

    # ------------------------------------------------------------------ inputs

    def start(self, now: float) -> None:
        """The consumer started: redistribute every ``rdy_redistribute_interval``."""
        self._timers.set(_REDISTRIBUTE, now + self._redistribute_interval)

    def stop(self) -> None:
        """The consumer is stopping: no RDY from now on, no more backoff or redistribution."""
        self._stopped = True
        self._timers.cancel_kind(TimerKind.BACKOFF_END)
        self._timers.cancel_kind(TimerKind.RDY_REDISTRIBUTE)

    def connection_ready(self, rec: RdyConn, now: float) -> None:
        """``rec`` completed its handshake and sent SUB (it is in the table)."""
        self._share = None
        # go-nsq's "pre-emptive signal": lower the others' share first, so that the budget
        # for the newcomer exists; then the guide's RDY 1, so that no connection is favoured
        for other in list(self._conns.values()):
            if other is not rec:
                self._maybe_update_rdy(other, now)
        if (
            self._max_in_flight > 0
            and self._backoff.level == 0
            and _BACKOFF_END not in self._timers
        ):
            self._update_rdy(rec, 1, now)

    def connection_closed(self, rec: RdyConn, now: float) -> None:
        """``rec`` is gone (already out of the table): its RDY goes to the others."""
        self._share = None
        self._total_rdy -= rec.rdy
        rec.rdy = 0
        if self._stopped:
            return
        self._need_redistribute = True
        self._rebalance(now)

    def message_received(self, rec: RdyConn, now: float, passed_on: bool) -> None:
        """``rec`` delivered a message; ``passed_on``: the application got it (not a copy the
        consumer dropped or a message it gave up on), so RDY may be refilled now."""
        remaining = rec.remaining = rec.remaining - 1 if rec.remaining > 0 else 0
        rec.last_msg_at = now
        # go-nsq refreshes RDY when a message arrives (not only once it is answered), so a
        # consumer that holds messages to batch them still gets its full share
        if passed_on and (remaining <= 1 or remaining < rec.rdy / 4):
            self._maybe_update_rdy(rec, now)

    def answered(self, rec: RdyConn, now: float) -> None:
        """The application answered a message of ``rec`` (after :meth:`success` or
        :meth:`failure`, if it counts for backoff): refill its RDY if it ran low."""
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
        if self._backoff.level > 0 or _BACKOFF_END in self._timers:
            if max_in_flight == 0:
                for rec in self._conns.values():
                    if rec.rdy:
                        self._update_rdy(rec, 0, now)
            return
        self._rebalance(now)
        self._need_redistribute = True

    def backoff_window_over(self, now: float) -> None:
        """The ``BACKOFF_END`` timer fired: test the waters with RDY 1 on one connection."""
        if self._stopped:
            return
        if self._max_in_flight == 0:
            return
        if self._total_rdy > 0:
            # a redistribution due at the same moment already gave a connection its RDY 1:
            # the window is tested with one message, not two
            return
        conns = [r for r in self._conns.values() if r.conn.state in CAN_RDY]
        if not conns:
            # nothing to test the waters with: try again in a second (go-nsq)
            self._timers.set(_BACKOFF_END, now + 1.0)
            return
        choice = conns[self._rng.randrange(len(conns))]
        if not self._update_rdy(choice, 1, now):
            self._timers.set(_BACKOFF_END, now + 1.0)

    def redistribute(self, now: float) -> None:
        """The ``RDY_REDISTRIBUTE`` timer fired: go-nsq's redistributeRDY, then the next."""
        self._redistribute(now)
        if not self._stopped:
            self._timers.set(_REDISTRIBUTE, now + self._redistribute_interval)

    # ------------------------------------------------------------------ backoff

    def _result(self, success: bool, now: float) -> None:
        """go-nsq's startStopContinueBackoff: one result counts per backoff window."""
        if not self._backoff_enabled or self._stopped:
            return
        if _BACKOFF_END in self._timers:
            return
        level = self._backoff.record(success)
        if level is None:
            return
        if level == 0:
            self._events.append(BackoffChanged(0, 0.0))
            self._rebalance(now)
            return
        duration = self._backoff.duration(level)
        for rec in self._conns.values():
            if rec.rdy:
                self._update_rdy(rec, 0, now)
        self._timers.set(_BACKOFF_END, now + duration)
        self._events.append(BackoffChanged(level, duration))

    # ------------------------------------------------------------------ RDY

    def _per_conn_max_in_flight(self) -> int:
        # go-nsq: min(max(1, max_in_flight / conns), max_in_flight); cached, because it is
        # asked after every answer and changes only when connections come and go
        share = self._share
        if share is None:
            mif = self._max_in_flight
            n = sum(1 for r in self._conns.values() if r.conn.state in ACTIVE) or 1
            share = self._share = min(max(1, mif // n), mif)
        return share

    def _update_rdy(self, rec: RdyConn, count: int, now: float) -> bool:
        """Send RDY ``count`` if the invariants allow it (go-nsq's updateRDY)."""
        conn = rec.conn
        if conn.state not in CAN_RDY:
            return False
        if rec.ordered and count > 1:
            count = 1
        features = conn.features
        max_rdy = features.max_rdy_count if features is not None else DEFAULT_MAX_RDY_COUNT
        count = min(count, max_rdy)
        max_possible = self._max_in_flight - self._total_rdy + rec.rdy
        if 0 < max_possible < count:
            count = max_possible
        if max_possible <= 0 and count > 0:
            self._need_redistribute = True
            return False
        conn.rdy(count)
        self._total_rdy += count - rec.rdy
        rec.rdy = count
        rec.remaining = count
        rec.last_rdy_at = now
        return True

    def _maybe_update_rdy(self, rec: RdyConn, now: float) -> None:
        if self._backoff.level > 0 or self._stopped:
            return
        if _BACKOFF_END in self._timers:
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
        if _BACKOFF_END in self._timers:
            return
        share = self._per_conn_max_in_flight()
        conns = [r for r in self._conns.values() if r.conn.state in CAN_RDY]
        for rec in conns:
            if rec.rdy > share:
                self._update_rdy(rec, share, now)
        if self._total_rdy > self._max_in_flight:
            # more connections than max_in_flight: take RDY back from the idlest ones
            for rec in sorted(conns, key=lambda r: r.last_msg_at):
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
        if self._stopped or _BACKOFF_END in self._timers:
            return
        conns = [r for r in self._conns.values() if r.conn.state in CAN_RDY]
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
