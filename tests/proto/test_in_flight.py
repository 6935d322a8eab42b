"""The in-flight book of one consumer connection (``nsq_proto/_in_flight.py``), alone: what it
holds after deliveries, answers and a requeue of everything, and the error of an answer to a
message it does not hold; then, as a Hypothesis state machine, that any sequence of those keeps
its counts and never loses a delivery that is owed an answer."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from nsq_proto import LocalProtocolError, Message
from nsq_proto._in_flight import InFlight


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
