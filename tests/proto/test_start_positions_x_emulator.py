"""The consumer's start positions (``_start_positions.py``) against the emulator's partitioned
cluster, in memory on a virtual clock: a 2-partition topic with a backlog, consumed from the
positions given."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from nsq_emulator import Cluster, MemoryNetwork
from nsq_proto import (
    Consumer,
    ConsumerConfig,
    MessageReceived,
    StartFrom,
    StartFromApplied,
    StartFromFailed,
)

LOOKUPD = ["127.0.0.1:4161"]


def backlog(*, channel: bool = True, nodes: int = 1) -> tuple[MemoryNetwork, Cluster]:
    """A 2-partition topic (both led by one node unless ``nodes`` > 1) with 5 old messages
    on each partition."""
    net = MemoryNetwork()
    cluster = net.add_cluster(Cluster(nodes=nodes))
    cluster.create_topic("events", net.now, partitions=2)
    if channel:
        cluster.create_channel("events", "c", net.now)
    for p in (0, 1):
        leader = cluster.leader("events", p)
        assert leader is not None
        for i in range(5):
            leader.publish("events", b"old-%d-%d" % (p, i), net.now, partition=p)
    net.advance(10.0)
    return net, cluster


def consume(
    net: MemoryNetwork, start_from: StartFrom | Mapping[int, StartFrom]
) -> tuple[Consumer, list[tuple[int | None, bytes]], list[object]]:
    consumer = Consumer(
        "events",
        "c",
        ConsumerConfig(max_in_flight=20, start_from=start_from),
        lookupd_http_addresses=LOOKUPD,
    )
    got: list[tuple[int | None, bytes]] = []
    events: list[object] = []

    def on_event(event: object) -> None:
        events.append(event)
        if isinstance(event, MessageReceived):
            stats = consumer.connection_stats(event.conn_id)
            got.append((stats.partition if stats else None, event.message.body))
            consumer.finish(event.conn_id, event.message.id, net.now)

    net.attach(consumer, on_event)
    consumer.start(net.now)
    net.run_until_idle()
    return consumer, got, events


def publish_new(net: MemoryNetwork, cluster: Cluster) -> None:
    for p in (0, 1):
        leader = cluster.leader("events", p)
        assert leader is not None
        leader.publish("events", b"new-%d" % p, net.now, partition=p)
    net.advance(5.0)


@pytest.mark.parametrize("channel", [True, False], ids=["channel", "no-channel-yet"])
def test_start_from_the_end_skips_the_backlog_of_every_partition(channel: bool) -> None:
    # one node leads both partitions: the five-token SUB_ADVANCED would move only one
    net, cluster = backlog(channel=channel)
    _, got, events = consume(net, StartFrom.end())
    publish_new(net, cluster)
    assert sorted(got) == [(0, b"new-0"), (1, b"new-1")]
    applied = sorted(e.partition for e in events if isinstance(e, StartFromApplied))
    assert applied == [0, 1]


def test_start_positions_per_partition() -> None:
    net, _ = backlog(nodes=2)
    # msgcount:4 is the partition's fourth message (the server counts from 1)
    start = {0: StartFrom.message_count(4), 1: StartFrom.queue_offset(0)}
    _, got, _ = consume(net, start)
    assert [b for p, b in got if p == 0] == [b"old-0-3", b"old-0-4"]
    assert [b for p, b in got if p == 1] == [b"old-1-%d" % i for i in range(5)]


def test_a_position_applies_once_not_on_every_reconnect() -> None:
    net, cluster = backlog()
    _, got, events = consume(net, StartFrom.end())
    publish_new(net, cluster)
    leader = cluster.leader("events", 0)
    assert leader is not None
    leader.publish("events", b"while away", net.now, partition=0)
    leader.drop_connections(net.now)
    net.advance(30.0)
    assert (0, b"while away") in got
    assert len([e for e in events if isinstance(e, StartFromApplied)]) == 2


def test_a_refused_position_is_reported_and_its_partition_not_consumed() -> None:
    net, cluster = backlog()
    leader = cluster.leader("events", 0)
    assert leader is not None
    server = net.nsqds.pop(("127.0.0.1", leader.options.tcp_port))  # its HTTP is unreachable
    _, got, events = consume(net, StartFrom.end())
    failed = [e for e in events if isinstance(e, StartFromFailed)]
    assert {e.partition for e in failed} == {0, 1}
    assert all(e.address[1] == leader.options.tcp_port for e in failed)
    assert got == []
    net.nsqds[("127.0.0.1", leader.options.tcp_port)] = server
    net.advance(80.0)  # the next lookup sets the position, then consumes
    assert got == []  # the position was set before anything was consumed
    publish_new(net, cluster)
    assert sorted(got) == [(0, b"new-0"), (1, b"new-1")]
