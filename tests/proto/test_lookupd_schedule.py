"""When the cores ask nsqlookupd (``nsq_proto/_lookupd_schedule.py``), alone: the deadlines it
sets in the core's timers, and its answers when a recheck fires."""

from __future__ import annotations

import random

import pytest

from nsq_proto._lookupd_schedule import LOOKUP_RETRY_DELAY, PollSchedule, RouteRefresh
from nsq_proto._timers import TimerKind, Timers

POLL = (TimerKind.LOOKUPD_POLL, None)
RECHECK = (TimerKind.LOOKUPD_RECHECK, None)


def schedule(
    *, jitter: float = 0.0, enabled: bool = True, seed: int = 1
) -> tuple[PollSchedule, Timers]:
    timers = Timers()
    polls = PollSchedule(
        random.Random(seed),
        timers,
        enabled=enabled,
        interval=60.0,
        jitter=jitter,
        recheck_delay=2.0,
    )
    return polls, timers


@pytest.mark.parametrize("seed", range(20))
def test_the_regular_poll_comes_after_the_interval_and_a_random_share_of_it(seed: int) -> None:
    polls, timers = schedule(jitter=0.3, seed=seed)
    polls.polled(100.0)
    deadline = timers.deadline(POLL)
    assert deadline is not None and 160.0 <= deadline <= 178.0


def test_the_jitter_spreads_consumers_started_together() -> None:
    deadlines = set()
    for seed in range(10):
        polls, timers = schedule(jitter=0.3, seed=seed)
        polls.polled(0.0)
        deadlines.add(timers.deadline(POLL))
    assert len(deadlines) == 10


def test_a_loss_is_rechecked_soon_doubling_until_the_regular_polls_take_over() -> None:
    polls, timers = schedule()
    polls.connection_lost("a:4150", 10.0)
    fired = []
    now = 10.0
    while (deadline := timers.deadline(RECHECK)) is not None:
        fired.append(deadline - now)
        now = deadline
        timers.cancel(RECHECK)
        assert polls.recheck_due(now, connected=set())  # still lost: look up
    # 2, 4, 8, 16, 32 s; 64 s would pass the 60 s poll interval
    assert fired == [2.0, 4.0, 8.0, 16.0, 32.0]
    # the loss is forgotten: the next one starts again at 2 s
    polls.connection_lost("a:4150", now)
    assert timers.deadline(RECHECK) == now + 2.0


def test_a_recheck_asks_nothing_once_the_lost_nsqd_is_back() -> None:
    polls, timers = schedule()
    polls.connection_lost("a:4150", 0.0)
    polls.connection_lost("b:4150", 0.0)
    timers.cancel(RECHECK)
    assert polls.recheck_due(2.0, connected={"a:4150"})  # b is still away
    timers.cancel(RECHECK)
    assert not polls.recheck_due(6.0, connected={"a:4150", "b:4150"})
    assert RECHECK not in timers
    # and the doubling starts over
    polls.connection_lost("a:4150", 7.0)
    assert timers.deadline(RECHECK) == 9.0


def test_one_recheck_at_a_time_a_flapping_nsqd_cannot_speed_it_up() -> None:
    polls, timers = schedule()
    polls.connection_lost("a:4150", 0.0)
    polls.connection_lost("a:4150", 1.0)
    polls.connection_lost("b:4150", 1.5)
    assert timers.deadline(RECHECK) == 2.0


def test_no_nsqd_listed_asks_again_soon_doubling_up_to_the_poll_interval() -> None:
    polls, timers = schedule()
    polls.polled(0.0)
    delays = []
    now = 0.0
    for _ in range(8):
        polls.lookup_answered(consuming=False, now=now)
        deadline = timers.deadline(POLL)
        assert deadline is not None
        delays.append(deadline - now)
        now = deadline
        polls.polled(now)  # the poll went out; the regular one is next
    assert delays == [2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0, 60.0]
    # an nsqd found: the next empty answer starts over at 2 s
    polls.lookup_answered(consuming=True, now=now)
    polls.lookup_answered(consuming=False, now=now)
    assert timers.deadline(POLL) == now + 2.0


def test_no_nsqd_listed_leaves_the_asking_to_a_pending_recheck() -> None:
    polls, timers = schedule()
    polls.polled(0.0)
    polls.connection_lost("a:4150", 0.0)
    polls.lookup_answered(consuming=False, now=0.5)
    assert timers.deadline(POLL) == 60.0
    assert timers.deadline(RECHECK) == 2.0


def test_a_poll_asked_within_a_delay_keeps_a_sooner_one() -> None:
    polls, timers = schedule()
    polls.polled(0.0)
    polls.poll_within(10.0, 1.0)
    assert timers.deadline(POLL) == 11.0
    polls.poll_within(10.5, 5.0)  # later than the one due: no change
    assert timers.deadline(POLL) == 11.0
    polls.poll_within(10.5)
    assert timers.deadline(POLL) == 10.5


def test_without_lookupd_nothing_is_scheduled() -> None:
    polls, timers = schedule(enabled=False)
    polls.poll_within(0.0, 1.0)
    polls.lookup_answered(consuming=False, now=0.0)
    assert timers.next_deadline() is None


def test_a_stopped_schedule_cancels_its_timers_and_sets_no_more() -> None:
    polls, timers = schedule()
    timers.set((TimerKind.RECONNECT, ("a", 1)), 5.0)  # not the schedule's
    polls.polled(0.0)
    polls.connection_lost("a:4150", 0.0)
    polls.stop()
    assert POLL not in timers and RECHECK not in timers
    assert timers.deadline((TimerKind.RECONNECT, ("a", 1))) == 5.0
    polls.poll_within(1.0)
    assert not polls.recheck_due(2.0, connected=set())
    assert POLL not in timers and RECHECK not in timers


def test_a_producer_refreshes_a_route_an_interval_after_an_answer_and_soon_after_a_failure() -> (
    None
):
    timers = Timers()
    refresh = RouteRefresh(timers, interval=60.0)
    refresh.answered("orders", 5.0)
    refresh.failed("clicks", 5.0)
    assert timers.deadline((TimerKind.LOOKUPD_POLL, "orders")) == 65.0
    assert timers.deadline((TimerKind.LOOKUPD_POLL, "clicks")) == 5.0 + LOOKUP_RETRY_DELAY
    refresh.failed("orders", 6.0)  # a failure replaces the later refresh
    assert timers.deadline((TimerKind.LOOKUPD_POLL, "orders")) == 6.0 + LOOKUP_RETRY_DELAY
