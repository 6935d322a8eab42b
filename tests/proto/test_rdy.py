"""The consumer's RDY planner and backoff (``_rdy.py``) on their own, with no Connection: a
bare :class:`RdyPlanner` fed connection ids and told the time."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from nsq_proto import (
    BackoffChanged,
)
from nsq_proto._rdy import Backoff, ConnRdy, RdyPlanner


class Plan:
    """A bare planner: RDY decisions are recorded per connection id, events in a list."""

    def __init__(self, n: int, max_in_flight: int, **options: float) -> None:
        #: conn id -> the RDY counts sent since the last :meth:`sent` (live connections only)
        self.rdys: dict[int, list[int]] = {}
        #: conn id -> the planner's record of it (the per-message inputs take it)
        self.handles: dict[int, ConnRdy] = {}
        self.events: list[BackoffChanged] = []
        settings: dict[str, float] = {
            "backoff_multiplier": 1.0,
            "max_backoff_duration": 120.0,
            "low_rdy_idle_timeout": 10.0,
            "low_rdy_timeout": 30.0,
            "rdy_redistribute_interval": 5.0,
        }
        settings.update(options)
        self.planner = RdyPlanner(
            random.Random(0),
            send_rdy=self._send_rdy,
            on_event=self.events.append,
            max_in_flight=max_in_flight,
            backoff=True,
            **settings,
        )
        for i in range(1, n + 1):
            self.add(i)

    def _send_rdy(self, conn_id: int, count: int) -> None:
        self.rdys[conn_id].append(count)

    def add(
        self, conn_id: int, max_rdy_count: int = 2500, *, ordered: bool = False, now: float = 0.0
    ) -> int:
        self.rdys[conn_id] = []
        self.handles[conn_id] = self.planner.connection_ready(
            conn_id, now, ordered=ordered, max_rdy_count=max_rdy_count
        )
        return conn_id

    def message(self, conn_id: int, now: float, passed_on: bool = True) -> None:
        self.planner.message_received(self.handles[conn_id], now, passed_on)

    def answered(self, conn_id: int, now: float) -> None:
        self.planner.answered(self.handles[conn_id], now)

    def close(self, conn_id: int, now: float) -> None:
        del self.rdys[conn_id]
        self.planner.connection_closed(conn_id, now)

    def rdy_sent(self, conn_id: int) -> list[int]:
        sent = self.rdys[conn_id]
        self.rdys[conn_id] = []
        return sent

    def sent(self) -> dict[int, list[int]]:
        return {i: self.rdy_sent(i) for i in list(self.rdys)}

    def rdy(self) -> dict[int, int]:
        return {i: self.planner.rdy(i) for i in self.rdys}


def test_backoff_levels_and_windows() -> None:
    backoff = Backoff(multiplier=1.0, max_duration=5.0)
    assert backoff.record(True) is None  # nothing to leave
    assert backoff.record(False) == 1
    assert backoff.duration(1) == 2.0
    assert backoff.record(False) == 2
    assert backoff.duration(3) == 5.0  # capped
    assert backoff.record(True) == 1
    assert backoff.record(True) == 0
    assert backoff.level == 0


def test_new_connections_get_rdy_1_then_their_share() -> None:
    plan = Plan(1, max_in_flight=10)
    assert plan.sent() == {1: [1]}
    plan.add(2)
    # the newcomer's "pre-emptive signal" brought the first (at RDY 1, nothing used since)
    # to the new share of 5; the newcomer starts at RDY 1, as the guide says
    assert plan.sent() == {1: [5], 2: [1]}
    assert plan.planner.total_rdy == 6
    plan.message(2, 1.0, True)  # RDY 1 used up: refill to the share
    assert plan.sent() == {1: [], 2: [5]}
    assert plan.planner.total_rdy == 10


def test_rdy_respects_max_rdy_count_and_max_in_flight() -> None:
    plan = Plan(0, max_in_flight=100)
    rec = plan.add(1, max_rdy_count=3)
    plan.answered(rec, 0.0)
    plan.message(rec, 0.0, True)
    assert plan.rdy_sent(rec) == [1, 3]
    plan.planner.set_max_in_flight(2, 0.0)
    assert plan.rdy_sent(rec) == [2]
    assert plan.planner.total_rdy == 2


def test_a_closed_connection_gives_its_share_back() -> None:
    plan = Plan(2, max_in_flight=4)
    for conn_id in plan.rdys:
        plan.message(conn_id, 1.0, True)
    plan.sent()
    plan.close(2, 2.0)
    assert plan.planner.rdy(2) == 0
    assert plan.sent() == {1: [4]}
    assert plan.planner.total_rdy == 4


def test_failure_opens_a_window_and_one_result_counts_per_window() -> None:
    plan = Plan(2, max_in_flight=4)
    plan.sent()
    plan.planner.failure(1.0)
    assert plan.sent() == {1: [0], 2: [0]}
    assert list(plan.events) == [BackoffChanged(1, 2.0)]
    assert plan.planner.next_deadline() == 3.0  # the window's end
    plan.planner.failure(1.5)  # inside the window: does not count
    plan.planner.success(1.5)
    assert plan.planner.backoff_level == 1
    plan.planner.handle_timer(2.9)  # early: nothing happens
    assert plan.planner.in_backoff_window
    plan.planner.handle_timer(3.0)
    assert plan.planner.next_deadline() is None
    assert sorted(plan.sent().values()) == [[], [1]]  # one connection tests the waters
    plan.planner.success(3.5)
    assert plan.planner.backoff_level == 0
    assert list(plan.events)[-1] == BackoffChanged(0, 0.0)
    assert plan.planner.total_rdy == 4


def test_no_rdy_after_stop() -> None:
    plan = Plan(1, max_in_flight=4)
    plan.planner.start(0.0)
    plan.sent()
    plan.planner.stop()
    assert plan.planner.next_deadline() is None
    plan.message(1, 1.0, True)
    plan.answered(1, 1.0)
    plan.planner.failure(1.0)
    assert plan.sent() == {1: []}
    assert not plan.events


# ---------------------------------------------------------------------- RDY arithmetic, bare


def test_max_in_flight_is_split_over_the_connections_under_each_max_rdy_count() -> None:
    plan = Plan(0, max_in_flight=100)
    plan.add(1, max_rdy_count=10)
    assert plan.sent() == {1: [1]}
    # each newcomer starts at RDY 1 and brings the others (nothing used since their RDY 1)
    # to the new share: 100 // 2, capped at 10 by nsqd's max_rdy_count
    plan.add(2)
    assert plan.sent() == {1: [10], 2: [1]}
    plan.add(3)
    assert plan.sent() == {1: [], 2: [33], 3: [1]}
    plan.add(4, ordered=True)  # share 25
    assert plan.sent() == {1: [], 2: [25], 3: [25], 4: [1]}
    for conn_id in (1, 2, 3, 4):
        plan.message(conn_id, 1.0, True)
    # only the ordered connection ran low, and it never gets more than 1
    assert plan.sent() == {1: [], 2: [], 3: [], 4: [1]}
    assert plan.rdy() == {1: 10, 2: 25, 3: 25, 4: 1}
    assert plan.planner.total_rdy == 61
    # a fifth connection lowers the share to 20: the others above it shrink
    plan.add(5)
    assert plan.sent() == {1: [], 2: [20], 3: [20], 4: [], 5: [1]}
    assert plan.planner.total_rdy == 52


def test_rdy_is_refilled_below_a_quarter_of_the_last_rdy() -> None:
    plan = Plan(1, max_in_flight=8)
    assert plan.sent() == {1: [1]}
    plan.message(1, 1.0, True)
    assert plan.sent() == {1: [8]}
    for n in range(6):  # 8 -> 2 left: not yet below a quarter
        plan.message(1, 1.0 + n, True)
    assert plan.sent() == {1: []}
    plan.message(1, 7.0, True)  # 1 left: refill
    assert plan.sent() == {1: [8]}
    # a message the application never saw (a dropped copy) does not refill, an answer does
    for _ in range(7):
        plan.message(1, 8.0, False)
    assert plan.sent() == {1: []}
    plan.answered(1, 8.0)
    assert plan.sent() == {1: [8]}
    assert plan.planner.last_message_at(1) == 8.0


def test_backoff_windows_grow_and_rdy_1_tests_the_waters() -> None:
    plan = Plan(3, max_in_flight=9, backoff_multiplier=1.0, max_backoff_duration=8.0)
    planner = plan.planner
    planner.start(0.0)
    for conn_id in (1, 2, 3):
        plan.message(conn_id, 0.5, True)
    plan.sent()
    assert planner.next_deadline() == 5.0  # the periodic redistribution
    planner.failure(1.0)
    assert plan.sent() == {1: [0], 2: [0], 3: [0]}
    assert plan.events == [BackoffChanged(1, 2.0)]
    assert planner.next_deadline() == 3.0
    planner.handle_timer(3.0)
    testing = {i: r for i, r in plan.sent().items() if r}
    assert list(testing.values()) == [[1]]  # one connection, RDY 1
    (tester,) = testing
    assert planner.total_rdy == 1
    planner.failure(3.5)  # the test failed: a longer window
    assert plan.events[-1] == BackoffChanged(2, 4.0)
    assert plan.sent()[tester] == [0]
    # the redistribution due inside the window does nothing
    planner.handle_timer(5.0)
    assert plan.sent() == {1: [], 2: [], 3: []}
    assert planner.next_deadline() == 7.5
    planner.handle_timer(7.5)
    assert sum(len(r) for r in plan.sent().values()) == 1
    planner.success(8.0)  # level 2 -> 1: a window of its own
    assert plan.events[-1] == BackoffChanged(1, 2.0)
    assert sorted(plan.sent().values()) == [[], [], [0]]  # the tester's RDY 1 back to 0
    # both due at 10: the redistribution (scheduled first) gives one connection RDY 1, and
    # the window's end finds it given: the waters are tested with one message, not two
    planner.handle_timer(10.0)
    assert sum(len(r) for r in plan.sent().values()) == 1
    assert planner.total_rdy == 1
    assert planner.next_deadline() == 15.0
    planner.success(10.5)
    assert plan.events[-1] == BackoffChanged(0, 0.0)
    assert planner.backoff_level == 0 and not planner.in_backoff_window
    assert planner.total_rdy == 9
    assert sorted(plan.rdy().values()) == [3, 3, 3]


def test_more_connections_than_max_in_flight_rotate_rdy() -> None:
    plan = Plan(0, max_in_flight=2, low_rdy_idle_timeout=10.0, low_rdy_timeout=30.0)
    planner = plan.planner
    planner.start(0.0)
    for conn_id in (1, 2, 3, 4):
        plan.add(conn_id)
    # RDY 1 for the first two; the budget is spent for the others
    assert plan.rdy() == {1: 1, 2: 1, 3: 0, 4: 0}
    assert planner.total_rdy == 2
    given: set[int] = set()
    now = 0.0
    for _ in range(12):
        now = planner.next_deadline() or now
        planner.handle_timer(now)
        assert planner.total_rdy <= 2
        given |= {i for i, r in plan.rdy().items() if r}
    # connections idle longer than low_rdy_idle_timeout gave theirs to the others
    assert given == {1, 2, 3, 4}
    # a busy connection keeps its RDY until low_rdy_timeout
    busy = next(i for i, r in plan.rdy().items() if r)
    for step in range(1, 3):
        plan.message(busy, now + step * 5.0 - 0.1, False)
        plan.planner.handle_timer(now + step * 5.0)
        assert plan.planner.rdy(busy) == 1
    assert plan.planner.next_deadline() == now + 15.0


def test_a_connection_that_cannot_take_rdy_is_skipped_but_counted() -> None:
    plan = Plan(2, max_in_flight=4)
    assert plan.sent() == {1: [1, 2], 2: [1]}
    for conn_id in (1, 2):
        plan.message(conn_id, 1.0, True)
    assert plan.sent() == {1: [2], 2: [2]}
    plan.planner.connection_closing(2)
    plan.planner.connection_closing(99)  # unknown: ignored
    plan.message(2, 1.5, True)
    plan.message(2, 1.5, True)
    plan.planner.set_max_in_flight(2, 1.5)
    # 2 still holds RDY 2 of the 2 allowed: 1 gives its RDY back and cannot grow again
    assert plan.sent() == {1: [0], 2: []}
    assert plan.planner.total_rdy == 2
    plan.close(2, 2.0)
    assert plan.sent() == {1: [2]}  # 2's RDY is free: 1 gets the whole share


def test_readiness_out_of_id_order_keeps_the_id_order() -> None:
    plan = Plan(0, max_in_flight=1)
    plan.add(3)
    plan.add(1)
    plan.add(2)
    assert plan.rdy() == {3: 1, 1: 0, 2: 0}
    plan.planner.set_max_in_flight(0, 1.0)
    plan.planner.set_max_in_flight(1, 1.0)  # granted in id order again
    assert plan.rdy() == {3: 0, 1: 1, 2: 0}


def test_a_stopped_planner_sends_no_rdy_when_max_in_flight_changes_in_backoff() -> None:
    # found by the invariants below: in backoff, a pause (max_in_flight 0) after stop still
    # sent RDY 0 to the connections
    plan = Plan(1, max_in_flight=1)
    plan.planner.failure(0.0)
    assert plan.sent() == {1: [1, 0]}  # ready, then RDY 0 for the backoff window
    deadline = plan.planner.next_deadline()
    assert deadline is not None
    plan.planner.handle_timer(deadline)  # the window ends: RDY 1 tests the waters
    assert plan.sent() == {1: [1]}
    plan.planner.stop()
    for max_in_flight in (0, 3):
        plan.planner.set_max_in_flight(max_in_flight, deadline + 1.0)
    assert plan.sent() == {1: []}


# ---------------------------------------------------------------------- invariants


op_st = st.one_of(
    st.tuples(st.just("ready"), st.integers(1, 8), st.booleans(), st.sampled_from([1, 3, 2500])),
    st.tuples(st.just("closing"), st.integers(1, 8)),
    st.tuples(st.just("closed"), st.integers(1, 8)),
    st.tuples(st.just("message"), st.integers(1, 8), st.booleans()),
    st.tuples(st.just("answered"), st.integers(1, 8)),
    st.tuples(st.just("success")),
    st.tuples(st.just("failure")),
    st.tuples(st.just("max_in_flight"), st.integers(0, 12)),
    st.tuples(st.just("wait"), st.floats(0.0, 40.0)),
    st.tuples(st.just("timer")),
    st.tuples(st.just("stop")),
)


@settings(max_examples=300, deadline=None)
@given(
    ops=st.lists(op_st, max_size=60),
    max_in_flight=st.integers(0, 12),
    seed=st.integers(0, 2**16),
)
def test_rdy_invariants_hold_over_any_sequence_of_inputs(
    ops: list[tuple[object, ...]], max_in_flight: int, seed: int
) -> None:
    """The module docstring's promises: every RDY goes to a connection that can take it,
    within its max_rdy_count (1 when ordered); the counts sum to at most max_in_flight (the
    RDY of a closing connection counts until it is closed); in backoff at most RDY 1, and
    only RDY 0 while a window is open; nothing at all after stop."""
    ready: dict[int, tuple[bool, int]] = {}  # conn id -> (ordered, max_rdy_count)
    closing: set[int] = set()
    last: dict[int, int] = {}
    events: list[BackoffChanged] = []
    state = {"now": 0.0, "stopped": False}

    def send_rdy(conn_id: int, count: int) -> None:
        assert not state["stopped"]
        assert conn_id in ready and conn_id not in closing
        ordered, max_rdy = ready[conn_id]
        assert 0 <= count <= max_rdy
        assert count <= 1 or not ordered
        if planner.in_backoff_window:
            assert count == 0
        if planner.backoff_level > 0:
            assert count <= 1
        last[conn_id] = count

    def on_event(event: BackoffChanged) -> None:
        assert not state["stopped"]
        events.append(event)

    planner = RdyPlanner(
        random.Random(seed),
        send_rdy=send_rdy,
        on_event=on_event,
        max_in_flight=max_in_flight,
        backoff=True,
        backoff_multiplier=1.0,
        max_backoff_duration=16.0,
        low_rdy_idle_timeout=10.0,
        low_rdy_timeout=30.0,
        rdy_redistribute_interval=5.0,
    )
    planner.start(0.0)
    gone: set[int] = set()
    handles: dict[int, ConnRdy] = {}  # closed ones included: a stale handle gets nothing
    for op in ops:
        kind = op[0]
        now = state["now"]
        assert isinstance(now, float)
        if kind == "ready":
            conn_id, ordered, max_rdy = op[1], op[2], op[3]
            assert isinstance(conn_id, int) and isinstance(ordered, bool)
            assert isinstance(max_rdy, int)
            if conn_id in ready or conn_id in gone:
                continue  # ids are not reused
            ready[conn_id] = (ordered, max_rdy)
            last[conn_id] = 0
            handles[conn_id] = planner.connection_ready(
                conn_id, now, ordered=ordered, max_rdy_count=max_rdy
            )
        elif kind == "closing":
            assert isinstance(op[1], int)
            if op[1] in ready:
                closing.add(op[1])
            planner.connection_closing(op[1])
        elif kind == "closed":
            conn_id = op[1]
            assert isinstance(conn_id, int)
            if conn_id in ready:
                del ready[conn_id]
                del last[conn_id]
                closing.discard(conn_id)
                gone.add(conn_id)
            planner.connection_closed(conn_id, now)
        elif kind == "message":
            assert isinstance(op[1], int) and isinstance(op[2], bool)
            if op[1] in handles:
                planner.message_received(handles[op[1]], now, op[2])
        elif kind == "answered":
            assert isinstance(op[1], int)
            if op[1] in handles:
                planner.answered(handles[op[1]], now)
        elif kind == "success":
            planner.success(now)
        elif kind == "failure":
            planner.failure(now)
        elif kind == "max_in_flight":
            assert isinstance(op[1], int)
            planner.set_max_in_flight(op[1], now)
        elif kind == "wait":
            assert isinstance(op[1], float)
            state["now"] = now + op[1]
            planner.handle_timer(now + op[1])
        elif kind == "timer":
            deadline = planner.next_deadline()
            if deadline is not None:
                state["now"] = max(now, deadline)
                planner.handle_timer(max(now, deadline))
        elif kind == "stop":
            planner.stop()
            state["stopped"] = True
            assert planner.next_deadline() is None
        # the planner's books agree with what it sent
        assert {i: planner.rdy(i) for i in ready} == last
        assert planner.total_rdy == sum(last.values())
        held_by_closing = sum(last[i] for i in closing)
        if not state["stopped"]:
            assert planner.total_rdy - held_by_closing <= planner.max_in_flight
            if planner.backoff_level > 0:
                assert planner.total_rdy - held_by_closing <= 1
        deadline = planner.next_deadline()
        assert deadline is None or deadline >= state["now"] or kind not in ("wait", "timer")


def test_a_read_of_many_messages_is_one_rdy_decision() -> None:
    """``count`` messages of one read count down together, and RDY is decided once, after
    them all (nsqd sent them before it could read a RDY of ours anyway)."""
    plan = Plan(1, max_in_flight=100)
    plan.message(1, 0.5)  # RDY 1 used up: the full share
    assert plan.sent() == {1: [1, 100]}
    rec = plan.handles[1]
    # messages set aside count down, and refill nothing
    plan.planner.message_received(rec, 1.0, False, 80)
    assert rec.remaining == 20 and rec.last_msg_at == 1.0
    assert plan.sent() == {1: []}
    # passed on: below a quarter left, one RDY for the whole read
    plan.planner.message_received(rec, 2.0, True, 30)
    assert plan.sent() == {1: [100]}
    assert rec.remaining == 100 and rec.last_msg_at == 2.0
    # plenty left: nothing sent
    plan.planner.message_received(rec, 3.0, True, 50)
    assert plan.sent() == {1: []} and rec.remaining == 50
