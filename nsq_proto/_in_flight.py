"""The in-flight book of one consumer connection: the deliveries the application holds.

:class:`~nsq_proto.Consumer` keeps one :class:`InFlight` per connection, the way aioquic keeps
the packets it sent in a record only its recovery part changes.  The book holds the newest
delivery of each message id and, for an id nsqd delivered again while an older delivery was
still held (its ``msg_timeout`` passed, or the partitioned server repeated it), how many
deliveries of it are still unanswered: each answer takes one, and the id leaves the book with
the last.  An answer naming an ``attempts`` below the newest delivery's is the answer of an
older copy (stale): it takes its delivery off the book, and the consumer does not send it where
it would act on the newer one.

Inputs: :meth:`~InFlight.deliver` (a delivery to hand to the application),
:meth:`~InFlight.hold` (a delivery held without counting a copy: one given up),
:meth:`~InFlight.take` (an answer: FIN or REQ), :meth:`~InFlight.newest` (a TOUCH: is it the
newest delivery's), :meth:`~InFlight.drop_all` (the connection closed, or everything held is
requeued).  Each names a message the book does not hold with :class:`LocalProtocolError`.

The consumer's per-message paths (a delivery of an id not held, the FIN of an id held once)
do the book's dictionary operation inline on :attr:`~InFlight.held`, without a method call;
every other change goes through these methods.
"""

from __future__ import annotations

from ._errors import LocalProtocolError
from ._events import ConnId
from ._message import Message

__all__ = ["InFlight", "not_in_flight"]


def not_in_flight(msg_id: bytes, conn_id: ConnId) -> LocalProtocolError:
    """The error of an answer to a message the connection's book does not hold."""
    return LocalProtocolError(f"message {msg_id!r} is not in flight on connection {conn_id}")


class InFlight:
    """The deliveries of one connection the application has not answered yet."""

    __slots__ = ("conn_id", "copies", "held")

    def __init__(self, conn_id: ConnId) -> None:
        self.conn_id = conn_id
        #: message id -> its newest delivery on this connection
        self.held: dict[bytes, Message] = {}
        #: ids delivered again while an older delivery was still held -> deliveries unanswered
        self.copies: dict[bytes, int] = {}

    def __len__(self) -> int:
        return len(self.held)

    def __contains__(self, msg_id: bytes) -> bool:
        return msg_id in self.held

    def messages(self) -> tuple[Message, ...]:
        """The newest delivery of each message held, in the order first delivered."""
        return tuple(self.held.values())

    def deliver(self, message: Message) -> None:
        """Hold a delivery; when a copy of it is held already, the newest counts and one more
        answer is owed."""
        msg_id = message.id
        held = self.held
        if msg_id in held:
            copies = self.copies
            copies[msg_id] = copies.get(msg_id, 1) + 1
        held[msg_id] = message

    def hold(self, message: Message) -> None:
        """Hold a delivery in place of any copy held (one given up: the application's answer
        to it is the one owed)."""
        self.held[message.id] = message

    def take(self, msg_id: bytes, attempts: int | None) -> tuple[Message, bool]:
        """Take one delivery of ``msg_id`` off the book: the newest delivery, and whether the
        answer is an older copy's (``attempts`` below the newest delivery's)."""
        held = self.held
        message = held.pop(msg_id, None)
        if message is None:
            raise not_in_flight(msg_id, self.conn_id)
        copies = self.copies
        if copies:
            left = copies.pop(msg_id, 0) - 1
            if left > 0:
                held[msg_id] = message  # another delivery is still unanswered
                if left > 1:
                    copies[msg_id] = left
        return message, attempts is not None and attempts < message.attempts

    def newest(self, msg_id: bytes, attempts: int | None) -> bool:
        """Whether an answer naming ``attempts`` is the newest delivery's (a TOUCH of an older
        copy is not sent); the book is unchanged."""
        message = self.held.get(msg_id)
        if message is None:
            raise not_in_flight(msg_id, self.conn_id)
        return attempts is None or attempts >= message.attempts

    def drop_all(self) -> list[bytes]:
        """Forget every delivery (the connection closed, or all of them are requeued): the ids
        that were held, in the order first delivered."""
        ids = list(self.held)
        self.held.clear()
        self.copies.clear()
        return ids
