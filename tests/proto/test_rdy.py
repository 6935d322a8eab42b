"""The consumer's RDY planner and backoff (``_rdy.py``) through their own small interface, the
reconnect scheduler both cores share, and the base core's ``__init__``."""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass

import pytest

from nsq_proto import (
    BackoffChanged,
    ConfigError,
    Connect,
    Connection,
    Consumer,
    ConsumerConfig,
    Output,
    Producer,
    ProducerConfig,
    Send,
)
from nsq_proto._core import ReconnectScheduler, reconnect_delay
from nsq_proto._rdy import Backoff, RdyPlanner
from nsq_proto._timers import TimerKind, Timers

from .helpers import identify_response, ready_connection, response

BACKOFF_END = (TimerKind.BACKOFF_END, None)


@dataclass
class Rec:
    """The least a connection record needs to be planned for (see ``RdyConn``)."""

    conn: Connection
    ordered: bool = False
    rdy: int = 0
    remaining: int = 0
    last_msg_at: float = 0.0
    last_rdy_at: float = 0.0


def subscribed(max_rdy_count: int = 2500) -> Connection:
    conn = ready_connection()
    if max_rdy_count != 2500:
        conn = Connection(conn.config)
        conn.connection_made(0.0)
        conn.receive_data(identify_response(max_rdy_count=max_rdy_count), 0.0)
        conn.outputs()
    conn.subscribe("t", "c")
    conn.receive_data(response(b"OK"), 0.0)
    conn.outputs()
    return conn


def rdy_sent(rec: Rec) -> list[int]:
    data = b"".join(o.data for o in rec.conn.outputs() if isinstance(o, Send))
    return [int(line[4:]) for line in data.split(b"\n") if line.startswith(b"RDY ")]


class Plan:
    def __init__(self, n: int, max_in_flight: int, **options: float) -> None:
        self.conns: dict[int, Rec] = {}
        self.timers = Timers()
        self.events: deque[Output] = deque()
        settings: dict[str, float] = {
            "backoff_multiplier": 1.0,
            "max_backoff_duration": 120.0,
            "low_rdy_idle_timeout": 10.0,
            "low_rdy_timeout": 30.0,
            "rdy_redistribute_interval": 5.0,
        }
        settings.update(options)
        self.planner = RdyPlanner(
            self.conns,
            self.timers,
            self.events,
            random.Random(0),
            max_in_flight=max_in_flight,
            backoff=True,
            **settings,
        )
        for i in range(1, n + 1):
            self.add(i)

    def add(self, conn_id: int, max_rdy_count: int = 2500) -> Rec:
        rec = self.conns[conn_id] = Rec(subscribed(max_rdy_count))
        self.planner.connection_ready(rec, 0.0)
        return rec

    def sent(self) -> dict[int, list[int]]:
        return {i: rdy_sent(rec) for i, rec in self.conns.items()}


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
    rec = plan.conns[2]
    plan.planner.message_received(rec, 1.0, True)  # RDY 1 used up: refill to the share
    assert plan.sent() == {1: [], 2: [5]}
    assert plan.planner.total_rdy == 10


def test_rdy_respects_max_rdy_count_and_max_in_flight() -> None:
    plan = Plan(0, max_in_flight=100)
    rec = plan.add(1, max_rdy_count=3)
    plan.planner.answered(rec, 0.0)
    plan.planner.message_received(rec, 0.0, True)
    assert rdy_sent(rec) == [1, 3]
    plan.planner.set_max_in_flight(2, 0.0)
    assert rdy_sent(rec) == [2]
    assert plan.planner.total_rdy == 2


def test_a_closed_connection_gives_its_share_back() -> None:
    plan = Plan(2, max_in_flight=4)
    for rec in plan.conns.values():
        plan.planner.message_received(rec, 1.0, True)
    plan.sent()
    gone = plan.conns.pop(2)
    plan.planner.connection_closed(gone, 2.0)
    assert gone.rdy == 0
    assert plan.sent() == {1: [4]}
    assert plan.planner.total_rdy == 4


def test_failure_opens_a_window_and_one_result_counts_per_window() -> None:
    plan = Plan(2, max_in_flight=4)
    plan.sent()
    plan.planner.failure(1.0)
    assert plan.sent() == {1: [0], 2: [0]}
    assert list(plan.events) == [BackoffChanged(1, 2.0)]
    assert plan.timers.deadline(BACKOFF_END) == 3.0
    plan.planner.failure(1.5)  # inside the window: does not count
    plan.planner.success(1.5)
    assert plan.planner.backoff_level == 1
    assert plan.timers.pop_due(3.0) == [BACKOFF_END]
    plan.planner.backoff_window_over(3.0)
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
    assert plan.timers.next_deadline() is None
    rec = plan.conns[1]
    plan.planner.message_received(rec, 1.0, True)
    plan.planner.answered(rec, 1.0)
    plan.planner.failure(1.0)
    assert plan.sent() == {1: []}
    assert not plan.events


def test_reconnect_scheduler_doubles_up_to_the_cap_per_target() -> None:
    scheduler = ReconnectScheduler(random.Random(0), base=1.0, cap=5.0, jitter=0.0)
    assert [scheduler.delay("a") for _ in range(4)] == [1.0, 2.0, 4.0, 5.0]
    assert scheduler.delay("b") == 1.0
    scheduler.connected("a")
    assert scheduler.delay("a") == 1.0
    assert reconnect_delay(2, 1.0, 5.0, 0.5, 1.0) == 1.0


def test_both_cores_share_the_base_init_and_reconnect_scheduler() -> None:
    consumer = Consumer("t", "c", nsqd_tcp_addresses=["n:4150"])
    producer = Producer(nsqd_tcp_addresses=[("n", 4150)])
    for core in (consumer, producer):
        assert isinstance(core._reconnects, ReconnectScheduler)
        assert core._nsqd == [("n", 4150)]
    for make in (
        lambda: Consumer("t", "c"),
        lambda: Producer(),
        lambda: Producer(nsqd_tcp_addresses=["nohost"]),
        lambda: Consumer("t", "c", lookupd_http_addresses=["l:0"]),
    ):
        with pytest.raises(ConfigError):
            make()


def test_producer_reconnects_after_the_scheduler_delay() -> None:
    core = Producer(
        ProducerConfig(reconnect_delay=2.0, reconnect_jitter=0.0),
        nsqd_tcp_addresses=["n:4150"],
    )
    core.start(0.0)
    (connect,) = [o for o in core.outputs() if isinstance(o, Connect)]
    core.connection_lost(connect.conn_id, 10.0, OSError("refused"))
    core.outputs()
    assert core._timers.deadline((TimerKind.RECONNECT, (("n", 4150), 0))) == 12.0


def test_close_connection_takes_now_for_the_reconnect() -> None:
    core = Consumer(
        "t",
        "c",
        ConsumerConfig(reconnect_delay=8.0, reconnect_jitter=0.0),
        nsqd_tcp_addresses=["n:4150"],
    )
    core.start(100.0)
    (connect,) = [o for o in core.outputs() if isinstance(o, Connect)]
    core.connection_made(connect.conn_id, 100.0)
    core.close_connection(connect.conn_id, 200.0)
    core.outputs()
    assert core._timers.deadline((TimerKind.RECONNECT, (("n", 4150), None))) == 208.0


def test_every_timeout_is_an_nsq_timeout_and_a_timeout_error() -> None:
    import pickle

    from nsq_proto import HandshakeTimeout, NSQError, NSQTimeout, PublishTimeout, ReadTimeout
    from nsq_spark import ConnectTimeout

    for kind in (ReadTimeout, HandshakeTimeout, PublishTimeout, ConnectTimeout):
        error = kind("took too long")
        assert isinstance(error, NSQTimeout)
        assert isinstance(error, NSQError) and isinstance(error, TimeoutError)
        assert str(error) == "took too long"
        again = pickle.loads(pickle.dumps(error))
        assert type(again) is kind and str(again) == "took too long"
