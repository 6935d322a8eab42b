"""Consumer and producer cores wired to the emulator in memory, end to end."""

from __future__ import annotations

import random

import pytest

from nsq_emulator import Cluster, Lookupd, MemoryNetwork, Nsqd, NsqdOptions
from nsq_proto import (
    ClientCore,
    Connect,
    ConnectionClosed,
    Consumer,
    ConsumerConfig,
    Event,
    HttpRequest,
    LocalProtocolError,
    LookupdError,
    MessageReceived,
    Producer,
    ProducerConfig,
    PublishFailed,
    PublishSucceeded,
)


def two_nsqd_network() -> tuple[MemoryNetwork, list[Nsqd], Lookupd]:
    net = MemoryNetwork()
    lookupd = net.add_lookupd(Lookupd(broadcast_address="lookupd", http_port=4161))
    nsqds = []
    for i in (1, 2):
        nsqd = net.add_nsqd(Nsqd(NsqdOptions(broadcast_address=f"nsqd{i}", msg_timeout=10.0)))
        lookupd.register(nsqd)
        nsqds.append(nsqd)
    return net, nsqds, lookupd


def test_published_messages_are_consumed_exactly_once_when_finished() -> None:
    net, nsqds, _ = two_nsqd_network()
    producer = Producer(
        ProducerConfig(max_outstanding=4),
        nsqd_tcp_addresses=["nsqd1:4150", "nsqd2:4150"],
        rng=random.Random(1),
    )
    net.attach(producer)
    seen: list[bytes] = []
    consumer = Consumer(
        "t",
        "c",
        ConsumerConfig(max_in_flight=7),
        lookupd_http_addresses=["lookupd:4161"],
        rng=random.Random(2),
    )

    def on_event(event: Event) -> None:
        if isinstance(event, MessageReceived):
            seen.append(event.message.body)
            consumer.finish(event.conn_id, event.message.id, net.now)

    net.attach(consumer, on_event)
    net.start()
    bodies = [b"m%d" % i for i in range(500)]
    rids = [producer.publish("t", b, net.now) for b in bodies[:100]]
    rids += [producer.publish_many("t", bodies[i : i + 50], net.now) for i in range(100, 500, 50)]
    net.run_until_idle()
    acked = [e.request_id for e in net.take_events(producer) if isinstance(e, PublishSucceeded)]
    assert sorted(acked) == sorted(rids)
    assert all(n.topic_stats("t").message_count > 0 for n in nsqds)  # spread over both
    # the topic did not exist at the first poll; the next one (60 s + up to 30 % jitter)
    # finds it on both nsqd
    net.advance(80.0)
    assert sorted(seen) == sorted(bodies)
    assert len(seen) == len(set(seen))
    for nsqd in nsqds:
        stats = nsqd.channel_stats("t", "c")
        assert (stats.depth, stats.in_flight_count, stats.timeout_count) == (0, 0, 0)


def test_unanswered_messages_are_delivered_again_after_msg_timeout() -> None:
    net, nsqds, _ = two_nsqd_network()
    consumer = Consumer(
        "t", "c", ConsumerConfig(max_in_flight=5), nsqd_tcp_addresses=["nsqd1:4150"]
    )
    net.attach(consumer)
    net.start()
    nsqds[0].publish("t", b"0", net.now)
    net.run_until_idle()
    # delivered once and never answered
    (first,) = [e for e in net.take_events(consumer) if isinstance(e, MessageReceived)]
    assert first.message.attempts == 1
    net.advance(9.0)
    assert not [e for e in net.take_events(consumer) if isinstance(e, MessageReceived)]
    net.advance(1.5)  # msg_timeout is 10 s
    (again,) = [e for e in net.take_events(consumer) if isinstance(e, MessageReceived)]
    assert (again.message.id, again.message.attempts) == (first.message.id, 2)
    assert nsqds[0].channel_stats("t", "c").timeout_count == 1
    consumer.finish(again.conn_id, again.message.id, net.now)
    net.advance(30.0)
    assert not [e for e in net.take_events(consumer) if isinstance(e, MessageReceived)]
    stats = nsqds[0].channel_stats("t", "c")
    assert (stats.depth, stats.in_flight_count, stats.timeout_count) == (0, 0, 1)


def test_ordered_partitions_keep_their_order_under_sub_ordered() -> None:
    net = MemoryNetwork()
    cluster = net.add_cluster(Cluster(nodes=2))
    cluster.create_topic("orders", net.now, partitions=2, ordered=True)
    cluster.create_channel("orders", "c", net.now)
    producer = Producer(ProducerConfig(), lookupd_http_addresses=["127.0.0.1:4161"])
    net.attach(producer)
    received: list[tuple[int | None, bytes]] = []
    consumer = Consumer(
        "orders", "c", ConsumerConfig(max_in_flight=10), lookupd_http_addresses=["127.0.0.1:4161"]
    )
    rng = random.Random(5)
    held: list[MessageReceived] = []

    def partition_of(conn_id: int) -> int | None:
        stats = consumer.connection_stats(conn_id)
        assert stats is not None
        return stats.partition

    def on_event(event: Event) -> None:
        if isinstance(event, MessageReceived):
            received.append((partition_of(event.conn_id), event.message.body))
            held.append(event)

    net.attach(consumer, on_event)
    net.start()
    keys = [f"customer-{i % 5}" for i in range(60)]
    for n, key in enumerate(keys):
        producer.publish("orders", f"{key}:{n}".encode(), net.now, sharding_key=key)
    net.run_until_idle()
    assert len([e for e in net.take_events(producer) if isinstance(e, PublishSucceeded)]) == 60
    # answer held messages in a random order, one at a time
    for _ in range(1000):
        net.run_until_idle()
        if not held:
            break
        # under SUB_ORDERED at most one message per partition is ever held
        partitions = [partition_of(e.conn_id) for e in held]
        assert len(partitions) == len(set(partitions))
        event = held.pop(rng.randrange(len(held)))
        consumer.finish(event.conn_id, event.message.id, net.now)
    assert len(received) == 60
    for partition in (0, 1):
        got = [body for p, body in received if p == partition]
        sent = [f"{k}:{n}".encode() for n, k in enumerate(keys) if f"{k}:{n}".encode() in got]
        assert got == sent  # publish order per partition
    # every key stays on one partition
    by_key: dict[str, set[int | None]] = {}
    for p, body in received:
        by_key.setdefault(body.split(b":")[0].decode(), set()).add(p)
    assert all(len(ps) == 1 for ps in by_key.values())


def test_sub_order_is_must_switches_the_consumer_to_sub_ordered() -> None:
    net = MemoryNetwork()
    cluster = net.add_cluster(Cluster(nodes=1))
    cluster.create_topic("orders", net.now, partitions=1, ordered=True)
    cluster.create_channel("orders", "c", net.now)
    consumer = Consumer(
        "orders",
        "c",
        ConsumerConfig(partitions=(0,), reconnect_delay=1.0, reconnect_jitter=0.0),
        nsqd_tcp_addresses=["127.0.0.1:4150"],
    )
    net.attach(consumer)
    net.start()
    first = net.take_events(consumer)
    assert any(getattr(e, "code", None) == "E_SUB_ORDER_IS_MUST" for e in first)
    cluster.nodes[0].publish("orders", b"in order", net.now, partition=0)
    net.advance(2.0)  # reconnects, this time with SUB_ORDERED
    received = [e for e in net.take_events(consumer) if isinstance(e, MessageReceived)]
    assert [e.message.body for e in received] == [b"in order"]
    assert received[0].message.queue_offset is not None  # the ordered frame layout


def test_producer_follows_a_moved_partition_leader() -> None:
    net = MemoryNetwork()
    cluster = net.add_cluster(Cluster(nodes=2))
    cluster.create_topic("orders", net.now, partitions=2, replicas=2)
    cluster.create_channel("orders", "c", net.now)
    producer = Producer(ProducerConfig(), lookupd_http_addresses=["127.0.0.1:4161"])
    net.attach(producer)
    net.start()
    first = producer.publish("orders", b"before", net.now, partition=1)
    net.run_until_idle()
    assert [e.request_id for e in net.take_events(producer) if isinstance(e, PublishSucceeded)] == [
        first
    ]
    old_leader = cluster.leader("orders", 1)
    assert old_leader is not None
    cluster.move_leader("orders", 1, 1 - cluster.node_index(old_leader), net.now)
    second = producer.publish("orders", b"after", net.now, partition=1)
    net.advance(5.0)
    events = net.take_events(producer)
    assert [e.request_id for e in events if isinstance(e, PublishSucceeded)] == [second]
    new_leader = cluster.leader("orders", 1)
    assert new_leader is not None and new_leader is not old_leader
    assert new_leader.topic_stats("orders", partition=1).message_count == 2


def cluster_with_two_lookupds(
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[MemoryNetwork, Lookupd, Lookupd, Consumer, list[tuple[str, int, float]]]:
    """A consumer that knows only the first lookupd of a cluster of two, and the HTTP
    requests it makes (host, port, time)."""
    net = MemoryNetwork()
    cluster = net.add_cluster(Cluster(nodes=2, lookupds=2))
    cluster.create_topic("orders", net.now, partitions=2)
    cluster.create_channel("orders", "c", net.now)
    seed, other = cluster.lookupds
    consumer = Consumer("orders", "c", lookupd_http_addresses=[f"127.0.0.1:{seed.http_port}"])
    asked: list[tuple[str, int, float]] = []
    real_http = net._http

    def spy(core: ClientCore, req: HttpRequest) -> None:
        asked.append((req.host, req.port, net.now))
        real_http(core, req)

    monkeypatch.setattr(net, "_http", spy)
    net.attach(consumer)
    net.start()
    net.advance(0.1)
    return net, seed, other, consumer, asked


def test_consumer_learns_the_other_lookupd_of_a_cluster_from_listlookup(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, _, other, consumer, asked = cluster_with_two_lookupds(monkeypatch)
    # polled right after /listlookup
    assert ("127.0.0.1", other.http_port) in [(h, p) for h, p, _ in asked]
    assert len(consumer.connections()) == 2
    # a standard nsqlookupd is never asked for /listlookup
    net2, _, _ = two_nsqd_network()
    sent: list[bytes] = []
    real_http2 = net2._http

    def spy2(core: ClientCore, req: HttpRequest) -> None:
        sent.append(req.data)
        real_http2(core, req)

    monkeypatch.setattr(net2, "_http", spy2)
    plain = Consumer("t", "c", lookupd_http_addresses=["lookupd:4161"])
    net2.attach(plain)
    net2.start()
    net2.nsqds[("nsqd1", 4150)].publish("t", b"x", net2.now)
    net2.advance(80.0)
    assert len(sent) >= 2
    assert all(data.startswith(b"GET /lookup?") for data in sent)


def test_producer_learns_the_other_lookupd_of_a_cluster_from_listlookup(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    net = MemoryNetwork()
    cluster = net.add_cluster(Cluster(nodes=2, lookupds=2))
    cluster.create_topic("orders", net.now, partitions=2)
    cluster.create_channel("orders", "c", net.now)
    seed, other = cluster.lookupds
    producer = Producer(ProducerConfig(), lookupd_http_addresses=[f"127.0.0.1:{seed.http_port}"])
    net.attach(producer)
    net.start()
    rid = producer.publish("orders", b"x", net.now, sharding_key="k")
    net.run_until_idle()
    assert [e.request_id for e in net.take_events(producer) if isinstance(e, PublishSucceeded)] == [
        rid
    ]
    # the next lookup of a topic goes to both lookupd
    seen: list[int] = []
    real_http = net._http

    def spy(core: ClientCore, req: HttpRequest) -> None:
        seen.append(req.port)
        real_http(core, req)

    monkeypatch.setattr(net, "_http", spy)
    producer.publish("other_topic", b"y", net.now)
    net.run_until_idle()
    assert sorted(set(seen)) == sorted({seed.http_port, other.http_port})


def test_extension_headers_and_trace_ids_on_an_extended_topic() -> None:
    net = MemoryNetwork()
    cluster = net.add_cluster(Cluster(nodes=1))
    cluster.create_topic("events", net.now, partitions=1, ext=True)
    cluster.create_channel("events", "c", net.now)
    producer = Producer(ProducerConfig(), lookupd_http_addresses=["127.0.0.1:4161"])
    consumer = Consumer(
        "events", "c", ConsumerConfig(max_in_flight=5), lookupd_http_addresses=["127.0.0.1:4161"]
    )
    net.attach(producer)
    net.attach(consumer)
    net.start()
    traced = producer.publish("events", b"one", net.now, ext={"k": "v"}, trace_id=77)
    plain = producer.publish_many("events", [b"two", b"three"], net.now, ext={"n": "2"})
    net.run_until_idle()
    done = {e.request_id: e for e in net.take_events(producer) if isinstance(e, PublishSucceeded)}
    assert set(done) == {traced, plain}
    receipt = done[traced].receipt
    assert receipt is not None and receipt.trace_id == 77
    assert done[plain].receipt is None
    net.advance(80.0)  # the consumer's lookup found the topic extended: extend_support
    got = {
        e.message.body: e.message
        for e in net.take_events(consumer)
        if isinstance(e, MessageReceived)
    }
    assert set(got) == {b"one", b"two", b"three"}
    one = got[b"one"]
    assert one.ext_version == 4 and one.trace_id == 77
    assert one.ext_data is not None and b'"k":"v"' in one.ext_data
    assert got[b"two"].ext_data == b'{"n":"2"}'


def test_a_header_value_that_reads_like_the_trace_key_is_not_a_trace() -> None:
    # only the key "##trace_id" asks the server for a trace receipt, not the text anywhere
    net = MemoryNetwork()
    cluster = net.add_cluster(Cluster(nodes=1))
    cluster.create_topic("events", net.now, partitions=1, ext=True)
    cluster.create_channel("events", "c", net.now)
    producer = Producer(ProducerConfig(), lookupd_http_addresses=["127.0.0.1:4161"])
    net.attach(producer)
    net.start()
    first = producer.publish("events", b"one", net.now, ext={"note": "##trace_id"})
    second = producer.publish("events", b"two", net.now, ext={"k": "v"})
    net.run_until_idle()
    events = net.take_events(producer)
    done = {e.request_id: e for e in events if isinstance(e, PublishSucceeded)}
    assert set(done) == {first, second}
    assert done[first].receipt is None
    assert not [e for e in events if isinstance(e, ConnectionClosed)]
    assert cluster.nodes[0].topic_stats("events", partition=0).message_count == 2


def test_a_deferred_publish_to_the_partitioned_server_is_refused_locally() -> None:
    # the server would answer DPUB with a fatal E_INVALID, dropping pipelined neighbours
    net = MemoryNetwork()
    cluster = net.add_cluster(Cluster(nodes=1))
    cluster.create_topic("events", net.now, partitions=1)
    cluster.create_channel("events", "c", net.now)
    producer = Producer(ProducerConfig(), lookupd_http_addresses=["127.0.0.1:4161"])
    net.attach(producer)
    net.start()
    plain = producer.publish("events", b"one", net.now)
    deferred = producer.publish("events", b"later", net.now, delay=1.0)
    after = producer.publish("events", b"two", net.now)
    net.run_until_idle()
    events = net.take_events(producer)
    done = {e.request_id for e in events if isinstance(e, PublishSucceeded)}
    (failed,) = [e for e in events if isinstance(e, PublishFailed)]
    assert done == {plain, after} and failed.request_id == deferred
    assert isinstance(failed.error, LocalProtocolError) and "DPUB" in str(failed.error)
    assert not [e for e in events if isinstance(e, ConnectionClosed)]
    # once the topology is known, at once
    with pytest.raises(LocalProtocolError, match="DPUB"):
        producer.publish("events", b"later", net.now, delay=1.0)


def test_requeue_on_an_ordered_channel_is_sent_without_a_delay() -> None:
    # the partitioned server ignores a REQ with a delay on ordered channels: the message
    # would only come back after msg_timeout (60 s by default)
    net = MemoryNetwork()
    cluster = net.add_cluster(Cluster(nodes=1))
    cluster.create_topic("orders", net.now, partitions=1, ordered=True)
    cluster.create_channel("orders", "c", net.now)
    received: list[MessageReceived] = []
    consumer = Consumer(
        "orders",
        "c",
        ConsumerConfig(max_in_flight=5, backoff=False),
        lookupd_http_addresses=["127.0.0.1:4161"],
    )
    net.attach(consumer, lambda e: received.append(e) if isinstance(e, MessageReceived) else None)
    net.start()
    cluster.nodes[0].publish("orders", b"first", net.now, partition=0)
    net.advance(1.0)
    (event,) = received
    consumer.requeue(event.conn_id, event.message.id, net.now, delay=30.0)
    net.advance(1.0)
    assert [(e.message.body, e.message.attempts) for e in received] == [
        (b"first", 1),
        (b"first", 2),
    ]


def test_unroutable_publishes_fail_at_once_with_the_cause() -> None:
    net = MemoryNetwork()
    cluster = net.add_cluster(Cluster(nodes=1))
    cluster.create_topic("events", net.now, partitions=2)
    cluster.create_channel("events", "c", net.now)
    cluster.create_topic("fresh", net.now, partitions=2)  # no channel yet
    producer = Producer(
        ProducerConfig(publish_timeout=30.0), lookupd_http_addresses=["127.0.0.1:4161"]
    )
    net.attach(producer)
    net.start()
    missing = producer.publish("events", b"x", net.now, partition=7)
    fine = producer.publish("events", b"y", net.now, partition=1)
    refused = producer.publish("fresh", b"z", net.now)
    net.advance(2.5)  # lookupd is asked again once, a second later
    events = net.take_events(producer)
    failed = {e.request_id: e.error for e in events if isinstance(e, PublishFailed)}
    assert {e.request_id for e in events if isinstance(e, PublishSucceeded)} == {fine}
    assert set(failed) == {missing, refused}
    assert isinstance(failed[missing], LocalProtocolError)
    assert "has 2 partitions" in str(failed[missing]) and "no partition 7" in str(failed[missing])
    assert isinstance(failed[refused], LookupdError)
    assert "Topic has no channel" in str(failed[refused])


def test_a_lookupd_learned_from_listlookup_is_dropped_once_it_stays_dead(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    net, seed, other, consumer, requests = cluster_with_two_lookupds(monkeypatch)

    def ports() -> list[int]:
        return [port for _, port, _ in requests]

    assert other.http_port in ports()
    # the learned lookupd goes away for good; so does the seed, for a while
    net.lookupds.pop(("127.0.0.1", other.http_port))
    seed_entry = net.lookupds.pop(("127.0.0.1", seed.http_port))
    requests.clear()
    net.advance(10 * 80.0)
    assert ports().count(other.http_port) == 3  # three failures in a row, then forgotten
    assert ports().count(seed.http_port) >= 10  # a seed is never forgotten
    net.lookupds[("127.0.0.1", seed.http_port)] = seed_entry
    requests.clear()
    net.advance(80.0)
    # the seed answers again: its /listlookup names the other lookupd, which is asked again
    assert other.http_port in ports()
    assert len(consumer.connections()) == 2


def test_an_ordered_consumer_hands_on_the_servers_repeated_head_once() -> None:
    # the partitioned server sends the head of a backlog twice on the first SUB_ORDERED
    net = MemoryNetwork()
    cluster = net.add_cluster(Cluster(nodes=1))
    cluster.create_topic("orders", net.now, partitions=1, ordered=True)
    cluster.create_channel("orders", "c", net.now)
    for body in (b"first", b"second", b"third"):
        cluster.nodes[0].publish("orders", body, net.now, partition=0)
    events: list[Event] = []
    consumer = Consumer(
        "orders", "c", ConsumerConfig(max_in_flight=5), lookupd_http_addresses=["127.0.0.1:4161"]
    )

    def on_event(event: Event) -> None:
        events.append(event)
        if isinstance(event, MessageReceived):
            consumer.finish(event.conn_id, event.message.id, net.now)

    net.attach(consumer, on_event)
    net.start()
    net.advance(2.0)
    bodies = [e.message.body for e in events if isinstance(e, MessageReceived)]
    assert bodies == [b"first", b"second", b"third"]
    assert consumer.repeats_dropped == 1
    assert not [e for e in events if getattr(e, "code", None) == "E_FIN_FAILED"]


def test_the_servers_repeated_head_is_dropped_even_after_its_original_was_answered() -> None:
    # on the real server the repeat may arrive after the application answered the first copy
    from nsq_emulator.frames import encode_message_data
    from nsq_proto.wire import encode_frame

    consumer = Consumer(
        "orders",
        "c",
        ConsumerConfig(max_in_flight=5, partitions=(0,), ordered=True),
        nsqd_tcp_addresses=["n1:4150"],
    )
    consumer.start(0.0)
    (connect,) = [o for o in consumer.outputs() if isinstance(o, Connect)]
    cid = connect.conn_id
    consumer.connection_made(cid, 0.0)
    from tests.proto.helpers import identify_response, response

    consumer.receive_data(cid, identify_response(version="0.3.7-HA.1.13.0"), 0.0)
    consumer.receive_data(cid, response(b"OK"), 0.0)
    msg_id = (7).to_bytes(8, "big") + bytes(8)
    frame = encode_frame(2, encode_message_data(msg_id, 1, 1, b"head", queue_position=(0, 34)))
    consumer.receive_data(cid, frame, 0.1)
    got = [o for o in consumer.outputs() if isinstance(o, MessageReceived)]
    assert [m.message.body for m in got] == [b"head"]
    consumer.finish(cid, msg_id, 0.2)
    consumer.receive_data(cid, frame, 0.3)  # the very same delivery again
    assert not [o for o in consumer.outputs() if isinstance(o, MessageReceived)]
    assert consumer.repeats_dropped == 1
