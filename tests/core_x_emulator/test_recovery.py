"""How fast consumers recover from nsqd that die, restart, flap or freeze, on the virtual clock
of the in-memory network: time to recover, and how hard lookupd and nsqd get asked meanwhile."""

from __future__ import annotations

import random
from typing import Any

from nsq_proto import Consumer, ConsumerConfig, Event, MessageReceived
from nsq_proto.testing import Lookupd, MemoryNetwork, Nsqd, NsqdOptions


def lookupd_network() -> tuple[MemoryNetwork, Nsqd, Lookupd]:
    net = MemoryNetwork()
    lookupd = net.add_lookupd(Lookupd(broadcast_address="lookupd", http_port=4161))
    nsqd = net.add_nsqd(Nsqd(NsqdOptions(broadcast_address="nsqd1")))
    lookupd.register(nsqd)
    return net, nsqd, lookupd


def consuming(
    net: MemoryNetwork, nsqd_tcp_addresses: tuple[str, ...] | list[str] = (), **options: Any
) -> tuple[Consumer, list[bytes]]:
    """A consumer that finishes every message it gets (behind lookupd unless given nsqd)."""
    seen: list[bytes] = []
    consumer = Consumer(
        "t",
        "c",
        ConsumerConfig(max_in_flight=10, **options),
        nsqd_tcp_addresses=nsqd_tcp_addresses,
        lookupd_http_addresses=() if nsqd_tcp_addresses else ["lookupd:4161"],
        rng=random.Random(3),
    )

    def on_event(event: Event) -> None:
        if isinstance(event, MessageReceived):
            seen.append(event.message.body)
            consumer.finish(event.conn_id, event.message.id, net.now)

    net.attach(consumer, on_event)
    return consumer, seen


def time_to_consume(net: MemoryNetwork, seen: list[bytes], body: bytes, limit: float) -> float:
    start = net.now
    while body not in seen:
        assert net.now - start < limit, f"{body!r} not consumed within {limit} s"
        net.advance(0.25)
    return net.now - start


def test_a_consumer_behind_lookupd_finds_a_restarted_nsqd_within_seconds() -> None:
    net, nsqd, _lookupd = lookupd_network()
    nsqd.publish("t", b"before", net.now)
    _consumer, seen = consuming(net)
    net.start()
    time_to_consume(net, seen, b"before", 5.0)
    for downtime in (0.5, 3.0, 10.0):
        nsqd.stop(net.now)
        net.run_until_idle()
        net.advance(downtime)
        nsqd.start(net.now)
        body = b"after %.1f" % downtime
        nsqd.publish("t", body, net.now)
        # lookupd_poll_interval is 60 s: recovery must not wait for the next poll
        assert time_to_consume(net, seen, body, 2 * downtime + 5.0) <= 2 * downtime + 5.0


def test_a_flapping_nsqd_does_not_make_the_consumer_hammer_lookupd() -> None:
    net, nsqd, lookupd = lookupd_network()
    nsqd.publish("t", b"x", net.now)
    _consumer, seen = consuming(net)
    net.start()
    time_to_consume(net, seen, b"x", 5.0)
    before = lookupd.request_count
    for _ in range(100):  # a close every 0.1 s for 10 s
        nsqd.drop_connections(net.now)
        net.advance(0.1)
    # re-queries after a loss are at least a second apart
    assert lookupd.request_count - before <= 12


def fixed_list_consumer(net: MemoryNetwork, **options: object) -> tuple[Consumer, list[bytes]]:
    return consuming(net, nsqd_tcp_addresses=["nsqd1:4150"], **options)


def test_recovery_from_a_frozen_nsqd_is_bounded_by_the_reconnect_cap() -> None:
    net = MemoryNetwork()
    nsqd = net.add_nsqd(Nsqd(NsqdOptions(broadcast_address="nsqd1")))
    nsqd.publish("t", b"before", net.now)
    consumer, seen = fixed_list_consumer(
        net, max_reconnect_delay=10.0, handshake_timeout=3.0, reconnect_jitter=0.0
    )
    net.start()
    time_to_consume(net, seen, b"before", 5.0)
    net.freeze(nsqd)  # SIGSTOP: connects succeed, nothing answers
    net.advance(300.0)
    closed = [s.state for s in consumer.connections()]
    assert closed in ([], ["IDENTIFYING"])  # heartbeats missed; reconnects time out in IDENTIFY
    net.thaw(nsqd)
    nsqd.publish("t", b"after", net.now)
    # at most one reconnect delay (the cap) plus one handshake timeout
    assert time_to_consume(net, seen, b"after", 14.0) <= 13.5


def test_a_frozen_nsqd_times_the_handshake_out_not_the_read() -> None:
    net = MemoryNetwork()
    nsqd = net.add_nsqd(Nsqd(NsqdOptions(broadcast_address="nsqd1")))
    net.freeze(nsqd)
    consumer, _ = fixed_list_consumer(net, handshake_timeout=2.0, reconnect_delay=100.0)
    net.start()
    net.advance(1.9)
    assert [s.state for s in consumer.connections()] == ["IDENTIFYING"]
    net.advance(0.2)
    assert consumer.connections() == []  # closed after 2 s, not two heartbeats (60 s)
