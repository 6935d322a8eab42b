"""Where the state machines meet: the consumer core against the emulated nsqd over the
in-memory network, driven by hypothesis (publish, answer, drop, restart, resize, time)."""

from __future__ import annotations

import random

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from nsq_proto import Consumer, ConsumerConfig, ErrorReceived, Event, MessageReceived
from nsq_proto.testing import MemoryNetwork, Nsqd, NsqdOptions


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
