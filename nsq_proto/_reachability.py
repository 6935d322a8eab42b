"""The producer's diagnosis of its nsqd: which places failed how, and whether every place a
publish could go has failed (then a publish fails at once, with the causes, rather than at
its deadline).

A place is an ``(address, slot)`` of the pool.  It knows no connection and no clock: the
producer tells it what happened to each place's connections.
"""

from __future__ import annotations

from ._errors import ConnectionClosedError, NSQError, permanent_cause

__all__ = ["Place", "Reachability"]

#: an nsqd's address and the slot of the pool's connection to it
Place = tuple[tuple[str, int], int]


class Reachability:
    """What the last connection of each place of the pool ended with."""

    __slots__ = ("_permanent", "_unreachable", "failing")

    def __init__(self) -> None:
        #: place -> the permanent failure of its last connection (TLS refused, AUTH failed,
        #: ...); forgotten once a connection there is ready again
        self._permanent: dict[Place, NSQError] = {}
        #: place -> why its last connection attempt failed (refused, no route, dial
        #: timeout); forgotten once a connection there is up again
        self._unreachable: dict[Place, NSQError] = {}
        #: some place failed (what :meth:`diagnosis` then looks at): an attribute, read on
        #: every publish
        self.failing = False

    def connected(self, place: Place) -> None:
        """A connection to ``place`` is up (TCP): it is reachable."""
        if self._unreachable.pop(place, None) is not None:
            self.failing = bool(self._permanent or self._unreachable)

    def ready(self, place: Place) -> None:
        """A connection to ``place`` finished its handshake: no permanent failure there."""
        if self._permanent.pop(place, None) is not None:
            self.failing = bool(self._permanent or self._unreachable)

    def closed(self, place: Place, error: NSQError | None, *, was_connected: bool) -> None:
        """A connection to ``place`` ended, with ``error`` (None: closed cleanly); it had
        ``was_connected`` (else the attempt to connect failed)."""
        if error is None:
            return
        if not was_connected:
            self._unreachable[place] = error
        permanent = permanent_cause(error)
        if permanent is not None:
            self._permanent[place] = permanent
        self.failing = bool(self._permanent or self._unreachable)

    def diagnosis(self, places: set[Place], trying: set[Place]) -> NSQError | None:
        """The failure of a publish that can go to ``places`` only, when no retry can get
        through: the permanent failure when every place has one; or, when every place failed
        its last connection attempt and none is in ``trying`` (a connection there exists or is
        being made), a :class:`ConnectionClosedError` naming each one's cause.  None while
        some place may still take it."""
        permanent = self._permanent
        unreachable = self._unreachable
        if not places or not (permanent or unreachable):
            return None
        if places <= permanent.keys():
            return next(reversed(permanent.values()))
        causes: dict[tuple[str, int], str] = {}
        for place in sorted(places):
            error = permanent.get(place)
            if error is None:
                error = unreachable.get(place)
                if error is None or place in trying:
                    return None  # connected, or an attempt is under way
                cause = error.__cause__ if error.__cause__ is not None else error
            else:
                cause = error
            address = place[0]
            name = f"{address[0]}:{address[1]}"
            text = str(cause)
            causes[address] = text if name in text else f"{name}: {text}"
        failure = ConnectionClosedError(
            f"could not connect to any nsqd: {'; '.join(causes.values())}"
        )
        failure.__cause__ = next(reversed(unreachable.values()))
        return failure
