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

The bulk answers (``finish_many``, ``touch_many``) read the books of several connections:
:func:`take_many` and :func:`newest_many` group the answers per connection (one write each),
take or check each message on its connection's book, and say which answers the consumer sends
one by one instead (the FINs of an ordered connection or of a repeated delivery, through a
callback the consumer gives) and the first error.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Generic, Protocol, TypeVar

from ._errors import LocalProtocolError
from ._events import ConnId
from ._message import Message

__all__ = ["Answer", "Booked", "Bulk", "InFlight", "newest_many", "not_in_flight", "take_many"]

#: one answer of a bulk call: (connection, message id, the delivery's attempts or None)
Answer = tuple[ConnId, bytes, int | None]


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


class Booked(Protocol):
    """A connection's record as the bulk answers read it: its book, and whether it is
    ordered (its answers then go one by one, through its repeats part)."""

    @property
    def in_flight(self) -> InFlight: ...

    @property
    def ordered(self) -> bool: ...


R = TypeVar("R", bound=Booked)


class FinishOne(Protocol):
    """The consumer's ``finish``: one FIN, in its turn; whether it sent one."""

    def __call__(
        self, conn_id: ConnId, msg_id: bytes, now: float, *, attempts: int | None = None
    ) -> bool: ...


class Bulk(Generic[R]):
    """The answers of a bulk call, grouped: per connection (in the order first named) its
    record and the ids to write in one command; how many answers are sent (grouped and one by
    one); whether one of them is a fresh delivery's (not an older copy's); the first error."""

    __slots__ = ("error", "fresh", "groups", "sent")

    def __init__(self) -> None:
        self.groups: dict[ConnId, tuple[R, list[bytes]]] = {}
        self.sent = 0
        self.fresh = False
        self.error: LocalProtocolError | None = None

    def add(self, conn_id: ConnId, rec: R, msg_id: bytes) -> None:
        entry = self.groups.get(conn_id)
        if entry is None:
            entry = self.groups[conn_id] = (rec, [])
        entry[1].append(msg_id)
        self.sent += 1


def take_many(
    records: Mapping[ConnId, R],
    answers: Iterable[Answer],
    one_by_one: Callable[[ConnId, bytes, int | None], bool],
) -> Bulk[R]:
    """FIN grouping: take each answered message off its connection's book, grouped per
    connection.  Answers on a connection that is gone are skipped; those on an ordered
    connection, or on a book holding a repeated delivery, go to ``one_by_one`` (which says
    whether it sent one) in their turn.  A message not held is the error, and the others go
    on."""
    bulk: Bulk[R] = Bulk()
    groups = bulk.groups
    fresh = False
    # the same connection as the answer before (the common case: the answers of one read):
    # its record and ids without a lookup
    last_id: ConnId | None = None
    rec: R | None = None
    ids: list[bytes] | None = None  # the group of ``last_id``, once it has one
    # the book of ``last_id`` while it holds one delivery of each message and keeps no
    # order (each answer then the book's take, inline); None: one by one, or skipped
    held: dict[bytes, Message] | None = None
    for conn_id, msg_id, attempts in answers:
        if conn_id != last_id:
            last_id = conn_id
            rec = records.get(conn_id)
            ids = None
            held = None
            if rec is not None and not rec.ordered and not rec.in_flight.copies:
                held = rec.in_flight.held
        if held is None:
            if rec is not None:
                try:
                    bulk.sent += one_by_one(conn_id, msg_id, attempts)
                except LocalProtocolError as exc:
                    bulk.error = bulk.error or exc
            continue
        message = held.pop(msg_id, None)
        if message is None:
            bulk.error = bulk.error or not_in_flight(msg_id, conn_id)
            continue
        if ids is None:
            assert rec is not None  # (held is its book's)
            entry = groups.get(conn_id)
            if entry is None:
                entry = groups[conn_id] = (rec, [])
            ids = entry[1]
        ids.append(msg_id)
        if not fresh:
            fresh = attempts is None or attempts >= message.attempts
    bulk.fresh = fresh
    bulk.sent += sum(len(taken) for _, taken in groups.values())
    return bulk


def take_delivered(
    rec: R | None,
    conn_id: ConnId,
    messages: Iterable[Message],
    finish: FinishOne,
    now: float,
) -> Bulk[R]:
    """FIN grouping of message objects connection ``conn_id`` (of record ``rec``; None: it is
    gone, nothing is sent) delivered: each taken off its book, in one group, or, when the
    connection is ordered or its book holds a repeated delivery, given to the consumer's
    ``finish(conn_id, msg_id, now, attempts=...)`` (which says whether it sent one) in its
    turn.  A message not held is the error, and the others go on."""
    bulk: Bulk[R] = Bulk()
    if rec is None:
        return bulk
    if rec.ordered or rec.in_flight.copies:
        for answered in messages:
            try:
                bulk.sent += finish(conn_id, answered.id, now, attempts=answered.attempts)
            except LocalProtocolError as exc:
                bulk.error = bulk.error or exc
        return bulk
    held = rec.in_flight.held
    ids: list[bytes] = []
    fresh = False
    for answered in messages:
        msg_id = answered.id
        message = held.pop(msg_id, None)
        if message is None:
            bulk.error = bulk.error or not_in_flight(msg_id, conn_id)
            continue
        ids.append(msg_id)
        if not fresh:
            fresh = message is answered or answered.attempts >= message.attempts
    if ids:
        bulk.groups[conn_id] = (rec, ids)
    bulk.fresh = fresh
    bulk.sent = len(ids)
    return bulk


def newest_many(records: Mapping[ConnId, R], answers: Iterable[Answer]) -> Bulk[R]:
    """TOUCH grouping: each answer of a message held, grouped per connection, skipping those
    on a connection that is gone and older copies' (the newer delivery is the application's);
    the books are unchanged.  A message not held is the error, and the others go on."""
    bulk: Bulk[R] = Bulk()
    for conn_id, msg_id, attempts in answers:
        rec = records.get(conn_id)
        if rec is None:
            continue
        try:
            if not rec.in_flight.newest(msg_id, attempts):
                continue
        except LocalProtocolError as exc:
            bulk.error = bulk.error or exc
            continue
        bulk.add(conn_id, rec, msg_id)
    return bulk
