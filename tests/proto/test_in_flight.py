"""The in-flight book of one consumer connection (``nsq_proto/_in_flight.py``), alone: what it
holds after deliveries, answers and a requeue of everything, and the error of an answer to a
message it does not hold; then, as a Hypothesis state machine, that any sequence of those keeps
its counts and never loses a delivery that is owed an answer; and the bulk answers' grouping
per connection (``take_many``, ``newest_many``) over plain records."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from nsq_proto import LocalProtocolError, Message
from nsq_proto._in_flight import InFlight, newest_many, take_many


def delivery(n: int, attempts: int = 1) -> Message:
    return Message(f"{n:016d}".encode(), 1, attempts, b"body")


def test_a_delivery_is_held_until_its_answer_takes_it() -> None:
    book = InFlight(3)
    book.deliver(delivery(1))
    book.deliver(delivery(2))
    assert len(book) == 2 and delivery(1).id in book
    assert [m.id for m in book.messages()] == [delivery(1).id, delivery(2).id]
    message, stale = book.take(delivery(1).id, None)
    assert (message.attempts, stale) == (1, False)
    assert len(book) == 1 and delivery(1).id not in book


def test_an_answer_to_a_message_not_held_names_it_and_the_connection() -> None:
    book = InFlight(7)
    with pytest.raises(LocalProtocolError, match=r"message b'x' is not in flight on connection 7"):
        book.take(b"x", None)
    with pytest.raises(LocalProtocolError, match="not in flight on connection 7"):
        book.newest(b"x", None)
    book.deliver(delivery(1))
    book.take(delivery(1).id, None)
    with pytest.raises(LocalProtocolError, match="not in flight"):
        book.take(delivery(1).id, None)  # answered twice


def test_a_copy_delivered_again_owes_one_answer_more_and_the_newest_counts() -> None:
    book = InFlight(1)
    book.deliver(delivery(1, attempts=1))
    book.deliver(delivery(1, attempts=2))  # msg_timeout passed: nsqd delivered it again
    assert len(book) == 1 and book.messages()[0].attempts == 2
    assert book.newest(delivery(1).id, 2) and not book.newest(delivery(1).id, 1)
    message, stale = book.take(delivery(1).id, 1)  # the older copy's answer
    assert (message.attempts, stale) == (2, True)
    assert delivery(1).id in book  # the newer delivery is still owed its answer
    message, stale = book.take(delivery(1).id, 2)
    assert (message.attempts, stale) == (2, False)
    assert len(book) == 0 and not book.copies


def test_hold_replaces_a_copy_without_owing_another_answer() -> None:
    book = InFlight(1)
    book.deliver(delivery(1, attempts=1))
    book.hold(delivery(1, attempts=6))  # given up: the answer to it is the one owed
    assert book.messages()[0].attempts == 6
    book.take(delivery(1).id, None)
    assert len(book) == 0


def test_drop_all_hands_back_every_id_held_once_in_delivery_order() -> None:
    book = InFlight(1)
    for n in (3, 1, 2):
        book.deliver(delivery(n))
    book.deliver(delivery(1, attempts=2))
    assert book.drop_all() == [delivery(3).id, delivery(1).id, delivery(2).id]
    assert len(book) == 0 and not book.copies
    assert book.drop_all() == []


@dataclass
class Record:
    """A connection's record as the bulk answers read it."""

    in_flight: InFlight
    ordered: bool = False


def records(*ordered: bool) -> dict[int, Record]:
    """One record per flag, ids 1, 2, ...; each holding deliveries 1 to 3."""
    recs = {}
    for conn_id, flag in enumerate(ordered, 1):
        book = InFlight(conn_id)
        for n in (1, 2, 3):
            book.deliver(delivery(n))
        recs[conn_id] = Record(book, flag)
    return recs


def test_take_many_groups_the_fins_per_connection_in_the_order_named() -> None:
    recs = records(False, False)
    d1, d2, d3 = delivery(1).id, delivery(2).id, delivery(3).id
    bulk = take_many(recs, [(2, d2, None), (1, d1, 1), (2, d1, None), (9, d1, None)], no_one)
    assert [(rec is recs[c], ids) for c, (rec, ids) in bulk.groups.items()] == [
        (True, [d2, d1]),
        (True, [d1]),
    ]
    assert list(bulk.groups) == [2, 1]  # the connection first named first
    assert (bulk.sent, bulk.fresh, bulk.error) == (3, True, None)  # conn 9 is gone: skipped
    assert [m.id for m in recs[2].in_flight.messages()] == [d3]


def test_take_many_hands_ordered_and_repeated_answers_on_one_by_one() -> None:
    recs = records(True, False)
    recs[2].in_flight.deliver(delivery(2, attempts=2))  # a copy: its book has copies
    d1, d2 = delivery(1).id, delivery(2).id
    singles: list[tuple[int, bytes, int | None]] = []

    def one(conn_id: int, msg_id: bytes, attempts: int | None) -> bool:
        singles.append((conn_id, msg_id, attempts))
        return conn_id == 1

    bulk = take_many(recs, [(1, d1, None), (2, d1, None), (2, d2, 1)], one)
    assert singles == [(1, d1, None), (2, d1, None), (2, d2, 1)]
    assert bulk.groups == {} and bulk.sent == 1 and not bulk.fresh


def test_take_many_goes_on_after_a_message_not_held_and_keeps_the_first_error() -> None:
    recs = records(False, True)
    d1 = delivery(1).id

    def refuse(conn_id: int, msg_id: bytes, attempts: int | None) -> bool:
        raise LocalProtocolError("refused one by one")

    bulk = take_many(recs, [(1, b"x" * 16, None), (2, d1, None), (1, d1, None)], refuse)
    assert bulk.error is not None and "not in flight on connection 1" in str(bulk.error)
    assert [ids for _, ids in bulk.groups.values()] == [[d1]] and bulk.sent == 1


def test_an_older_copys_fin_alone_is_not_fresh() -> None:
    recs = records(False)
    recs[1].in_flight.hold(delivery(1, attempts=3))
    bulk = take_many(recs, [(1, delivery(1).id, 2)], no_one)
    assert bulk.sent == 1 and not bulk.fresh


def test_newest_many_groups_the_touches_of_newest_deliveries_and_changes_no_book() -> None:
    recs = records(False, True)
    recs[2].in_flight.deliver(delivery(2, attempts=2))
    d1, d2 = delivery(1).id, delivery(2).id
    bulk = newest_many(
        recs, [(1, d1, None), (2, d2, 1), (2, d2, 2), (3, d1, None), (1, b"y" * 16, None)]
    )
    assert [(c, ids) for c, (_, ids) in bulk.groups.items()] == [(1, [d1]), (2, [d2])]
    assert bulk.sent == 2  # the older copy (attempts 1) and the gone connection skipped
    assert bulk.error is not None and "not in flight" in str(bulk.error)
    assert len(recs[1].in_flight) == 3 and len(recs[2].in_flight) == 3


def no_one(conn_id: int, msg_id: bytes, attempts: int | None) -> bool:
    raise AssertionError("nothing goes one by one here")


class InFlightBook(RuleBasedStateMachine):
    """A model: per id, the attempts of each delivery still owed an answer, and the newest
    delivery's (the book keeps the newest until the last answer, whichever copy answered)."""

    def __init__(self) -> None:
        super().__init__()
        self.book = InFlight(1)
        self.owed: dict[bytes, list[int]] = {}
        self.newest: dict[bytes, int] = {}
        self.attempts = 0

    @rule(n=st.integers(0, 4))
    def deliver(self, n: int) -> None:
        self.attempts += 1
        message = delivery(n, self.attempts)
        self.book.deliver(message)
        self.owed.setdefault(message.id, []).append(self.attempts)
        self.newest[message.id] = self.attempts

    @precondition(lambda self: bool(self.owed))
    @rule(data=st.data(), name_attempts=st.booleans())
    def answer(self, data: st.DataObject, name_attempts: bool) -> None:
        msg_id = data.draw(st.sampled_from(sorted(self.owed)))
        owed = self.owed[msg_id]
        attempts = data.draw(st.sampled_from(owed)) if name_attempts else None
        message, stale = self.book.take(msg_id, attempts)
        newest = self.newest[msg_id]
        assert message.attempts == newest  # the newest delivery counts
        assert stale == (attempts is not None and attempts < newest)
        owed.remove(attempts if attempts is not None else min(owed))
        if not owed:
            del self.owed[msg_id], self.newest[msg_id]

    @rule(n=st.integers(0, 4))
    def answer_what_is_not_held(self, n: int) -> None:
        msg_id = delivery(n).id
        if msg_id in self.owed:
            return
        with pytest.raises(LocalProtocolError, match="not in flight"):
            self.book.take(msg_id, None)

    @rule()
    def requeue_all(self) -> None:
        assert sorted(self.book.drop_all()) == sorted(self.owed)
        self.owed.clear()
        self.newest.clear()

    @invariant()
    def counts_match(self) -> None:
        book = self.book
        assert len(book) == len(self.owed)
        for message in book.messages():
            assert message.attempts == self.newest[message.id]
        # an id owed n answers keeps n - 1 copies on the books (none when owed one)
        assert book.copies == {i: len(a) for i, a in self.owed.items() if len(a) > 1}


TestInFlightBook = InFlightBook.TestCase
TestInFlightBook.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
