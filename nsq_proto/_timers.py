"""Named timers: one deadline per key; setting a key replaces its deadline."""

from __future__ import annotations

from collections.abc import Hashable
from enum import Enum

__all__ = ["TimerKind", "TimerKey", "Timers"]


class TimerKind(Enum):
    """What a timer is for; a :data:`TimerKey` pairs one with an argument."""

    # members are singletons: identity hashing is exact and much cheaper than Enum's
    __hash__ = object.__hash__

    #: look the topic up on every lookupd again (the consumer: its topic, argument None; the
    #: producer: the key's argument, a topic it publishes to)
    LOOKUPD_POLL = "LOOKUPD_POLL"
    #: ask lookupd again soon after a connection was lost (consumer; argument None)
    LOOKUPD_RECHECK = "LOOKUPD_RECHECK"
    #: an HTTP call (to lookupd, or to nsqd's HTTP API) took too long: set and cancelled by
    #: the core's LookupdClient (the key's argument: the call's request id)
    HTTP_TIMEOUT = "HTTP_TIMEOUT"
    #: connect again after the reconnect backoff; the key's argument names the target: the
    #: consumer's ``(address, partition or None)``, the producer's ``(address, pool slot)``
    RECONNECT = "RECONNECT"
    #: a graceful stop waited long enough for the application (consumer; argument None)
    STOP_TIMEOUT = "STOP_TIMEOUT"
    #: a publish's retry backoff is over (producer; the key's argument: its request id); the
    #: dispatch that follows every timer sends it
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
