"""Publishing through errors and losses, against the emulator: what is stored, in which order.

The partitioned server answers its cluster errors (``E_FAILED_ON_NOT_LEADER``,
``E_FAILED_ON_NOT_WRITABLE``, ...) without closing the connection, so the requests pipelined
behind a refused one were read and stored; sending them again would duplicate them.  Retries
keep call order, back off as go-nsq does, and an ordered partition is never pipelined past a
request that may still be retried.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nsq_emulator import Cluster, MemoryNetwork, Nsqd, NsqdOptions
from nsq_proto import (
    ConnectionClosed,
    Event,
    NSQError,
    Producer,
    ProducerConfig,
    PublishesSucceeded,
    PublishFailed,
    PublishSucceeded,
    ServerError,
)

LOOKUPD = ["127.0.0.1:4161"]


def succeeded(events: list[Event]) -> list[int]:
    """The request ids acknowledged, in the order told (a :class:`PublishesSucceeded` tells
    those of its coalesced MPUB)."""
    ok: list[int] = []
    for e in events:
        if isinstance(e, PublishSucceeded):
            ok.append(e.request_id)
        elif isinstance(e, PublishesSucceeded):
            ok += e.request_ids
    return ok


def outcome(events: list[Event]) -> tuple[list[int], dict[int, NSQError]]:
    ok = succeeded(events)
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


# ------------------------------------------------------------------------------ coalescing


def standard(
    max_msg_size: int = 10, answer_batches: bool = False, **config: Any
) -> tuple[MemoryNetwork, Nsqd, Producer]:
    """A standard nsqd refusing bodies over ``max_msg_size`` bytes, and a started producer."""
    net = MemoryNetwork()
    nsqd = net.add_nsqd(Nsqd(NsqdOptions(broadcast_address="nsqd1", max_msg_size=max_msg_size)))
    config.setdefault("reconnect_delay", 0.1)
    config.setdefault("reconnect_jitter", 0.0)
    producer = Producer(
        ProducerConfig(**config), nsqd_tcp_addresses=["nsqd1:4150"], answer_batches=answer_batches
    )
    net.attach(producer)
    net.start()
    net.run_until_idle()
    return net, nsqd, producer


def queued(nsqd: Nsqd, topic: str = "t") -> list[bytes]:
    found = nsqd.topics.get((topic, -1))
    return [] if found is None else [m.body for m in found.queue]


def test_one_bad_body_never_fails_the_publishes_coalesced_with_it() -> None:
    # nsqd refuses an MPUB whole (and closes the connection) for one body over its
    # --max-msg-size: the MPUB is split, and only the caller of that body gets the error
    net, nsqd, producer = standard(max_outstanding=1)
    bodies = [b"m%d" % i for i in range(10)]
    bodies[6] = b"x" * 11
    rids = [producer.publish("t", body, net.now) for body in bodies]
    net.advance(5.0)
    ok, failed = outcome(net.take_events(producer))
    assert sorted(ok) == [r for r in rids if r != rids[6]]
    assert list(failed) == [rids[6]]
    error = failed[rids[6]]
    assert isinstance(error, ServerError) and error.code == "E_BAD_MESSAGE"
    assert sorted(queued(nsqd)) == sorted(b for b in bodies if len(b) <= 10)
    assert producer.pending == 0


def test_with_answer_batches_a_coalesced_mpub_is_answered_by_one_event() -> None:
    net, nsqd, producer = standard(max_outstanding=1, answer_batches=True)
    rids = [producer.publish("t", b"m%d" % i, net.now) for i in range(5)]
    net.advance(1.0)
    events = [e for e in net.take_events(producer) if type(e).__name__.startswith("Publish")]
    # the first went alone at once (an idle connection); the rest waited for it, as one MPUB
    assert events == [PublishSucceeded(1, rids[0]), PublishesSucceeded(1, rids[1:])]
    assert queued(nsqd) == [b"m%d" % i for i in range(5)]
    # a bad body among them: the split MPUB's publishes are answered one by one, as sent
    bodies = [b"a", b"x" * 11, b"c"]
    more = [producer.publish("t", body, net.now) for body in bodies]
    net.advance(5.0)
    ok, failed = outcome(net.take_events(producer))
    assert sorted(ok) == [more[0], more[2]] and list(failed) == [more[1]]


def test_an_error_of_the_whole_mpub_is_each_callers() -> None:
    net, nsqd, producer = standard(max_outstanding=1, max_publish_attempts=1)
    first = producer.publish("t", b"a", net.now)
    nsqd.fail_next(code="E_MPUB_FAILED", description="MPUB failed exiting", command="MPUB")
    rids = [producer.publish("t", b, net.now) for b in (b"b", b"c", b"d")]
    net.advance(1.0)
    ok, failed = outcome(net.take_events(producer))
    assert ok == [first]
    assert list(failed) == rids
    errors = list(failed.values())
    assert all(isinstance(e, ServerError) and e.code == "E_MPUB_FAILED" for e in errors)
    assert len({id(e) for e in errors}) == 3  # each raised in its own task: its own instance


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    script=st.lists(
        st.one_of(
            st.tuples(
                st.just("publish"),
                st.sampled_from(["t", "u"]),
                st.integers(min_value=1, max_value=14),
            ),
            st.tuples(st.just("many"), st.sampled_from(["t", "u"]), st.integers(1, 3)),
            st.tuples(st.just("deferred"), st.sampled_from(["t", "u"]), st.integers(1, 12)),
            st.tuples(st.just("run"), st.just(""), st.just(0)),
            st.tuples(st.just("drop"), st.just(""), st.just(0)),
        ),
        max_size=40,
    ),
    max_outstanding=st.integers(1, 3),
    max_messages=st.integers(1, 6),
    answer_batches=st.booleans(),
)
def test_every_publish_gets_one_answer_and_the_stored_messages_are_the_acknowledged_ones(
    script: list[tuple[str, str, int]],
    max_outstanding: int,
    max_messages: int,
    answer_batches: bool,
) -> None:
    """Publishes of good and bad bodies (over nsqd's 10 bytes) coalesced under connection
    losses: each gets exactly one answer (with ``answer_batches``, those of a coalesced MPUB
    in one event, in call order); a bad body fails alone with nsqd's refusal; an acknowledged
    one is stored; nothing is stored that was not published good."""
    net, nsqd, producer = standard(
        max_outstanding=max_outstanding,
        max_coalesced_messages=max_messages,
        max_publish_attempts=10,
        answer_batches=answer_batches,
    )
    published: dict[int, tuple[str, list[bytes]]] = {}
    dropped = False
    for n, (action, topic, size) in enumerate(script):
        if action == "publish":
            body = (b"%d-" % n).ljust(size, b"b")
            published[producer.publish(topic, body, net.now)] = (topic, [body])
        elif action == "many":
            bodies = [b"%d.%d" % (n, i) for i in range(size)]
            published[producer.publish_many(topic, bodies, net.now)] = (topic, bodies)
        elif action == "deferred":
            body = (b"%d-" % n).ljust(size, b"d")
            published[producer.publish(topic, body, net.now, delay=0.0)] = (topic, [body])
        elif action == "run":
            net.run_until_idle()
        else:
            nsqd.drop_connections(net.now)
            dropped = True
    net.advance(30.0)
    events = net.take_events(producer)
    answers = succeeded(events) + [e.request_id for e in events if isinstance(e, PublishFailed)]
    assert sorted(answers) == sorted(published)  # one answer each
    for batch in (e for e in events if isinstance(e, PublishesSucceeded)):
        assert answer_batches and len(batch.request_ids) > 1
        assert batch.request_ids == sorted(batch.request_ids)  # call order
        assert all(len(published[r][1]) == 1 for r in batch.request_ids)  # single publishes
    ok, failed = outcome(events)
    for rid, (_, bodies) in published.items():
        bad = any(len(b) > 10 for b in bodies)
        if bad:
            error = failed[rid]
            assert isinstance(error, ServerError) and error.code == "E_BAD_MESSAGE"
        else:
            # a good body fails only for want of a connection, never for a neighbour
            assert rid in ok or not isinstance(failed[rid], ServerError)
    for topic in ("t", "u"):
        stored_now = queued(nsqd, topic)
        good = [b for r, (t, bs) in published.items() if t == topic for b in bs if len(b) <= 10]
        acknowledged = [b for r in ok if published[r][0] == topic for b in published[r][1]]
        assert set(stored_now) <= set(good)  # nothing that was not published good
        assert set(acknowledged) <= set(stored_now)
        if not dropped:
            assert sorted(stored_now) == sorted(acknowledged)  # exactly once without losses
    assert producer.pending == 0


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    script=st.lists(
        st.one_of(
            st.tuples(st.just("burst"), st.sampled_from(["t", "u"]), st.integers(1, 60)),
            st.tuples(st.just("lull"), st.just(""), st.integers(1, 100)),
            st.tuples(st.just("run"), st.just(""), st.just(0)),
            st.tuples(st.just("drop"), st.just(""), st.just(0)),
        ),
        max_size=30,
    ),
    turn_us=st.integers(0, 80),
    max_outstanding=st.integers(1, 8),
    pool_size=st.integers(1, 2),
)
def test_shares_sent_early_keep_call_order_and_the_bound_on_unanswered_commands(
    script: list[tuple[str, str, int]], turn_us: int, max_outstanding: int, pool_size: int
) -> None:
    """Bursts of callers (one publish each, ``turn_us`` apart), round trips of up to 100 ms
    (after which the producer's latest wait was long, and shares go before the flush) and
    connection losses: every publish gets one answer, no connection ever has more than
    ``max_outstanding`` commands unanswered, and without losses each topic stores its
    messages once (in call order over one connection: over two, each goes on the first one
    with room, and nsqd may read either first)."""
    net, nsqd, producer = standard(
        max_outstanding=max_outstanding, pool_size=pool_size, max_publish_attempts=10
    )
    published: dict[int, tuple[str, bytes]] = {}
    dropped = False

    def bounded() -> None:
        assert all(conn.outstanding <= max_outstanding for conn in producer.connections())

    for n, (action, topic, size) in enumerate(script):
        if action == "burst":
            for i in range(size):
                body = b"%d.%d" % (n, i)
                published[producer.publish(topic, body, net.now)] = (topic, body)
                net.now += turn_us / 1e6
                bounded()
        elif action == "lull":
            # a round trip of ``size`` ms: what the producer sends now is answered after it
            net.freeze(nsqd)
            net.run_until_idle()
            net.now += size / 1000
            net.thaw(nsqd)
        elif action == "run":
            net.run_until_idle()
        else:
            nsqd.drop_connections(net.now)
            dropped = True
        bounded()
    net.advance(30.0)
    events = net.take_events(producer)
    answers = [e.request_id for e in events if isinstance(e, PublishSucceeded | PublishFailed)]
    assert sorted(answers) == sorted(published)
    _, failed = outcome(events)
    assert all(not isinstance(error, ServerError) for error in failed.values())
    assert producer.pending == 0
    if not dropped:
        assert not failed
        for topic in ("t", "u"):
            in_call_order = [body for _, (t, body) in sorted(published.items()) if t == topic]
            stored_now = queued(nsqd, topic)
            if pool_size == 1:
                assert stored_now == in_call_order
            else:
                assert sorted(stored_now) == sorted(in_call_order)
