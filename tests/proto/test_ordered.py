"""The repeats of an ordered connection (``nsq_proto/_ordered.py``), alone: which deliveries
are the partitioned server's repeat of its backlog's head, the FIN each one needs, and which
``E_FIN_FAILED`` answers are expected.  The consumer's side of it, against the emulated server,
is in ``test_consumer_producer_x_emulator.py``."""

from __future__ import annotations

from nsq_proto import Message
from nsq_proto._ordered import OrderedRepeats, Repeat


def delivery(n: int, attempts: int = 1) -> Message:
    return Message(f"{n:016d}".encode(), 1, attempts, b"body")


def test_a_first_delivery_is_no_repeat() -> None:
    repeats = OrderedRepeats()
    assert repeats.delivered(None, delivery(1)) is Repeat.NONE
    assert not repeats.fin_failed()  # no FIN of a repeat was asked for


def test_the_copy_of_a_held_delivery_is_finished_with_it() -> None:
    repeats = OrderedRepeats()
    first = delivery(1)
    assert repeats.delivered(first, delivery(1)) is Repeat.HELD
    repeats.answered(first.id, 1)
    assert repeats.finished(first.id)  # the server waits for a second FIN
    assert repeats.fin_failed()  # and answers it E_FIN_FAILED: expected once
    assert not repeats.fin_failed()
    assert not repeats.finished(first.id)  # one repeat, one FIN


def test_a_copy_arriving_after_the_fin_is_finished_at_once() -> None:
    repeats = OrderedRepeats()
    assert repeats.delivered(None, delivery(1)) is Repeat.NONE
    repeats.answered(delivery(1).id, 1)
    assert not repeats.finished(delivery(1).id)  # no copy yet: one FIN
    assert repeats.delivered(None, delivery(1)) is Repeat.FIN
    assert repeats.fin_failed() and not repeats.fin_failed()


def test_a_copy_of_a_requeued_delivery_is_dropped_without_a_fin() -> None:
    repeats = OrderedRepeats()
    repeats.answered(delivery(1).id, 1)  # a REQ: answered, not finished
    assert repeats.delivered(None, delivery(1)) is Repeat.REQUEUED
    assert not repeats.fin_failed()


def test_a_redelivery_with_more_attempts_is_the_message_again_not_a_repeat() -> None:
    repeats = OrderedRepeats()
    repeats.answered(delivery(1).id, 1)
    repeats.finished(delivery(1).id)
    assert repeats.delivered(None, delivery(1, attempts=2)) is Repeat.NONE
    held = delivery(2, attempts=1)
    assert repeats.delivered(held, delivery(2, attempts=2)) is Repeat.NONE
    assert repeats.delivered(None, delivery(3)) is Repeat.NONE  # another message


def test_only_the_last_answer_is_remembered() -> None:
    repeats = OrderedRepeats()
    repeats.answered(delivery(1).id, 1)
    repeats.finished(delivery(1).id)
    repeats.answered(delivery(2).id, 1)
    assert repeats.delivered(None, delivery(1)) is Repeat.NONE
    assert not repeats.finished(delivery(1).id)  # not the last answered: nothing changes
    assert repeats.delivered(None, delivery(2)) is Repeat.REQUEUED
