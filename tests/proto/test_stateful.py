"""Consumer core x a model of nsqd, driven by hypothesis: connections come and go, messages
are delivered, answered and time out, timers fire and max_in_flight changes.  After every step
the RDY invariants must hold and no message may be lost or answered twice."""

from __future__ import annotations

import random

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from nsq_proto import MessageReceived, Send
from nsq_proto._consumer import Consumer, ConsumerConfig
from nsq_proto._outputs import Close, Connect

from .helpers import identify_response, message, response

MAX_RDY = 3


class FakeNsqd:
    """The server side of one connection, reduced to what the invariants need."""

    def __init__(self) -> None:
        self.buf = b""
        self.rdy = 0
        self.in_flight: set[bytes] = set()
        self.identified = False

    def feed(self, data: bytes) -> list[tuple[str, bytes]]:
        self.buf += data
        cmds: list[tuple[str, bytes]] = []
        while True:
            if not self.identified:
                if self.buf.startswith(b"  V2"):
                    self.buf = self.buf[4:]
                if self.buf.startswith(b"IDENTIFY\n") and len(self.buf) >= 13:
                    size = int.from_bytes(self.buf[9:13], "big")
                    if len(self.buf) < 13 + size:
                        return cmds
                    self.buf = self.buf[13 + size :]
                    self.identified = True
                    cmds.append(("IDENTIFY", b""))
                    continue
                return cmds
            if b"\n" not in self.buf:
                return cmds
            if self.buf.startswith((b"FIN ", b"TOUCH ")):
                n = 4 if self.buf.startswith(b"FIN ") else 6
                cmds.append((self.buf[: n - 1].decode(), self.buf[n : n + 16]))
                self.buf = self.buf[n + 17 :]
                continue
            line, _, self.buf = self.buf.partition(b"\n")
            name, _, arg = line.partition(b" ")
            cmds.append((name.decode(), arg))


class ConsumerMachine(RuleBasedStateMachine):
    @initialize(
        n=st.integers(1, 4),
        max_in_flight=st.integers(0, 8),
        seed=st.integers(0, 2**16),
    )
    def setup(self, n: int, max_in_flight: int, seed: int) -> None:
        self.now = 0.0
        self.core = Consumer(
            "t",
            "c",
            ConsumerConfig(
                max_in_flight=max_in_flight,
                max_attempts=0,
                backoff_multiplier=0.5,
                max_backoff_duration=4.0,
                reconnect_delay=1.0,
                reconnect_jitter=0.0,
                heartbeat_interval=None,
            ),
            nsqd_tcp_addresses=[f"10.0.0.{i}:4150" for i in range(n)],
            rng=random.Random(seed),
        )
        self.servers: dict[int, FakeNsqd] = {}
        self.held: dict[tuple[int, bytes], int] = {}  # messages the application holds
        self.answered: set[tuple[int, bytes]] = set()
        self.next_msg = 0
        self.stuck_since: float | None = None
        self.core.start(self.now)
        self.pump()

    def pump(self) -> None:
        for _ in range(50):
            out = self.core.outputs()
            if not out:
                return
            for o in out:
                if isinstance(o, Connect):
                    self.servers[o.conn_id] = FakeNsqd()
                    self.core.connection_made(o.conn_id, self.now)
                elif isinstance(o, Send):
                    self.server_receives(o.conn_id, o.data)
                elif isinstance(o, Close):
                    self.drop_server(o.conn_id)
                elif isinstance(o, MessageReceived):
                    key = (o.conn_id, o.message.id)
                    assert key not in self.held, "delivered twice while held"
                    self.held[key] = o.message.attempts
        raise AssertionError("the core keeps producing outputs")

    def server_receives(self, conn_id: int, data: bytes) -> None:
        server = self.servers.get(conn_id)
        if server is None:
            return
        for name, arg in server.feed(data):
            if name == "IDENTIFY":
                self.core.receive_data(conn_id, identify_response(max_rdy_count=MAX_RDY), self.now)
            elif name == "SUB":
                self.core.receive_data(conn_id, response(b"OK"), self.now)
            elif name == "RDY":
                count = int(arg)
                assert 0 <= count <= MAX_RDY, "RDY above max_rdy_count"
                server.rdy = count
            elif name in ("FIN", "REQ"):
                msg_id = arg[:16]
                assert msg_id in server.in_flight, "answer for a message not in flight"
                server.in_flight.discard(msg_id)
            elif name == "CLS":
                self.core.receive_data(conn_id, response(b"CLOSE_WAIT"), self.now)

    def drop_server(self, conn_id: int) -> None:
        self.servers.pop(conn_id, None)

    # ------------------------------------------------------------------ rules

    @rule(data=st.data())
    def deliver(self, data: st.DataObject) -> None:
        ready = [c for c, s in self.servers.items() if len(s.in_flight) < s.rdy]
        if not ready:
            return
        conn_id = data.draw(st.sampled_from(sorted(ready)))
        self.next_msg += 1
        msg_id = f"{self.next_msg:016x}".encode()
        self.servers[conn_id].in_flight.add(msg_id)
        self.core.receive_data(conn_id, message(msg_id, b"m", attempts=1), self.now)
        self.pump()

    @precondition(lambda self: self.held)
    @rule(data=st.data(), how=st.sampled_from(["fin", "req", "req_nobackoff"]))
    def answer(self, data: st.DataObject, how: str) -> None:
        key = data.draw(st.sampled_from(sorted(self.held)))
        del self.held[key]
        assert key not in self.answered
        self.answered.add(key)
        conn_id, msg_id = key
        if how == "fin":
            self.core.finish(conn_id, msg_id, self.now)
        else:
            self.core.requeue(conn_id, msg_id, self.now, backoff=how == "req")
        self.pump()

    @rule(seconds=st.sampled_from([0.1, 1.0, 5.0, 30.0]))
    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.core.handle_timer(self.now)
        self.pump()

    @precondition(lambda self: self.servers)
    @rule(data=st.data())
    def drop_connection(self, data: st.DataObject) -> None:
        conn_id = data.draw(st.sampled_from(sorted(self.servers)))
        self.drop_server(conn_id)
        # nsqd requeues what was in flight there; the application's answers cannot reach it
        self.held = {k: v for k, v in self.held.items() if k[0] != conn_id}
        self.core.connection_lost(conn_id, self.now, OSError("dropped"))
        self.pump()

    @rule(value=st.integers(0, 8))
    def change_max_in_flight(self, value: int) -> None:
        self.core.set_max_in_flight(value, self.now)
        self.pump()

    # ------------------------------------------------------------------ invariants

    @invariant()
    def rdy_within_limits(self) -> None:
        stats = self.core.connections()
        assert sum(s.rdy for s in stats) <= self.core.max_in_flight
        assert all(0 <= s.rdy <= MAX_RDY for s in stats)
        assert sum(s.rdy for s in stats) == self.core.total_rdy
        # the server's view agrees with the core's
        for s in stats:
            server = self.servers.get(s.conn_id)
            if server is not None:
                assert server.rdy == s.rdy

    @invariant()
    def nothing_held_is_lost(self) -> None:
        for conn_id, msg_id in self.held:
            assert msg_id in self.servers[conn_id].in_flight

    @invariant()
    def never_stuck_at_rdy_zero(self) -> None:
        core = self.core
        subscribed = [s for s in core.connections() if s.state == "SUBSCRIBED"]
        stuck = (
            subscribed
            and core.max_in_flight > 0
            and core.total_rdy == 0
            and not self.held
            and not core._rdy.in_backoff_window
        )
        if not stuck:
            self.stuck_since = None
            return
        if self.stuck_since is None:
            self.stuck_since = self.now
        assert self.now - self.stuck_since <= 2 * core.config.rdy_redistribute_interval + 1, (
            "stuck at RDY 0"
        )


ConsumerMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=50, deadline=None
)
TestConsumerStateful = ConsumerMachine.TestCase
