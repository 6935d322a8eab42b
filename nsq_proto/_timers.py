"""Named timers: one deadline per key; setting a key replaces its deadline."""

from __future__ import annotations

from collections.abc import Hashable
from enum import Enum

__all__ = ["TimerKind", "TimerKey", "Timers"]


class TimerKind(Enum):
    """What a timer is for; a :data:`TimerKey` pairs one with an argument."""

    # members are singletons: identity hashing is exact and much cheaper than Enum's
    __hash__ = object.__hash__

    #: poll every lookupd again (the consumer's topic; the producer: the topic of the key)
    LOOKUPD_POLL = "LOOKUPD_POLL"
    #: ask lookupd again soon after a connection was lost (consumer)
    LOOKUPD_RECHECK = "LOOKUPD_RECHECK"
    #: a lookupd HTTP request took too long
    HTTP_TIMEOUT = "HTTP_TIMEOUT"
    #: connect again to an nsqd (the key's argument: its address, with a partition for the
    #: consumer), after the reconnect backoff
    RECONNECT = "RECONNECT"
    #: a graceful stop waited long enough for the application
    STOP_TIMEOUT = "STOP_TIMEOUT"
    #: a publish's retry backoff is over (producer; the key's argument: its request id)
    RETRY = "RETRY"


TimerKey = tuple[TimerKind, Hashable]


class Timers:
    """A small registry; ``pop_due`` returns due keys in deadline order."""

    __slots__ = ("_deadlines",)

    def __init__(self) -> None:
        self._deadlines: dict[TimerKey, float] = {}

    def set(self, key: TimerKey, deadline: float) -> None:
        self._deadlines[key] = deadline

    def cancel(self, key: TimerKey) -> None:
        self._deadlines.pop(key, None)

    def clear(self) -> None:
        """Cancel every timer."""
        self._deadlines.clear()

    def cancel_kind(self, kind: TimerKind) -> None:
        for key in [k for k in self._deadlines if k[0] is kind]:
            del self._deadlines[key]

    def deadline(self, key: TimerKey) -> float | None:
        return self._deadlines.get(key)

    def __contains__(self, key: object) -> bool:
        return key in self._deadlines

    def next_deadline(self) -> float | None:
        return min(self._deadlines.values(), default=None)

    def pop_due(self, now: float) -> list[TimerKey]:
        """Take off every key due at ``now``, in deadline order (ties: in the order set)."""
        return [key for _, key in self.pop_due_timed(now)]

    def pop_due_timed(self, now: float) -> list[tuple[float, TimerKey]]:
        """:meth:`pop_due`, each key with its deadline."""
        due = sorted((d, i, k) for i, (k, d) in enumerate(self._deadlines.items()) if d <= now)
        for _, _, key in due:
            del self._deadlines[key]
        return [(d, key) for d, _, key in due]
