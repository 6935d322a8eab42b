"""When a core asks nsqlookupd (what it asks, and how, is :mod:`._lookupd_client`'s).

:class:`PollSchedule` is the consumer's.  It polls the topic every ``lookupd_poll_interval``
plus a random share of it (``lookupd_poll_jitter``), as the client guide asks, so that many
consumers started together do not poll together.  It asks sooner in three cases:

- after a connection found through lookupd was lost: a *recheck* at ``lookupd_recheck_delay``,
  doubling while the lost nsqd stay away, until the delay reaches the poll interval and the
  regular polls take over (go-nsq looks the topic up again right after a close);
- while lookupd lists no nsqd for the topic (a consumer started before its topic): the same
  doubling, so the first nsqd to have the topic is found within seconds;
- at a given delay, when nsqd said the topology changed or lookupd named more lookupd.

:class:`RouteRefresh` is the producer's: a topic's route is looked up again an interval after
an answer, and a second after a failure.

Both keep their deadlines in the core's :class:`~._timers.Timers` (``LOOKUPD_POLL``,
``LOOKUPD_RECHECK``); the core hands those timers back and sends the lookups.
"""

from __future__ import annotations

import random
from collections.abc import Collection
from typing import Final

from ._timers import TimerKind, Timers

__all__ = ["LOOKUP_RETRY_DELAY", "PollSchedule", "RouteRefresh"]

#: seconds before a producer asks again for a route that lookupd did not give
LOOKUP_RETRY_DELAY: Final = 1.0

_POLL: Final = (TimerKind.LOOKUPD_POLL, None)
_RECHECK: Final = (TimerKind.LOOKUPD_RECHECK, None)


class PollSchedule:
    """When a consumer polls lookupd for its topic (see the module's docstring).

    The consumer tells it what happened (:meth:`polled`, :meth:`lookup_answered`,
    :meth:`connection_lost`, :meth:`poll_within`) and asks it, when a ``LOOKUPD_RECHECK``
    timer fires, whether to look up now (:meth:`recheck_due`); a ``LOOKUPD_POLL`` timer always
    means a poll."""

    __slots__ = (
        "_empty_lookups",
        "_enabled",
        "_interval",
        "_jitter",
        "_lost",
        "_recheck_attempt",
        "_recheck_delay",
        "_rng",
        "_stopped",
        "_timers",
    )

    def __init__(
        self,
        rng: random.Random,
        timers: Timers,
        *,
        enabled: bool,
        interval: float,
        jitter: float,
        recheck_delay: float,
    ) -> None:
        #: False without lookupd: nothing is ever scheduled
        self._enabled = enabled
        self._interval = interval
        self._jitter = jitter
        self._recheck_delay = recheck_delay
        self._rng = rng
        self._timers = timers
        #: keys of connections found through lookupd that were lost and have not come back
        self._lost: set[str] = set()
        self._recheck_attempt = 0
        #: lookups in a row that listed no nsqd while the consumer had none
        self._empty_lookups = 0
        self._stopped = False

    def polled(self, now: float) -> None:
        """A poll was sent at ``now``: the next regular one is due after the interval and a
        random share of it."""
        jitter = self._rng.random() * self._jitter * self._interval
        self._timers.set(_POLL, now + self._interval + jitter)

    def poll_within(self, now: float, delay: float = 0.0) -> None:
        """Poll at ``now + delay`` unless a poll is already due sooner."""
        if not self._enabled or self._stopped:
            return
        current = self._timers.deadline(_POLL)
        if current is None or current > now + delay:
            self._timers.set(_POLL, now + delay)

    def lookup_answered(self, consuming: bool, now: float) -> None:
        """A lookup was applied; ``consuming``: the consumer has (or now opens) a connection.

        Without one, lookupd is asked again soon, unless a recheck is already on its way."""
        if consuming:
            self._empty_lookups = 0
        elif _RECHECK not in self._timers:
            delay = self._recheck_delay * 2.0**self._empty_lookups
            if delay < self._interval:
                self._empty_lookups += 1
                jitter = self._rng.random() * self._jitter * delay
                self.poll_within(now, delay + jitter)

    def connection_lost(self, key: str, now: float) -> None:
        """The connection to ``key`` (an nsqd, or a partition on one) found through lookupd
        was lost: look the topic up again soon."""
        self._lost.add(key)
        self._schedule_recheck(now)

    def recheck_due(self, now: float, connected: Collection[str]) -> bool:
        """A ``LOOKUPD_RECHECK`` timer fired: whether to look up now.  ``connected``: the keys
        the consumer is connected (or connecting) to; those are no longer lost."""
        if self._stopped:
            return False
        self._lost.difference_update(connected)
        if not self._lost:
            self._recheck_attempt = 0
            return False
        self._recheck_attempt += 1
        self._schedule_recheck(now)
        return True

    def stop(self) -> None:
        """Nothing more is scheduled, and what was is cancelled."""
        self._stopped = True
        self._timers.cancel_kind(TimerKind.LOOKUPD_POLL)
        self._timers.cancel_kind(TimerKind.LOOKUPD_RECHECK)

    def _schedule_recheck(self, now: float) -> None:
        if _RECHECK in self._timers:
            return  # one recheck at a time: a flapping nsqd cannot speed it up
        delay = self._recheck_delay * 2.0**self._recheck_attempt
        if delay >= self._interval:
            # the regular polls go on from here
            self._lost.clear()
            self._recheck_attempt = 0
            return
        jitter = self._rng.random() * self._jitter * delay
        self._timers.set(_RECHECK, now + delay + jitter)


class RouteRefresh:
    """When a producer looks a topic's route up again: ``interval`` after an answer, and
    :data:`LOOKUP_RETRY_DELAY` after a failure.  The ``LOOKUPD_POLL`` timer's argument is the
    topic."""

    __slots__ = ("_interval", "_timers")

    def __init__(self, timers: Timers, *, interval: float) -> None:
        self._interval = interval
        self._timers = timers

    def answered(self, topic: str, now: float) -> None:
        self._timers.set((TimerKind.LOOKUPD_POLL, topic), now + self._interval)

    def failed(self, topic: str, now: float) -> None:
        self._timers.set((TimerKind.LOOKUPD_POLL, topic), now + LOOKUP_RETRY_DELAY)
