"""How a consumer stops: what becomes of each connection, and when the stop gives up waiting.

``stop()`` sends CLS on every subscribed connection and gives no more RDY; nsqd confirms with
``CLOSE_WAIT`` (it sends nothing more), and the connection closes once the application
answered what it holds of it.  A connection not subscribed yet closes at once.  With
``requeue_unanswered`` (the application can answer nothing more) what it holds is requeued at
once, and so is what still arrives, and each connection closes once nsqd confirmed its CLS; at
``stop_timeout`` what is left is requeued and every connection closes.  When requeueing, the
stop also ends once no connection sent a byte for :data:`REQUEUE_GRACE`: nsqd is gone or
stuck, not just slow (its CLOSE_WAIT may come after messages it sent before reading the CLS,
across a long round trip or from a busy machine, and each of those is requeued as it arrives
rather than left in flight at nsqd until ``msg_timeout``).

:class:`StopProcedure` decides, per connection, from the stop's step (:class:`Step`), the
connection's state and how many messages the application holds of it, what to do now
(:class:`Leave`), and what is left to answer (the messages to requeue); it keeps the stop's
deadline (the ``STOP_TIMEOUT`` timer, in the core's timers).  The consumer carries the
decisions out and reports ``Stopped`` once every connection is closed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Final

from ._state import CAN_ANSWER, CAN_RDY, CLOSING_STATES, ConnectionState
from ._timers import TimerKind, Timers

__all__ = [
    "REQUEUE_GRACE",
    "Leave",
    "Step",
    "StopProcedure",
    "closes_now",
    "left_to_answer",
]

#: how long a consumer that can answer nothing more (cancelled) waits for nsqd to confirm its
#: CLS, requeueing what still arrives, after the last byte any connection sent (within
#: ``stop_timeout``), before it closes its connections anyway
REQUEUE_GRACE: Final = 1.0

_STOP_TIMEOUT: Final = (TimerKind.STOP_TIMEOUT, None)


class Step(Enum):
    """A step of the stop, each applied to every connection."""

    # members are singletons: identity hashing is exact and much cheaper than Enum's
    __hash__ = object.__hash__

    #: ``stop()``: CLS, or close what is not subscribed yet
    STOP = "stop"
    #: ``requeue_unanswered``: what is held goes back now; close unless CLS is on its way
    REQUEUE = "requeue"
    #: ``stop_timeout`` passed: what is held goes back, and every connection closes
    TIMEOUT = "timeout"


@dataclass(frozen=True, slots=True)
class Leave:
    """What to do now with one connection of a stopping consumer."""

    #: requeue (at once) every message the application holds of it, first
    requeue: bool = False
    #: send CLS: nsqd confirms with CLOSE_WAIT, and the connection closes once answered
    cls: bool = False
    #: close it now, with this reason (None: not now)
    close: str | None = None


#: nothing now
STAY: Final = Leave()
_CLS: Final = Leave(cls=True)
_CLOSE_STOPPING: Final = Leave(close="consumer stopping")
_REQUEUE: Final = Leave(requeue=True)
_REQUEUE_CLOSE: Final = Leave(requeue=True, close="consumer stopped")
_TIMEOUT: Final = Leave(requeue=True, close="stop timeout")


def closes_now(state: ConnectionState, held: int) -> bool:
    """Whether a connection of a stopping consumer closes now: nsqd confirmed the CLS
    (CLOSE_WAIT: it sends nothing more) and the application holds nothing of it."""
    return state is ConnectionState.CLOSE_WAIT and not held


def left_to_answer(state: ConnectionState, held: Sequence[bytes]) -> Sequence[bytes]:
    """Of the ids held on a connection whose messages go back, those to requeue: all of
    them while the connection can still answer, none once it cannot (nsqd will deliver them
    again after ``msg_timeout``)."""
    return held if state in CAN_ANSWER else ()


class StopProcedure:
    """The stop of one consumer (see the module's docstring)."""

    __slots__ = ("_hurried", "_limit", "_stop_timeout", "_timers")

    def __init__(self, timers: Timers, stop_timeout: float) -> None:
        self._timers = timers
        self._stop_timeout = stop_timeout
        #: when the stop gives up waiting whatever comes (``stop_timeout`` after it began)
        self._limit = math.inf
        self._hurried = False

    def begin(self, now: float) -> None:
        """``stop()`` at ``now``: the stop gives up waiting at ``now + stop_timeout``."""
        self._limit = now + self._stop_timeout
        self._timers.set(_STOP_TIMEOUT, self._limit)

    def hurry(self, now: float) -> None:
        """``requeue_unanswered`` at ``now``: the stop waits :data:`REQUEUE_GRACE` from now
        (never longer than it already would), and as much again after each byte nsqd sends
        (:meth:`heard`), until ``stop_timeout``."""
        self._hurried = True
        self._limit = min(self._limit, now + self._stop_timeout)
        deadline = min(now + REQUEUE_GRACE, self._limit)
        current = self._timers.deadline(_STOP_TIMEOUT)
        if current is None or deadline < current:
            self._timers.set(_STOP_TIMEOUT, deadline)

    def heard(self, now: float) -> None:
        """A connection sent bytes at ``now``: a hurried stop waits :data:`REQUEUE_GRACE` from
        now (nsqd is still sending; its CLOSE_WAIT will come), within ``stop_timeout``."""
        if not self._hurried:
            return
        current = self._timers.deadline(_STOP_TIMEOUT)
        deadline = min(now + REQUEUE_GRACE, self._limit)
        if current is not None and deadline > current:
            self._timers.set(_STOP_TIMEOUT, deadline)

    def done(self) -> None:
        """Every connection is closed: nothing more to wait for."""
        self._timers.cancel_kind(TimerKind.STOP_TIMEOUT)

    @staticmethod
    def leave(step: Step, state: ConnectionState) -> Leave:
        """What ``step`` does to a connection in ``state``."""
        if step is Step.STOP:
            if state in CAN_RDY:
                return _CLS
            return STAY if state in CLOSING_STATES else _CLOSE_STOPPING
        if step is Step.REQUEUE:
            # a connection whose CLS is on its way closes at its CLOSE_WAIT
            return _REQUEUE if state is ConnectionState.CLOSING else _REQUEUE_CLOSE
        return _TIMEOUT
