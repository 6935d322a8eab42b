"""A consumer's discovery (``nsq_proto/_discovery.py``), alone: the targets of the fixed list and
of a lookup answer, a target connected to once, how a lost target comes back (a reconnect
timer, a lookupd recheck, or neither), what nsqd's errors change, and the lookupd calls it
sends and stops.  The consumer's side is in ``test_consumer.py``."""

from __future__ import annotations

import random
from types import MappingProxyType
from typing import Any

import pytest

from nsq_proto import (
    ConfigError,
    ConsumerConfig,
    HttpRequest,
    LookupFailed,
    LookupSucceeded,
    Output,
    StartFrom,
    StartFromFailed,
)
from nsq_proto._core import ReconnectScheduler
from nsq_proto._discovery import AfterLoss, Discovery, Target, target_key
from nsq_proto._lookupd import LookupResult, Peer, TopicMeta
from nsq_proto._timers import TimerKind, Timers

from .helpers import (
    PARTITIONED_LOOKUP,
    http_response,
    of_type,
    requests_by_target,
    standard_lookup,
)

N1 = ("n1", 4150)
N2 = ("n2", 4150)


def nsqd(host: str) -> Peer:
    return Peer(broadcast_address=host, tcp_port=4150, http_port=4151, hostname=host, version="1")


class Setup:
    """A discovery with its timers, and what it handed back: connects and outputs."""

    def __init__(
        self,
        nsqd: tuple[tuple[str, int], ...] = (),
        lookupd: tuple[tuple[str, int], ...] = (),
        **config: Any,
    ) -> None:
        self.timers = Timers()
        self.connects: list[tuple[tuple[str, int], int | None, bool]] = []
        self.sent: list[Output] = []
        self.discovery = Discovery(
            "t",
            "c",
            ConsumerConfig(reconnect_jitter=0.0, lookupd_poll_jitter=0.0, **config),
            list(nsqd),
            list(lookupd),
            rng=random.Random(0),
            timers=self.timers,
            reconnects=ReconnectScheduler(random.Random(0), 1.0, 8.0, 0.0),
            connect=lambda address, partition, extend: self.connects.append(
                (address, partition, extend)
            ),
            send=self.sent.append,
        )

    def lookups(self) -> list[HttpRequest]:
        """The HTTP requests sent since last asked (taken off ``sent``)."""
        requests = of_type(self.sent, HttpRequest)
        self.sent[:] = [o for o in self.sent if not isinstance(o, HttpRequest)]
        return requests


def test_the_fixed_list_is_one_target_per_nsqd_or_per_configured_partition() -> None:
    plain = Setup(nsqd=(N1, N2))
    plain.discovery.start(0.0)
    assert plain.connects == [(N1, None, False), (N2, None, False)]
    assert plain.sent == [] and plain.timers.next_deadline() is None  # no lookupd: no poll
    pinned = Setup(nsqd=(N1,), partitions=(0, 2))
    pinned.discovery.start(0.0)
    assert pinned.connects == [(N1, 0, False), (N1, 2, False)]


def test_ordered_with_a_fixed_list_needs_partitions_or_lookupd() -> None:
    with pytest.raises(ConfigError, match=r"ordered=True with nsqd_tcp_addresses needs"):
        Setup(nsqd=(N1,), ordered=True)
    Setup(nsqd=(N1,), ordered=True, partitions=(0,))
    Setup(nsqd=(N1,), lookupd=(("l", 4161),), ordered=True)


def test_a_target_is_connected_to_once_and_free_again_after_its_loss() -> None:
    d = Setup(nsqd=(N1,)).discovery
    assert target_key(N1, None) == "n1:4150" and target_key(N1, 3) == "n1:4150-3"
    key = d.wanted(N1, 3)
    assert key == "n1:4150-3"
    d.connecting(key, 7)
    assert d.wanted(N1, 3) is None and d.wanted(N1, None) == "n1:4150"
    d.lost(key, 8)  # another connection's loss: the target stays taken
    assert d.wanted(N1, 3) is None
    d.lost(key, 7)
    assert d.wanted(N1, 3) == key


def test_a_lost_target_of_the_fixed_list_reconnects_after_a_doubling_delay() -> None:
    s = Setup(nsqd=(N1,))
    d = s.discovery
    timer = (TimerKind.RECONNECT, (N1, None))
    assert d.replace("n1:4150", N1, None, 10.0) is AfterLoss.RECONNECT
    assert s.timers.deadline(timer) == 11.0
    assert d.replace("n1:4150", N1, None, 20.0) is AfterLoss.RECONNECT
    assert s.timers.deadline(timer) == 22.0
    d.connected(N1, None)  # the handshake completed: the next loss waits 1 s again
    d.replace("n1:4150", N1, None, 30.0)
    assert s.timers.deadline(timer) == 31.0


def test_a_lost_target_found_through_lookupd_comes_back_only_if_listed_again() -> None:
    s = Setup(lookupd=(("l", 4161),), lookupd_recheck_delay=2.0, lookupd_poll_interval=60.0)
    d = s.discovery
    assert d.replace("n2:4150", N2, None, 10.0) is AfterLoss.RECHECK
    assert s.timers.deadline((TimerKind.LOOKUPD_RECHECK, None)) == 12.0
    assert (TimerKind.RECONNECT, (N2, None)) not in s.timers
    d.recheck(12.0)  # still away: asked again
    assert [r.host for r in s.lookups()] == ["l"]
    d.connecting("n2:4150", 5)  # listed again and connected: the next recheck asks nothing
    d.recheck(20.0)
    assert s.lookups() == []


def test_a_target_of_neither_kind_is_gone_after_its_loss() -> None:
    s = Setup(nsqd=(N1,))
    assert s.discovery.replace("n2:4150", N2, None, 1.0) is AfterLoss.GONE
    assert s.timers.next_deadline() is None


def test_a_lookup_plans_the_partitions_leaders_then_the_other_nsqd() -> None:
    s = Setup(lookupd=(("l", 4161),))
    result = LookupResult(
        producers=(nsqd("n1"), nsqd("n3")),
        partitions=MappingProxyType({1: nsqd("n2"), 0: nsqd("n1")}),
        meta=TopicMeta(partition_num=2, replica=1, extend_support=True),
    )
    plan = s.discovery.plan(result, 0.0)
    assert plan.keys == ("n1:4150-0", "n2:4150-1", "n3:4150")
    assert plan.targets == (
        Target(N1, 0, True, nsqd("n1")),
        Target(N2, 1, True, nsqd("n2")),
        Target(("n3", 4150)),  # n1 is listed with partitions: not again without
    )
    assert s.discovery.extend_support and not s.discovery.ordered(0)


def test_a_consumer_pinned_to_partitions_plans_only_those() -> None:
    s = Setup(lookupd=(("l", 4161),), partitions=(1,))
    result = LookupResult(
        producers=(nsqd("n3"),),
        partitions=MappingProxyType({0: nsqd("n1"), 1: nsqd("n2")}),
    )
    plan = s.discovery.plan(result, 0.0)
    assert plan.keys == ("n2:4150-1",)
    assert [(t.address, t.partition) for t in plan.targets] == [(N2, 1)]


def test_an_ordered_topic_or_nsqds_demand_makes_every_partition_ordered() -> None:
    s = Setup(lookupd=(("l", 4161),), lookupd_poll_interval=60.0)
    d = s.discovery
    assert not d.ordered(0)
    d.plan(LookupResult(meta=TopicMeta(partition_num=1, replica=1, ordered=True)), 0.0)
    assert d.ordered(0) and not d.ordered(None)  # a target without partition: plain SUB
    s = Setup(lookupd=(("l", 4161),), lookupd_poll_interval=60.0)
    d = s.discovery
    d.poll(0.0)
    d.nsqd_error("E_SUB_ORDER_IS_MUST", 5.0)
    assert d.ordered(0)
    assert s.timers.deadline((TimerKind.LOOKUPD_POLL, None)) == 6.0  # asked again 1 s later


def test_an_error_that_changes_nothing_schedules_nothing() -> None:
    s = Setup(lookupd=(("l", 4161),), lookupd_poll_interval=60.0)
    s.discovery.poll(0.0)
    s.discovery.nsqd_error("E_FIN_FAILED", 5.0)
    assert s.timers.deadline((TimerKind.LOOKUPD_POLL, None)) == 60.0
    assert not s.discovery.ordered(0)


def test_a_lookup_answer_connects_its_targets_and_reports_them() -> None:
    s = Setup(lookupd=(("l", 4161),))
    s.discovery.start(0.0)
    (request,) = s.lookups()
    s.discovery.http_data(request.request_id, http_response(standard_lookup("n1", "n2")), 0.1)
    s.discovery.http_data(request.request_id, b"", 0.1)
    assert s.connects == [(N1, None, False), (N2, None, False)]
    assert s.sent == [LookupSucceeded(("l", 4161), ("n1:4150", "n2:4150"), True)]


def test_a_partition_with_a_start_position_is_connected_once_the_position_is_set() -> None:
    s = Setup(lookupd=(("l", 4161),), start_from=StartFrom.message_count(5))
    s.discovery.poll(0.0)
    (request,) = s.lookups()
    s.discovery.http_data(request.request_id, http_response(PARTITIONED_LOOKUP), 0.1)
    s.discovery.http_data(request.request_id, b"", 0.1)
    assert s.connects == []  # both partitions wait for their position
    seeks = requests_by_target(s.sent)
    assert {("n1", "/channel/setoffset"), ("n2", "/channel/setoffset")} <= set(seeks)
    s.sent.clear()
    seek = seeks[("n2", "/channel/setoffset")]
    s.discovery.http_data(seek.request_id, http_response(b"{}"), 0.2)
    s.discovery.http_data(seek.request_id, b"", 0.2)
    assert s.connects == [(N2, 1, False)]


def test_a_partition_whose_position_could_not_be_set_is_not_connected() -> None:
    s = Setup(lookupd=(("l", 4161),), start_from=StartFrom.message_count(5))
    s.discovery.poll(0.0)
    (request,) = s.lookups()
    s.discovery.http_data(request.request_id, http_response(PARTITIONED_LOOKUP), 0.1)
    s.discovery.http_data(request.request_id, b"", 0.1)
    seeks = requests_by_target(s.sent)
    s.sent.clear()
    missing = seeks[("n1", "/channel/setoffset")]
    answer = http_response(b"CHANNEL_NOT_FOUND", b"404 Not Found")
    s.discovery.http_data(missing.request_id, answer, 0.2)
    s.discovery.http_data(missing.request_id, b"", 0.2)
    assert list(requests_by_target(s.sent)) == [("n1", "/channel/create")]  # nothing decided
    s.sent.clear()
    failing = seeks[("n2", "/channel/setoffset")]
    s.discovery.http_failed(failing.request_id, OSError("refused"), 0.3)
    (failed,) = s.sent
    assert isinstance(failed, StartFromFailed) and failed.partition == 1
    assert s.connects == []


def test_a_failed_lookup_and_a_timed_out_one_are_reported() -> None:
    s = Setup(lookupd=(("l", 4161),), lookupd_poll_timeout=1.0)
    s.discovery.poll(0.0)
    (first,) = s.lookups()
    s.discovery.http_failed(first.request_id, OSError("refused"), 0.5)
    s.discovery.poll(2.0)
    (second,) = s.lookups()
    s.discovery.http_timed_out(second.request_id, 3.0)
    failed = of_type(s.sent, LookupFailed)
    assert [f.address for f in failed] == [("l", 4161), ("l", 4161)]


def test_once_stopped_nothing_is_asked_and_the_calls_out_are_cancelled() -> None:
    s = Setup(nsqd=(N1,), lookupd=(("l", 4161),))
    d = s.discovery
    d.start(0.0)
    (request,) = s.lookups()
    d.replace("n1:4150", N1, None, 1.0)
    d.stop(2.0)
    (cancelled,) = of_type(s.sent, LookupFailed)
    assert "consumer stopping" in str(cancelled.error)
    assert s.timers.next_deadline() is None  # no poll, no recheck, no reconnect
    s.sent.clear()
    d.poll(3.0)
    d.poll_within(3.0)
    assert s.sent == [] and s.timers.next_deadline() is None
    d.http_data(request.request_id, http_response(standard_lookup("n2")), 3.0)
    assert s.connects == [(N1, None, False)]  # the fixed list's start only
