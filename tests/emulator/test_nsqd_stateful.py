"""Stateful property test of the emulated nsqd from the server's point of view.

Producers publish, consumers subscribe, change RDY, FIN, REQ (with and without delay) and
TOUCH, connections come and go, and time advances.  After every step: every published
message is in the channel exactly once (queued, in flight or deferred) or was finished
exactly once, nothing is delivered to a client that is not ready (in flight never exceeds
RDY after a delivery), each redelivery carries attempts + 1, and the server's per-client
in-flight counts agree with the channel.
"""

from __future__ import annotations

from collections import Counter

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from nsq_emulator import Nsqd
from tests.support.emulator_client import Client

N_CLIENTS = 3
IDENT = {"feature_negotiation": True, "heartbeat_interval": 60000, "msg_timeout": 2000}


class ChannelMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.nsqd = Nsqd()
        self.nsqd.create_channel("t", "c", self.now)
        self.clients = [self._new_client() for _ in range(N_CLIENTS)]
        self.held: list[dict[bytes, int]] = [{} for _ in range(N_CLIENTS)]
        self.published: set[bytes] = set()
        self.finished: Counter[bytes] = Counter()
        self.attempts: dict[bytes, int] = {}
        self.body_of: dict[bytes, bytes] = {}
        self.serial = 0

    def _new_client(self) -> Client:
        c = Client(self.nsqd, self.now, identify=IDENT)
        c.subscribe("t", "c", self.now)
        return c

    def _collect(self, extra: dict[int, list[tuple[int, bytes]]] | None = None) -> None:
        """Read every client's frames; check deliveries against RDY and attempts.

        One call can cover several timer firings, so a message may have been redelivered
        more than once (to different clients): its attempts must continue the sequence."""
        seen: dict[bytes, list[int]] = {}
        for i, c in enumerate(self.clients):
            frames = (extra or {}).get(i, []) + c.read()
            errors = [d for t, d in frames if t == 1]
            for err in errors:
                assert err.split(b" ", 1)[0] in (
                    b"E_FIN_FAILED",
                    b"E_REQ_FAILED",
                    b"E_TOUCH_FAILED",
                ), err
            msgs = c.messages(frames)
            if msgs:
                assert c.conn.in_flight_count <= c.conn.ready_count
            for m in msgs:
                assert self.body_of[m.id] == m.body
                seen.setdefault(m.id, []).append(m.attempts)
                self.held[i][m.id] = m.attempts
            assert not c.conn.closed
        for msg_id, attempts in seen.items():
            start = self.attempts.get(msg_id, 0)
            assert sorted(attempts) == list(range(start + 1, start + 1 + len(attempts))), attempts
            self.attempts[msg_id] = start + len(attempts)

    # -- rules ---------------------------------------------------------------------------

    @rule(count=st.integers(1, 4), delay=st.sampled_from([0.0, 0.0, 0.0, 1.5]))
    def publish(self, count: int, delay: float) -> None:
        for _ in range(count):
            self.serial += 1
            data = b"m%d" % self.serial
            msg_id = self.nsqd.publish("t", data, self.now, delay=delay)
            self.published.add(msg_id)
            self.body_of[msg_id] = data
        self._collect()

    @rule(i=st.integers(0, N_CLIENTS - 1), n=st.integers(0, 4))
    def rdy(self, i: int, n: int) -> None:
        self.clients[i].send(b"RDY %d\n" % n, self.now)
        self._collect()

    @rule(i=st.integers(0, N_CLIENTS - 1), data=st.data())
    def fin(self, i: int, data: st.DataObject) -> None:
        if not self.held[i]:
            return
        msg_id = data.draw(st.sampled_from(sorted(self.held[i])))
        owned = self._owned_by(i, msg_id)
        del self.held[i][msg_id]
        c = self.clients[i]
        c.fin(msg_id, self.now)
        frames = c.read()
        if owned:
            assert not [d for t, d in frames if t == 1]
            self.finished[msg_id] += 1
        else:
            assert [d.split(b" ")[0] for t, d in frames if t == 1] == [b"E_FIN_FAILED"]
        self._collect_frames(i, frames)

    @rule(
        i=st.integers(0, N_CLIENTS - 1), delay_ms=st.sampled_from([0, 0, 500, 3000]), data=st.data()
    )
    def req(self, i: int, delay_ms: int, data: st.DataObject) -> None:
        if not self.held[i]:
            return
        msg_id = data.draw(st.sampled_from(sorted(self.held[i])))
        owned = self._owned_by(i, msg_id)
        del self.held[i][msg_id]
        c = self.clients[i]
        c.req(msg_id, delay_ms, self.now)
        frames = c.read()
        errors = [d.split(b" ")[0] for t, d in frames if t == 1]
        assert errors == ([] if owned else [b"E_REQ_FAILED"])
        self._collect_frames(i, frames)

    @rule(i=st.integers(0, N_CLIENTS - 1), data=st.data())
    def touch(self, i: int, data: st.DataObject) -> None:
        if not self.held[i]:
            return
        msg_id = data.draw(st.sampled_from(sorted(self.held[i])))
        owned = self._owned_by(i, msg_id)
        c = self.clients[i]
        c.touch(msg_id, self.now)
        frames = c.read()
        errors = [d.split(b" ")[0] for t, d in frames if t == 1]
        assert errors == ([] if owned else [b"E_TOUCH_FAILED"])
        self._collect_frames(i, frames)

    @rule(dt=st.sampled_from([0.1, 0.5, 1.0, 2.5]))
    def advance(self, dt: float) -> None:
        self.now += dt
        self.nsqd.handle_timer(self.now)
        for c in self.clients:
            c.send(b"NOP\n", self.now)
        self._collect()

    @precondition(lambda self: self.serial > 0)
    @rule(i=st.integers(0, N_CLIENTS - 1))
    def reconnect(self, i: int) -> None:
        old = self.clients[i]
        old.send(b"", self.now)
        assert old.conn.closed
        self.held[i] = {}
        self.clients[i] = self._new_client()
        self._collect()

    # -- helpers and invariants ------------------------------------------------------------

    def _owned_by(self, i: int, msg_id: bytes) -> bool:
        entries = {m.id: m for m in self.nsqd.channel_messages("t", "c") if m.state == "in_flight"}
        entry = entries.get(msg_id)
        return entry is not None and entry.client == self.clients[i].conn.id

    def _collect_frames(self, i: int, frames: list[tuple[int, bytes]]) -> None:
        self._collect({i: frames})

    @invariant()
    def nothing_lost_or_duplicated(self) -> None:
        present = Counter(m.id for m in self.nsqd.channel_messages("t", "c"))
        for msg_id in self.published:
            assert present[msg_id] + self.finished[msg_id] == 1, msg_id
        assert set(present) <= self.published

    @invariant()
    def server_counts_agree(self) -> None:
        in_flight = Counter(
            m.client for m in self.nsqd.channel_messages("t", "c") if m.state == "in_flight"
        )
        for c in self.clients:
            assert c.conn.in_flight_count == in_flight[c.conn.id]
            assert c.conn.in_flight_count >= 0
        stats = self.nsqd.channel_stats("t", "c")
        assert stats.in_flight_count == sum(in_flight.values())
        assert stats.client_count == N_CLIENTS


ChannelMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=30, deadline=None, database=None
)
TestChannelMachine = ChannelMachine.TestCase
