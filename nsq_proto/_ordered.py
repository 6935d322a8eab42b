"""The repeats of one ordered (``SUB_ORDERED``) connection to the partitioned server.

On the first ``SUB_ORDERED`` of a channel the server sends the head of its backlog twice (same
id, same attempts), and moves the partition on only once both copies are FINished.  The
application sees one copy: :class:`OrderedRepeats` recognises the other, whenever it comes, and
decides what becomes of it (:class:`Repeat`); the consumer carries the decision out (it sends
the FIN) and counts the repeat as dropped.  The server answers the FIN of a repeat it had
already finished with ``E_FIN_FAILED``: the part expects one per FIN it asked for, and says so
when that error arrives, so that the consumer does not report it.

It keeps three things: the last delivery answered (id, attempts, whether FINished), the held
ids the server sent twice, and the count of repeat FINs whose ``E_FIN_FAILED`` may still come.
"""

from __future__ import annotations

from enum import Enum

from ._message import Message

__all__ = ["OrderedRepeats", "Repeat"]


class Repeat(Enum):
    """What becomes of a delivery on an ordered connection."""

    # members are singletons: identity hashing is exact and much cheaper than Enum's
    __hash__ = object.__hash__

    #: not a repeat: hand it to the application
    NONE = "none"
    #: a second copy of a delivery the application holds: dropped, FINished with the first
    HELD = "held"
    #: a copy of the delivery the application FINished last: dropped, FIN it now
    FIN = "fin"
    #: a copy of the delivery the application requeued last: dropped (the server delivers the
    #: message again anyway)
    REQUEUED = "requeued"


class OrderedRepeats:
    """The repeat books of one ordered connection."""

    __slots__ = ("_fins", "_last", "_repeated")

    def __init__(self) -> None:
        #: (id, attempts, finished) of the delivery answered last
        self._last: tuple[bytes, int, bool] | None = None
        #: held ids the server sent twice: the server waits for two FINs
        self._repeated: set[bytes] = set()
        #: FINs of a repeat sent: their E_FIN_FAILED answers are expected, not reported
        self._fins = 0

    def delivered(self, held: Message | None, message: Message) -> Repeat:
        """A delivery arrived; ``held`` is the delivery of the same id the application holds."""
        if held is not None and held.attempts == message.attempts:
            self._repeated.add(message.id)
            return Repeat.HELD
        last = self._last
        if last is not None and last[0] == message.id and last[1] == message.attempts:
            if last[2]:
                self._fins += 1
                return Repeat.FIN
            return Repeat.REQUEUED
        return Repeat.NONE

    def answered(self, msg_id: bytes, attempts: int) -> None:
        """The application answered (FIN or REQ) the delivery of ``msg_id`` with ``attempts``."""
        self._last = (msg_id, attempts, False)

    def finished(self, msg_id: bytes) -> bool:
        """The answer was a FIN: whether the repeat of it must be FINished too (it was
        delivered twice while held)."""
        last = self._last
        if last is not None and last[0] == msg_id:
            self._last = (msg_id, last[1], True)
        if msg_id in self._repeated:
            self._repeated.discard(msg_id)
            self._fins += 1
            return True
        return False

    def fin_failed(self) -> bool:
        """``E_FIN_FAILED`` arrived: whether it answers the FIN of a repeat (not reported)."""
        if self._fins:
            self._fins -= 1
            return True
        return False
