"""A consumer's stop procedure (``nsq_proto/_stopping.py``), alone: what each step of the stop
does to a connection in each state, when a connection closes, what is left to answer, and the
stop's deadline; then, through the consumer, a stop that waits for the application's answers,
one that requeues what it holds, and one that times out."""

from __future__ import annotations

from typing import Any

import pytest

from nsq_proto import ConnectionClosed, Consumer, Stopped
from nsq_proto._outputs import Close
from nsq_proto._state import CAN_ANSWER, CAN_RDY, CLOSING_STATES, ConnectionState
from nsq_proto._stopping import (
    REQUEUE_GRACE,
    STAY,
    Leave,
    Step,
    StopProcedure,
    closes_now,
    left_to_answer,
)
from nsq_proto._timers import TimerKind, Timers

from .helpers import consumer, message, mid, of_type, response, sent_on

STOP_TIMEOUT = (TimerKind.STOP_TIMEOUT, None)


@pytest.mark.parametrize("state", list(ConnectionState))
def test_stop_sends_cls_where_subscribed_and_closes_what_is_not_yet(
    state: ConnectionState,
) -> None:
    leave = StopProcedure.leave(Step.STOP, state)
    if state in CAN_RDY:
        assert leave == Leave(cls=True)
    elif state in CLOSING_STATES:
        assert leave is STAY  # closing already
    else:
        assert leave == Leave(close="consumer stopping")


@pytest.mark.parametrize("state", list(ConnectionState))
def test_requeueing_sends_back_what_is_held_and_closes_unless_cls_is_on_its_way(
    state: ConnectionState,
) -> None:
    leave = StopProcedure.leave(Step.REQUEUE, state)
    assert leave.requeue and not leave.cls
    expected = None if state is ConnectionState.CLOSING else "consumer stopped"
    assert leave.close == expected


@pytest.mark.parametrize("state", list(ConnectionState))
def test_the_timeout_sends_back_what_is_held_and_closes_everything(
    state: ConnectionState,
) -> None:
    assert StopProcedure.leave(Step.TIMEOUT, state) == Leave(requeue=True, close="stop timeout")


def test_a_connection_closes_once_nsqd_confirmed_the_cls_and_nothing_is_held() -> None:
    assert closes_now(ConnectionState.CLOSE_WAIT, 0)
    assert not closes_now(ConnectionState.CLOSE_WAIT, 1)
    for state in ConnectionState:
        if state is not ConnectionState.CLOSE_WAIT:
            assert not closes_now(state, 0)


@pytest.mark.parametrize("state", list(ConnectionState))
def test_what_is_left_to_answer_is_requeued_only_where_it_can_be(
    state: ConnectionState,
) -> None:
    ids = [b"a" * 16, b"b" * 16]
    assert list(left_to_answer(state, ids)) == (ids if state in CAN_ANSWER else [])


def test_the_deadline_is_the_stop_timeout_shortened_by_a_requeue() -> None:
    timers = Timers()
    stop = StopProcedure(timers, stop_timeout=30.0)
    stop.begin(10.0)
    assert timers.deadline(STOP_TIMEOUT) == 40.0
    stop.hurry(12.0)
    assert timers.deadline(STOP_TIMEOUT) == 12.0 + REQUEUE_GRACE
    stop.hurry(12.5)  # never later than it already is
    assert timers.deadline(STOP_TIMEOUT) == 12.0 + REQUEUE_GRACE
    stop.done()
    assert timers.next_deadline() is None
    short = StopProcedure(timers, stop_timeout=0.25)
    short.hurry(1.0)  # a requeue before any stop: the stop timeout if shorter than the grace
    assert timers.deadline(STOP_TIMEOUT) == 1.25


def test_a_requeueing_stop_waits_the_grace_after_each_byte_within_the_stop_timeout() -> None:
    timers = Timers()
    stop = StopProcedure(timers, stop_timeout=3.0)
    stop.begin(10.0)
    stop.heard(10.5)  # a graceful stop waits for the application, not for bytes
    assert timers.deadline(STOP_TIMEOUT) == 13.0
    stop.hurry(11.0)
    assert timers.deadline(STOP_TIMEOUT) == 11.0 + REQUEUE_GRACE
    stop.heard(11.5)  # nsqd still sends: its CLOSE_WAIT will come
    assert timers.deadline(STOP_TIMEOUT) == 11.5 + REQUEUE_GRACE
    stop.heard(11.2)  # never earlier than it already is
    assert timers.deadline(STOP_TIMEOUT) == 11.5 + REQUEUE_GRACE
    stop.heard(12.8)  # never past stop_timeout after the stop began
    assert timers.deadline(STOP_TIMEOUT) == 13.0
    stop.done()
    stop.heard(12.9)  # nothing to wait for any more
    assert timers.next_deadline() is None
    late = StopProcedure(timers, stop_timeout=3.0)
    late.hurry(20.0)  # a requeue before any stop: stop_timeout from then
    late.heard(22.5)
    assert timers.deadline(STOP_TIMEOUT) == 23.0


def test_a_requeueing_stop_reads_on_while_nsqd_sends_and_closes_on_its_silence() -> None:
    core, conn = held_one(stop_timeout=30.0)
    core.stop(2.0, requeue_unanswered=True)
    core.outputs()
    # what nsqd sent before it read the CLS keeps coming, each piece within the grace
    t = 2.0
    for k in range(2, 6):
        t += REQUEUE_GRACE * 0.9
        core.handle_timer(t)
        assert not core.stopped
        core.receive_data(conn, message(mid(k), b"x"), t)
        assert sent_on(core.outputs(), conn) == b"REQ " + mid(k) + b" 0\n"
    assert core.next_deadline() == pytest.approx(t + REQUEUE_GRACE)
    # then nothing, not even the CLOSE_WAIT: closed after the grace
    core.handle_timer(t + REQUEUE_GRACE)
    outputs = core.outputs()
    assert [o.reason for o in of_type(outputs, Close)] == ["stop timeout"]
    assert of_type(outputs, Stopped) == [Stopped()] and core.messages_requeued == 5


def held_one(**config: Any) -> tuple[Consumer, int]:
    core, (conn,) = consumer(**config)
    core.receive_data(conn, message(mid(1), b"x"), 1.0)
    core.outputs()
    return core, conn


def test_a_stop_waits_for_the_answer_then_closes_on_close_wait() -> None:
    core, conn = held_one()
    core.stop(2.0)
    assert sent_on(core.outputs(), conn) == b"CLS\n"
    core.receive_data(conn, response(b"CLOSE_WAIT"), 2.1)
    assert not core.stopped  # the application still holds its message
    core.finish(conn, mid(1), 2.2)
    outputs = core.outputs()
    assert sent_on(outputs, conn) == b"FIN " + mid(1) + b"\n"
    assert len(of_type(outputs, ConnectionClosed)) == 1
    assert of_type(outputs, Stopped) == [Stopped()] and core.stopped


def test_a_requeueing_stop_sends_back_what_is_held_at_once() -> None:
    core, conn = held_one()
    core.stop(2.0, requeue_unanswered=True)
    outputs = core.outputs()
    assert sent_on(outputs, conn) == b"CLS\nREQ " + mid(1) + b" 0\n"
    assert core.messages_requeued == 1 and core.in_flight_count(conn) == 0
    assert core.next_deadline() == pytest.approx(2.0 + REQUEUE_GRACE)


def test_a_stop_that_times_out_requeues_what_is_held_and_closes() -> None:
    core, conn = held_one(stop_timeout=5.0)
    core.stop(2.0)
    core.outputs()
    core.handle_timer(6.9)
    assert not core.stopped
    core.handle_timer(7.0)
    outputs = core.outputs()
    assert sent_on(outputs, conn) == b"REQ " + mid(1) + b" 0\n"
    assert of_type(outputs, Stopped) == [Stopped()] and core.messages_requeued == 1
