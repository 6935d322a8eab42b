"""The table of connection state transitions (``nsq_proto/_state.py``): its invariants, the
named sets of states it implies, and a Connection driven at random that moves only along it."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsq_proto import (
    Connection,
    ConnectionConfig,
    ConnectionState,
    LocalProtocolError,
    StartTLS,
)
from nsq_proto._compress import DeflateCodec
from nsq_proto._state import (
    ACTIVE,
    ALLOWED,
    CAN_ANSWER,
    CAN_RDY,
    CAN_RECEIVE_MESSAGES,
    CLOSING_STATES,
    HANDSHAKE_STATES,
    OPEN,
    TRANSITIONS,
    Command,
    Trigger,
    next_state,
)

from .helpers import error, identify_response, message, mid, response, state_of

S = ConnectionState
T = Trigger


def reachable(start: ConnectionState, without: Iterable[Trigger] = ()) -> set[ConnectionState]:
    """The states the table leads to from ``start`` (itself included), never through
    ``without``."""
    excluded = set(without)
    seen = {start}
    todo = [start]
    while todo:
        state = todo.pop()
        for (source, trigger), target in TRANSITIONS.items():
            if source is state and trigger not in excluded and target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


# ---------------------------------------------------------------------- the table


def test_every_state_but_closed_can_end() -> None:
    for state in ConnectionState:
        if state is not S.CLOSED:
            assert next_state(state, T.ENDED) is S.CLOSED


def test_closed_is_terminal() -> None:
    assert not [key for key in TRANSITIONS if key[0] is S.CLOSED]
    for trigger in Trigger:
        with pytest.raises(LocalProtocolError):
            next_state(S.CLOSED, trigger)


def test_every_state_is_reachable_from_init() -> None:
    assert reachable(S.INIT) == set(ConnectionState)


def test_every_trigger_moves_some_state() -> None:
    assert {trigger for _, trigger in TRANSITIONS} == set(Trigger)


@pytest.mark.parametrize(
    ("state", "trigger"),
    [(s, t) for s in ConnectionState for t in Trigger if (s, t) not in TRANSITIONS],
)
def test_a_move_not_in_the_table_raises_naming_the_state_and_the_trigger(
    state: ConnectionState, trigger: Trigger
) -> None:
    with pytest.raises(LocalProtocolError) as caught:
        next_state(state, trigger)
    assert state.value in str(caught.value)
    assert trigger.value in str(caught.value)


def test_a_move_in_the_table_leads_where_the_table_says() -> None:
    for (state, trigger), target in TRANSITIONS.items():
        assert next_state(state, trigger) is target


def test_a_sub_answered_after_cls_leaves_the_connection_closing() -> None:
    assert next_state(S.SUBSCRIBING, T.SUB_ANSWERED) is S.SUBSCRIBED
    assert next_state(S.CLOSING, T.SUB_ANSWERED) is S.CLOSING


# ---------------------------------------------------------------------- the named sets


def test_the_handshake_states_are_those_between_identify_and_its_end() -> None:
    assert reachable(S.IDENTIFYING, without=[T.HANDSHAKE_DONE, T.ENDED]) == HANDSHAKE_STATES


def test_the_open_states_are_those_after_the_handshake_until_the_end() -> None:
    assert reachable(S.READY, without=[T.ENDED]) == OPEN


def test_a_connection_receives_and_answers_messages_from_sub_until_the_end() -> None:
    assert reachable(S.SUBSCRIBING, without=[T.ENDED]) == CAN_RECEIVE_MESSAGES
    assert CAN_ANSWER == CAN_RECEIVE_MESSAGES


def test_the_closing_states_are_those_after_cls_until_the_end() -> None:
    assert reachable(S.CLOSING, without=[T.ENDED]) == CLOSING_STATES
    assert {target for (_, trigger), target in TRANSITIONS.items() if trigger is T.CLS_SENT} == {
        S.CLOSING
    }


def test_rdy_may_be_sent_from_sub_until_cls() -> None:
    assert CAN_RDY == CAN_RECEIVE_MESSAGES - CLOSING_STATES
    assert {state for state, trigger in TRANSITIONS if trigger is T.CLS_SENT} == CAN_RDY


def test_the_connections_active_for_rdy_planning_are_the_open_ones_not_closing() -> None:
    assert ACTIVE == OPEN - CLOSING_STATES


def test_the_allowed_commands_agree_with_the_table() -> None:
    assert ALLOWED[Command.SUB] == {s for s, t in TRANSITIONS if t is T.SUB_SENT}
    assert ALLOWED[Command.CLS] == {s for s, t in TRANSITIONS if t is T.CLS_SENT}
    assert ALLOWED[Command.RDY] == CAN_RDY
    assert ALLOWED[Command.ANSWER] == CAN_ANSWER
    assert ALLOWED[Command.PUB] == ALLOWED[Command.NOP] == OPEN


# ---------------------------------------------------------------------- a connection at random


class Session:
    """A Connection and the server side of it, reduced to what drives the states: each step
    is one API call, one transport event or one frame from the server."""

    def __init__(self, config: ConnectionConfig, server_auth: bool) -> None:
        self.conn = Connection(config)
        self.config = config
        self.server_auth = server_auth
        self.now = 0.0
        #: the server's compressor once it switched compression on
        self.codec: DeflateCodec | None = None
        #: the requests sent and not answered, in order: "SUB", "PUB" or "CLS"
        self.pending: list[str] = []
        self.delivered: list[bytes] = []
        self.next_msg = 0

    def frame(self, data: bytes) -> None:
        if self.codec is not None:
            data = self.codec.compress(data)
        self.conn.receive_data(data, self.now)

    def steps(
        self, draw: st.DataObject
    ) -> tuple[list[tuple[str, Callable[[], None]]], list[tuple[str, Callable[[], None]]]]:
        """The steps that make sense in the connection's current state: those that go on, and
        those that may end the connection."""
        conn = self.conn
        state = conn.state
        ending: list[tuple[str, Callable[[], None]]] = [
            ("close", conn.close),
            ("connection_lost", lambda: conn.connection_lost(self.now)),
            ("connection_lost(error)", lambda: conn.connection_lost(self.now, OSError("x"))),
            ("time passes", lambda: self.time_passes(draw, [20.0, 100.0])),
        ]
        steps: list[tuple[str, Callable[[], None]]] = [
            ("a moment passes", lambda: self.time_passes(draw, [0.5, 2.0])),
        ]
        if state is S.INIT:
            steps.append(("connection_made", lambda: conn.connection_made(self.now)))
        if state is S.TLS_HANDSHAKE:
            steps.append(("tls_established", lambda: conn.tls_established(self.now)))
        if state in HANDSHAKE_STATES and state is not S.TLS_HANDSHAKE:
            steps.append(("handshake answer", self.handshake_answer))
        if state not in (S.INIT, S.TLS_HANDSHAKE, S.CLOSED):
            steps.append(("heartbeat", lambda: self.frame(response(b"_heartbeat_"))))
            steps.append(("non-fatal error", lambda: self.frame(error(b"E_FIN_FAILED x"))))
            ending.append(("fatal error", lambda: self.frame(error(b"E_INVALID x"))))
        if state is S.READY:
            steps.append(("subscribe", self.subscribe))
        if state in OPEN:
            steps.append(("publish", self.publish))
            steps.append(("nop", conn.nop))
        if self.pending and state is not S.CLOSED:
            steps.append(("answer a request", self.answer_request))
        if state in CAN_RECEIVE_MESSAGES:
            steps.append(("deliver", self.deliver))
        if state in CAN_ANSWER and self.delivered:
            steps.append(("answer a message", lambda: self.answer_message(draw)))
        if state in CAN_RDY:
            steps.append(("rdy", lambda: conn.rdy(draw.draw(st.integers(0, 2500)))))
            steps.append(("start_close", self.start_close))
        refused = [c for c in Command if state not in ALLOWED[c]]
        if refused:
            steps.append(("a refused command", lambda: self.refused(draw, refused)))
        return steps, ending

    def time_passes(self, draw: st.DataObject, seconds: list[float]) -> None:
        self.now += draw.draw(st.sampled_from(seconds))
        self.conn.handle_timer(self.now)

    def handshake_answer(self) -> None:
        state = self.conn.state
        if state is S.IDENTIFYING:
            tls = self.config.tls_v1
            self.frame(
                identify_response(
                    tls_v1=tls, deflate=self.config.deflate, auth_required=self.server_auth
                )
            )
            if self.config.deflate and not tls:
                self.codec = DeflateCodec()
        elif state is S.TLS_RESPONSE:
            self.frame(response(b"OK"))
            if self.config.deflate:
                self.codec = DeflateCodec()
        elif state is S.COMPRESSION_RESPONSE:
            self.frame(response(b"OK"))
        else:
            assert state is S.AUTHENTICATING
            self.frame(response(b'{"identity":"u","identity_url":"","permission_count":1}'))

    def subscribe(self) -> None:
        self.conn.subscribe("t", "c")
        self.pending.append("SUB")

    def publish(self) -> None:
        self.conn.publish("t", b"x")
        self.pending.append("PUB")

    def start_close(self) -> None:
        self.conn.start_close()
        self.pending.append("CLS")

    def answer_request(self) -> None:
        kind = self.pending.pop(0)
        self.frame(response(b"CLOSE_WAIT" if kind == "CLS" else b"OK"))

    def deliver(self) -> None:
        msg_id = mid(self.next_msg)
        self.next_msg += 1
        self.frame(message(msg_id, b"m"))
        self.delivered.append(msg_id)

    def answer_message(self, draw: st.DataObject) -> None:
        msg_id = draw.draw(st.sampled_from(self.delivered))
        how = draw.draw(st.sampled_from(["finish", "requeue", "touch"]))
        if how == "finish":
            self.conn.finish(msg_id)
        elif how == "requeue":
            self.conn.requeue(msg_id, 1.0)
        else:
            self.conn.touch(msg_id)
            return
        self.delivered.remove(msg_id)

    def refused(self, draw: st.DataObject, commands: list[Command]) -> None:
        command = draw.draw(st.sampled_from(commands))
        calls: dict[Command, Callable[[], object]] = {
            Command.SUB: lambda: self.conn.subscribe("t", "c"),
            Command.PUB: lambda: self.conn.publish("t", b"x"),
            Command.RDY: lambda: self.conn.rdy(1),
            Command.ANSWER: lambda: self.conn.finish(mid(0)),
            Command.CLS: self.conn.start_close,
            Command.NOP: self.conn.nop,
        }
        with pytest.raises(LocalProtocolError):
            calls[command]()


@settings(max_examples=300, deadline=None)
@given(
    tls=st.booleans(),
    deflate=st.booleans(),
    server_auth=st.booleans(),
    secret=st.booleans(),
    data=st.data(),
)
def test_a_connection_driven_at_random_changes_state_only_along_the_table(
    tls: bool, deflate: bool, server_auth: bool, secret: bool, data: st.DataObject
) -> None:
    config = ConnectionConfig(tls_v1=tls, deflate=deflate, auth_secret=b"s" if secret else None)
    session = Session(config, server_auth)
    conn = session.conn
    for _ in range(80):
        before = state_of(conn)
        if before is S.CLOSED:
            break
        steps, ending = session.steps(data)
        if data.draw(st.integers(0, 15), label="an ending step?") == 15:
            steps = ending
        name, step = data.draw(st.sampled_from(steps), label="step")
        step()
        after = state_of(conn)
        if after is not before:
            # one step makes at most one move: it must be a row of the table
            triggers = [t for t in Trigger if TRANSITIONS.get((before, t)) is after]
            assert triggers, f"{name}: {before.value} -> {after.value} is not in the table"
        outputs = conn.outputs()
        if after is S.TLS_HANDSHAKE and before is not S.TLS_HANDSHAKE:
            assert any(isinstance(o, StartTLS) for o in outputs)
    # once closed, nothing moves the connection any more
    if state_of(conn) is S.CLOSED:
        conn.close()
        conn.connection_lost(session.now)
        conn.handle_timer(session.now + 1000.0)
        assert state_of(conn) is S.CLOSED
