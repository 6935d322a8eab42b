"""The consumer core (``_consumer.py``) against the emulated nsqd and nsqlookupd over the
in-memory network: where the state machines meet, driven by hypothesis (publish, answer, drop,
restart, resize, time); and how fast a consumer recovers from nsqd that die, restart, flap or
freeze, on the virtual clock: time to recover, and how hard lookupd and nsqd get asked
meanwhile."""

from __future__ import annotations

import random
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from nsq_emulator import Lookupd, MemoryNetwork, Nsqd, NsqdOptions
from nsq_proto import Consumer, ConsumerConfig, ErrorReceived, Event, MessageReceived


class ConsumerAgainstNsqd(RuleBasedStateMachine):
    @initialize(
        n=st.integers(1, 3),
        max_in_flight=st.integers(1, 6),
        seed=st.integers(0, 1000),
    )
    def setup(self, n: int, max_in_flight: int, seed: int) -> None:
        self.net = MemoryNetwork()
        self.nsqds = [
            self.net.add_nsqd(
                Nsqd(NsqdOptions(broadcast_address=f"nsqd{i}", msg_timeout=30.0, max_rdy_count=4))
            )
            for i in range(n)
        ]
        self.consumer = Consumer(
            "t",
            "c",
            ConsumerConfig(
                max_in_flight=max_in_flight,
                max_attempts=0,
                backoff_multiplier=0.5,
                max_backoff_duration=4.0,
                reconnect_delay=1.0,
                reconnect_jitter=0.0,
                default_requeue_delay=0.5,
            ),
            nsqd_tcp_addresses=[f"nsqd{i}:4150" for i in range(n)],
            rng=random.Random(seed),
        )
        self.net.attach(self.consumer, self.on_event)
        #: every delivery the application holds, stale copies included
        self.held: dict[tuple[int, bytes, int], bytes] = {}
        self.published: set[bytes] = set()
        self.finished: list[bytes] = []
        self.next = 0
        self.net.start()

    def on_event(self, event: Event) -> None:
        if isinstance(event, ErrorReceived):
            # only an answer to a copy nsqd no longer holds (timed out): never a fatal error
            assert event.code in ("E_FIN_FAILED", "E_REQ_FAILED", "E_TOUCH_FAILED"), event
        if isinstance(event, MessageReceived):
            # the same id again on the same connection means msg_timeout expired and nsqd
            # delivered it anew while the application still holds the older copy: it keeps
            # both, and answering either must be harmless
            message = event.message
            older = [k for k in self.held if k[:2] == (event.conn_id, message.id)]
            assert all(k[2] < message.attempts for k in older)
            self.held[(event.conn_id, message.id, message.attempts)] = message.body

    @rule(nsqd=st.integers(0, 2), count=st.integers(1, 5))
    def publish(self, nsqd: int, count: int) -> None:
        target = self.nsqds[nsqd % len(self.nsqds)]
        if not target.running:
            return
        for _ in range(count):
            body = b"m%d" % self.next
            self.next += 1
            self.published.add(body)
            target.publish("t", body, self.net.now)
        self.net.run_until_idle()

    @precondition(lambda self: self.held)
    @rule(data=st.data(), ok=st.booleans())
    def answer(self, data: st.DataObject, ok: bool) -> None:
        key = data.draw(st.sampled_from(sorted(self.held)))
        body = self.held.pop(key)
        conn_id, msg_id, attempts = key
        if ok:
            if self.consumer.finish(conn_id, msg_id, self.net.now, attempts=attempts):
                self.finished.append(body)
        else:
            self.consumer.requeue(conn_id, msg_id, self.net.now, attempts=attempts)
        self.net.run_until_idle()

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def touch(self, data: st.DataObject) -> None:
        conn_id, msg_id, attempts = data.draw(st.sampled_from(sorted(self.held)))
        self.consumer.touch(conn_id, msg_id, self.net.now, attempts=attempts)
        self.net.run_until_idle()

    @rule(seconds=st.sampled_from([0.2, 1.0, 5.0, 31.0]))
    def advance(self, seconds: float) -> None:
        self.net.advance(seconds)
        self.forget_dead()

    @rule(nsqd=st.integers(0, 2))
    def drop_connections(self, nsqd: int) -> None:
        self.nsqds[nsqd % len(self.nsqds)].drop_connections(self.net.now)
        self.net.run_until_idle()
        self.forget_dead()

    @rule(nsqd=st.integers(0, 2))
    def restart(self, nsqd: int) -> None:
        target = self.nsqds[nsqd % len(self.nsqds)]
        target.stop(self.net.now)
        self.net.run_until_idle()
        self.forget_dead()
        target.start(self.net.now)

    @rule(value=st.integers(0, 6))
    def resize(self, value: int) -> None:
        self.consumer.set_max_in_flight(value, self.net.now)
        self.net.run_until_idle()

    def forget_dead(self) -> None:
        # answers for a lost connection cannot reach nsqd: it delivers those messages again
        alive = {s.conn_id for s in self.consumer.connections()}
        self.held = {k: v for k, v in self.held.items() if k[0] in alive}

    @invariant()
    def rdy_within_limits_as_nsqd_sees_it(self) -> None:
        if not hasattr(self, "consumer"):
            return
        ready = sum(
            s.ready_count for n in self.nsqds if n.running for s in n.client_stats() if not s.closed
        )
        assert ready <= self.consumer.max_in_flight
        assert all(s.ready_count <= 4 for n in self.nsqds if n.running for s in n.client_stats())
        assert self.consumer.total_rdy <= self.consumer.max_in_flight

    def teardown(self) -> None:
        if not hasattr(self, "consumer"):
            return
        # let everything recover, then finish whatever comes: every message arrives
        self.consumer.set_max_in_flight(6, self.net.now)
        for nsqd in self.nsqds:
            nsqd.start(self.net.now)
        for _ in range(200):
            for key, body in list(self.held.items()):
                del self.held[key]
                if self.consumer.finish(key[0], key[1], self.net.now, attempts=key[2]):
                    self.finished.append(body)
            self.net.advance(2.0)
            self.forget_dead()
            if set(self.finished) >= self.published and not self.held:
                break
        assert set(self.finished) == self.published, "a published message was never delivered"


ConsumerAgainstNsqd.TestCase.settings = settings(
    max_examples=80, stateful_step_count=25, deadline=None
)
TestConsumerAgainstNsqd = ConsumerAgainstNsqd.TestCase


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
