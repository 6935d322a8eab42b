"""Publishing through errors and losses, against the emulator: what is stored, in which order.

The partitioned server answers its cluster errors (``E_FAILED_ON_NOT_LEADER``,
``E_FAILED_ON_NOT_WRITABLE``, ...) without closing the connection, so the requests pipelined
behind a refused one were read and stored; sending them again would duplicate them.  Retries
keep call order, back off as go-nsq does, and an ordered partition is never pipelined past a
request that may still be retried.
"""

from __future__ import annotations

from typing import Any

from nsq_proto import (
    ConnectionClosed,
    Event,
    NSQError,
    Producer,
    ProducerConfig,
    PublishFailed,
    PublishSucceeded,
    ServerError,
)
from nsq_proto.testing import Cluster, MemoryNetwork, Nsqd, NsqdOptions

LOOKUPD = ["127.0.0.1:4161"]


def outcome(events: list[Event]) -> tuple[list[int], dict[int, NSQError]]:
    ok = [e.request_id for e in events if isinstance(e, PublishSucceeded)]
    failed = {e.request_id: e.error for e in events if isinstance(e, PublishFailed)}
    return ok, failed


def stored(cluster: Cluster, topic: str, partition: int) -> list[bytes]:
    return [m.body for m in cluster.topic(topic, partition).log]


def partitioned(
    *, nodes: int = 1, ordered: bool, replicas: int = 1
) -> tuple[MemoryNetwork, Cluster]:
    net = MemoryNetwork()
    cluster = net.add_cluster(Cluster(nodes=nodes))
    cluster.create_topic("orders", net.now, partitions=1, ordered=ordered, replicas=replicas)
    cluster.create_channel("orders", "c", net.now)
    return net, cluster


def started_producer(net: MemoryNetwork, **config: Any) -> Producer:
    producer = Producer(ProducerConfig(**config), lookupd_http_addresses=LOOKUPD)
    net.attach(producer)
    net.start()
    # learn the route first, so later publishes are sent at once
    producer.publish("orders", b"m0", net.now, partition=0)
    net.run_until_idle()
    assert outcome(net.take_events(producer))[0] == [1]
    return producer


def test_a_refused_ordered_publish_is_not_overtaken_by_its_successors() -> None:
    # real partitioned server: 'm1 m2 m3 m3 m2 m1 m4 m5' after one retryable refusal
    net, cluster = partitioned(ordered=True)
    producer = started_producer(net, max_outstanding=8)
    cluster.nodes[0].fail_next(code="E_FAILED_ON_NOT_WRITABLE", fatal=False, command="PUB")
    bodies = [b"m%d" % i for i in range(1, 6)]
    rids = [producer.publish("orders", b, net.now, sharding_key="customer-1") for b in bodies]
    net.advance(2.0)
    ok, failed = outcome(net.take_events(producer))
    assert (ok, failed) == (rids, {})
    assert stored(cluster, "orders", 0) == [b"m0", *bodies]


def test_a_refusal_on_a_plain_partition_duplicates_nothing() -> None:
    # the requests pipelined behind the refused one were stored: only the refused one is sent
    # again, and the connection stays open
    net, cluster = partitioned(ordered=False)
    producer = started_producer(net, max_outstanding=8)
    node = cluster.nodes[0]
    node.fail_next(code="E_FAILED_ON_NOT_LEADER", fatal=False, command="PUB")
    bodies = [b"a1", b"a2", b"a3"]
    rids = [producer.publish("orders", b, net.now, partition=0) for b in bodies]
    net.advance(2.0)
    events = net.take_events(producer)
    ok, failed = outcome(events)
    assert (sorted(ok), failed) == (rids, {})
    assert sorted(stored(cluster, "orders", 0)) == sorted([b"m0", *bodies])
    assert not [e for e in events if isinstance(e, ConnectionClosed)]


def test_a_non_retryable_refusal_fails_its_publish_alone() -> None:
    net, cluster = partitioned(ordered=False)
    producer = started_producer(net, max_outstanding=8)
    cluster.nodes[0].fail_next(code="E_PUB_FAILED", description="disk full", fatal=False)
    rids = [producer.publish("orders", b, net.now, partition=0) for b in (b"x", b"y")]
    net.advance(1.0)
    ok, failed = outcome(net.take_events(producer))
    assert ok == rids[1:]
    error = failed[rids[0]]
    assert isinstance(error, ServerError) and error.code == "E_PUB_FAILED"
    assert stored(cluster, "orders", 0) == [b"m0", b"y"]


def test_retries_back_off_like_go_nsq() -> None:
    # go-nsq sleeps 8 ms + 10 ms * 2^n before the n-th retry (n = 1, 2, ...)
    net, cluster = partitioned(ordered=False)
    producer = started_producer(net)
    node = cluster.nodes[0]
    for _ in range(2):
        node.fail_next(code="E_FAILED_ON_NOT_WRITABLE", fatal=False, command="PUB")
    start = net.now
    rid = producer.publish("orders", b"x", net.now, partition=0)
    times = []
    while not (ok := outcome(net.take_events(producer))[0]):
        net.advance(0.001)
        times.append(net.now - start)
    assert ok == [rid]
    # first retry after 28 ms, second 48 ms later: done after ~76 ms, not at once
    assert 0.075 <= times[-1] <= 0.080


def test_ordered_publishes_keep_call_order_across_a_leader_move() -> None:
    net, cluster = partitioned(nodes=2, ordered=True, replicas=2)
    producer = started_producer(net, max_outstanding=8)
    leader = cluster.leader("orders", 0)
    assert leader is not None
    bodies = [b"m%d" % i for i in range(1, 7)]
    rids = [producer.publish("orders", b, net.now, sharding_key="k") for b in bodies]
    cluster.move_leader("orders", 0, 1 - cluster.node_index(leader), net.now)
    net.advance(5.0)
    ok, failed = outcome(net.take_events(producer))
    assert (ok, failed) == (rids, {})
    assert stored(cluster, "orders", 0) == [b"m0", *bodies]


def test_retries_after_a_connection_loss_keep_call_order() -> None:
    # standard nsqd: the connection drops after nsqd stored A1 A2 A3 but before the OKs
    # arrive; all three are sent again, in call order (real nsqd showed 'A1 A2 A2 A1')
    net = MemoryNetwork()
    nsqd = net.add_nsqd(Nsqd(NsqdOptions(broadcast_address="nsqd1")))
    producer = Producer(
        ProducerConfig(max_outstanding=8, reconnect_delay=0.5, reconnect_jitter=0.0),
        nsqd_tcp_addresses=["nsqd1:4150"],
    )
    net.attach(producer)
    net.start()
    net.run_until_idle()
    nsqd.delay_output(10.0)
    rids = [producer.publish("t", b, net.now) for b in (b"A1", b"A2", b"A3")]
    net.run_until_idle()
    nsqd.drop_connections(net.now)
    nsqd.delay_output(0.0)
    net.advance(5.0)
    ok, failed = outcome(net.take_events(producer))
    assert (sorted(ok), failed) == (rids, {})
    queued = [m.body for m in nsqd.topics[("t", -1)].queue]
    assert queued == [b"A1", b"A2", b"A3", b"A1", b"A2", b"A3"]


def test_a_topic_that_stays_unwritable_fails_its_publish_with_the_cause_in_moments() -> None:
    # a new topic of the real cluster refuses writes until its write check has run
    net = MemoryNetwork()
    cluster = net.add_cluster(Cluster(nodes=1))
    cluster.create_topic("fresh", net.now, partitions=1, writable=False)
    cluster.create_channel("fresh", "c", net.now)
    producer = Producer(ProducerConfig(publish_timeout=30.0), lookupd_http_addresses=LOOKUPD)
    net.attach(producer)
    net.start()
    rid = producer.publish("fresh", b"x", net.now, partition=0)
    net.advance(1.0)
    ok, failed = outcome(net.take_events(producer))
    assert ok == []
    error = failed[rid]
    assert isinstance(error, ServerError) and error.code == "E_FAILED_ON_NOT_LEADER"
    cluster.enable_writes("fresh")
    again = producer.publish("fresh", b"x", net.now, partition=0)
    net.advance(1.0)
    assert outcome(net.take_events(producer))[0] == [again]
