from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsq_emulator.frames import encode_message_data, encode_trace_receipt
from nsq_proto import (
    AuthRequired,
    Close,
    CloseWaitReceived,
    Connection,
    ConnectionClosed,
    ConnectionClosedError,
    ConnectionConfig,
    ConnectionState,
    ErrorReceived,
    HandshakeTimeout,
    HeartbeatReceived,
    LocalProtocolError,
    Message,
    MessageReceived,
    MessagesReceived,
    PublishFailed,
    PublishSucceeded,
    ReadTimeout,
    Ready,
    RemoteProtocolError,
    Send,
    ServerError,
    StartTLS,
    Subscribed,
    TraceReceipt,
)
from nsq_proto import commands as cmd
from nsq_proto._connection import _BYTEWISE_HEADERS, _standard_run
from nsq_proto._message import builds_by_fields
from nsq_proto._state import ALLOWED, Command
from nsq_proto.wire import encode_frame

from .helpers import (
    error,
    identify_response,
    message,
    mid,
    of_type,
    ready_connection,
    response,
    sent,
    sent_on,
    state_of,
    subscribed_connection,
)


def test_handshake_sends_magic_and_identify() -> None:
    conn = Connection(ConnectionConfig(client_id="a", hostname="h", user_agent="ua/1"))
    assert conn.next_output() is None
    conn.connection_made(0.0)
    out = conn.outputs()
    assert out == [
        Send(
            0,
            b"  V2IDENTIFY\n\x00\x00\x00\x6a"
            b'{"client_id":"a","hostname":"h","heartbeat_interval":30000,'
            b'"feature_negotiation":true,"user_agent":"ua/1"}',
        )
    ]
    assert conn.state is ConnectionState.IDENTIFYING
    conn.receive_data(identify_response(max_rdy_count=200), 0.1)
    (ready,) = conn.outputs()
    assert isinstance(ready, Ready)
    assert ready.features.max_rdy_count == 200
    assert ready.features.msg_timeout == 60.0
    assert ready.features.negotiated
    assert state_of(conn) is ConnectionState.READY


def test_plain_ok_to_identify_means_defaults() -> None:
    conn = Connection()
    conn.connection_made(0.0)
    conn.outputs()
    conn.receive_data(response(b"OK"), 0.0)
    (ready,) = conn.outputs()
    assert isinstance(ready, Ready)
    assert ready.features.max_rdy_count == 2500
    assert not ready.features.negotiated


def test_identify_response_not_json_is_a_remote_error() -> None:
    conn = Connection()
    conn.connection_made(0.0)
    conn.outputs()
    with pytest.raises(RemoteProtocolError):
        conn.receive_data(response(b"{not json"), 0.0)
    out = conn.outputs()
    assert isinstance(out[0], Close)
    assert isinstance(out[1], ConnectionClosed) and isinstance(out[1].error, RemoteProtocolError)
    assert conn.state is ConnectionState.CLOSED
    # later data is ignored, commands refused
    conn.receive_data(response(b"OK"), 0.0)
    assert conn.outputs() == []
    with pytest.raises(LocalProtocolError):
        conn.publish("t", b"x")


def test_server_enabling_unrequested_compression_is_an_error() -> None:
    conn = Connection()
    conn.connection_made(0.0)
    with pytest.raises(RemoteProtocolError, match="snappy"):
        conn.receive_data(identify_response(snappy=True), 0.0)


def test_tls_upgrade_hands_back_buffered_bytes_and_waits() -> None:
    conn = Connection(ConnectionConfig(tls_v1=True, snappy=True))
    conn.connection_made(0.0)
    conn.outputs()
    conn.receive_data(identify_response(tls_v1=True, snappy=True) + b"\x16\x03\x01", 0.0)
    out = conn.outputs()
    assert out == [StartTLS(0, b"\x16\x03\x01")]
    assert conn.state is ConnectionState.TLS_HANDSHAKE
    with pytest.raises(LocalProtocolError):
        conn.receive_data(b"x", 0.0)
    conn.tls_established(0.1)
    # OK inside TLS (plain), then the snappy-compressed OK, in one read
    from nsq_proto.wire import SnappyCodec

    server = SnappyCodec()
    conn.receive_data(response(b"OK") + server.compress(response(b"OK")), 0.2)
    (ready,) = conn.outputs()
    assert isinstance(ready, Ready) and ready.features.tls_v1 and ready.features.snappy
    conn.subscribe("t", "c")
    (send,) = conn.outputs()
    assert isinstance(send, Send)
    assert send.data == bytes.fromhex("ff060000734e61507059010c000032e32014535542207420630a")


def test_deflate_switch_in_the_same_read_as_identify_response() -> None:
    from nsq_proto.wire import DeflateCodec

    conn = Connection(ConnectionConfig(deflate=True, deflate_level=6))
    conn.connection_made(0.0)
    conn.outputs()
    server = DeflateCodec(6)
    conn.receive_data(
        identify_response(deflate=True)
        + server.compress(response(b"OK") + response(b"_heartbeat_")),
        0.0,
    )
    out = conn.outputs()
    assert isinstance(out[0], Ready)
    assert isinstance(out[1], Send)
    assert isinstance(out[2], HeartbeatReceived)
    # the NOP reply is deflated, with a sync flush
    assert out[1].data == bytes.fromhex("f2f30fe002000000ffff")


def test_auth_flow() -> None:
    conn = Connection(ConnectionConfig(auth_secret=b"good-secret"))
    conn.connection_made(0.0)
    conn.outputs()
    conn.receive_data(identify_response(auth_required=True), 0.0)
    assert sent(conn.outputs()) == b"AUTH\n\x00\x00\x00\x0bgood-secret"
    assert conn.state is ConnectionState.AUTHENTICATING
    conn.receive_data(
        response(b'{"identity":"u","identity_url":"https://x.invalid/u","permission_count":1}'), 0.0
    )
    (ready,) = conn.outputs()
    assert isinstance(ready, Ready)
    assert (
        ready.auth is not None and ready.auth.identity == "u" and ready.auth.permission_count == 1
    )


def test_auth_required_without_secret_closes_with_typed_error() -> None:
    conn = Connection()
    conn.connection_made(0.0)
    conn.outputs()
    conn.receive_data(identify_response(auth_required=True), 0.0)
    out = conn.outputs()
    assert isinstance(out[0], Close)
    assert isinstance(out[1], ConnectionClosed) and isinstance(out[1].error, AuthRequired)


def test_secret_is_not_sent_when_auth_is_not_required() -> None:
    conn = Connection(ConnectionConfig(auth_secret=b"s"))
    conn.connection_made(0.0)
    conn.outputs()
    conn.receive_data(identify_response(), 0.0)
    out = conn.outputs()
    assert [type(o) for o in out] == [Ready]


def test_heartbeat_is_answered_with_nop() -> None:
    conn = subscribed_connection()
    conn.receive_data(response(b"_heartbeat_"), 1.0)
    assert conn.outputs() == [Send(0, b"NOP\n"), HeartbeatReceived(0)]


def test_subscribe_and_messages() -> None:
    conn = ready_connection()
    conn.subscribe("t", "c")
    conn.rdy(2)
    assert sent(conn.outputs()) == b"SUB t c\nRDY 2\n"
    conn.receive_data(response(b"OK") + message(mid(1), b"a") + message(mid(2), b"b", 3), 0.0)
    out = conn.outputs()
    assert out[0] == Subscribed(0)
    messages = [o.message for o in out[1:] if isinstance(o, MessageReceived)]
    assert len(messages) == len(out) - 1
    assert [(m.id, m.body, m.attempts) for m in messages] == [
        (mid(1), b"a", 1),
        (mid(2), b"b", 3),
    ]
    conn.finish(mid(1))
    conn.requeue(mid(2), 1.5)
    conn.touch(mid(2))
    assert sent(conn.outputs()) == (
        b"FIN " + mid(1) + b"\nREQ " + mid(2) + b" 1500\nTOUCH " + mid(2) + b"\n"
    )


def test_finish_many_delivered_writes_what_finish_many_writes_and_checks_the_state() -> None:
    """The core's bulk FIN of ids its book held: the same bytes as ``finish_many`` (nothing
    for no id), and refused as every answer is once the connection cannot answer."""
    ids = [mid(1), mid(2), mid(3)]
    checked, delivered = subscribed_connection(), subscribed_connection()
    checked.finish_many(ids)
    delivered.finish_many_delivered(ids)
    delivered.finish_many_delivered([])
    assert (
        sent(delivered.outputs())
        == sent(checked.outputs())
        == b"".join(b"FIN " + i + b"\n" for i in ids)
    )
    conn = ready_connection()  # not subscribed: nothing to answer
    with pytest.raises(LocalProtocolError):
        conn.finish_many_delivered(ids)
    assert conn.outputs() == []


def test_message_before_subscribe_is_a_protocol_error() -> None:
    conn = ready_connection()
    with pytest.raises(RemoteProtocolError, match="not subscribed"):
        conn.receive_data(message(mid(1), b"a"), 0.0)


def test_truncated_message_frame() -> None:
    conn = subscribed_connection()
    with pytest.raises(RemoteProtocolError, match="shorter"):
        conn.receive_data(encode_frame(2, b"\x00" * 20), 0.0)


def test_rdy_above_max_rdy_count_is_refused_locally() -> None:
    conn = subscribed_connection()
    conn.rdy(2500)
    with pytest.raises(LocalProtocolError, match="max_rdy_count"):
        conn.rdy(2501)


def test_non_fatal_errors_keep_the_connection() -> None:
    conn = subscribed_connection()
    for code in ("E_FIN_FAILED", "E_REQ_FAILED", "E_TOUCH_FAILED"):
        conn.receive_data(
            error(code.encode() + b" FIN 0123456789abcdef failed ID not in flight"), 0.0
        )
        (ev,) = conn.outputs()
        assert isinstance(ev, ErrorReceived) and ev.code == code and not ev.fatal
    assert conn.state is ConnectionState.SUBSCRIBED


def test_fatal_error_fails_pending_publishes_in_order() -> None:
    conn = ready_connection()
    r1 = conn.publish("t", b"a")
    r2 = conn.publish_many("t", [b"b", b"c"])
    r3 = conn.publish_deferred("t", b"d", 1.0)
    assert sent(conn.outputs()).count(b"PUB") == 3
    conn.receive_data(
        response(b"OK") + error(b"E_BAD_MESSAGE PUB message too big 1025 > 1024"), 0.0
    )
    out = conn.outputs()
    assert out[0] == PublishSucceeded(0, r1)
    assert out[1] == ErrorReceived(0, "E_BAD_MESSAGE", "PUB message too big 1025 > 1024", True)
    assert isinstance(out[2], PublishFailed) and out[2].request_id == r2
    assert isinstance(out[2].error, ServerError) and out[2].error.code == "E_BAD_MESSAGE"
    assert isinstance(out[3], PublishFailed) and out[3].request_id == r3
    assert isinstance(out[3].error, ConnectionClosedError)
    assert isinstance(out[4], Close)
    assert isinstance(out[5], ConnectionClosed) and isinstance(out[5].error, ServerError)
    assert conn.state is ConnectionState.CLOSED
    assert conn.next_deadline() is None


def test_unexpected_response_is_a_protocol_error() -> None:
    conn = ready_connection()
    with pytest.raises(RemoteProtocolError, match="unexpected response"):
        conn.receive_data(response(b"OK"), 0.0)


def test_traced_publish_receipt() -> None:
    conn = Connection()
    conn.connection_made(0.0)
    conn.receive_data(identify_response(version="0.3.7-HA.1.13.0"), 0.0)
    conn.outputs()
    rid = conn.publish_traced("orders", b"hi", 12345, partition=2)
    assert sent(conn.outputs()) == cmd.pub_trace("orders", 12345, b"hi", 2)
    receipt = TraceReceipt(1, 12345, 0, 32)
    conn.receive_data(response(encode_trace_receipt(receipt)), 0.0)
    assert conn.outputs() == [PublishSucceeded(0, rid, receipt)]
    with pytest.raises(LocalProtocolError, match="DPUB"):
        conn.publish_deferred("t", b"x", 1.0)


def test_partitioned_ordered_subscription_decodes_positions() -> None:
    conn = Connection()
    conn.connection_made(0.0)
    conn.receive_data(identify_response(version="0.3.7-HA.1.13.0"), 0.0)
    conn.outputs()
    conn.subscribe("orders", "c", 1, ordered=True)
    assert sent(conn.outputs()) == b"SUB_ORDERED orders c 1\n"
    msg_id = (7).to_bytes(8, "big") + (12345).to_bytes(8, "big")
    data = encode_message_data(msg_id, 5, 1, b"hi", queue_position=(4096, 36))
    conn.receive_data(response(b"OK") + encode_frame(2, data), 0.0)
    out = conn.outputs()
    assert isinstance(out[1], MessageReceived)
    m = out[1].message
    assert (m.internal_id, m.trace_id, m.queue_offset, m.raw_size, m.body) == (
        7,
        12345,
        4096,
        36,
        b"hi",
    )


def test_ordered_subscription_needs_partitioned_server() -> None:
    conn = ready_connection()
    with pytest.raises(LocalProtocolError):
        conn.subscribe("t", "c", 0, ordered=True)


def test_cls_close_wait_then_answers_still_allowed() -> None:
    conn = subscribed_connection()
    conn.receive_data(message(mid(1), b"x"), 0.0)
    conn.outputs()
    conn.start_close()
    assert sent(conn.outputs()) == b"CLS\n"
    conn.receive_data(response(b"CLOSE_WAIT"), 0.0)
    assert conn.outputs() == [CloseWaitReceived(0)]
    conn.finish(mid(1))
    assert sent(conn.outputs()) == b"FIN " + mid(1) + b"\n"
    with pytest.raises(LocalProtocolError):
        conn.rdy(1)
    conn.connection_lost(1.0)
    (closed,) = conn.outputs()
    assert isinstance(closed, ConnectionClosed) and closed.error is None


def test_a_close_after_close_wait_says_nsqd_processed_what_was_sent_before_cls() -> None:
    # answered CLS: every FIN before it was processed; closed by us or by nsqd's EOF
    for end in ("close", "eof"):
        conn = subscribed_connection()
        conn.receive_data(message(mid(1), b"x"), 0.0)
        conn.finish(mid(1))
        conn.start_close()
        conn.receive_data(response(b"CLOSE_WAIT"), 0.0)
        conn.outputs()
        if end == "close":
            conn.close("consumer stopped")
        else:
            conn.connection_lost(1.0)
        closed = [e for e in conn.outputs() if isinstance(e, ConnectionClosed)]
        assert [(c.error, c.after_close_wait) for c in closed] == [(None, True)]
    # CLS sent but not answered, no CLS at all, or the connection lost: nothing confirmed
    for how in ("cls unanswered", "no cls", "lost", "lost after cls"):
        conn = subscribed_connection()
        conn.receive_data(message(mid(1), b"x"), 0.0)
        conn.finish(mid(1))
        if "cls" in how and how != "no cls":
            conn.start_close()
        if how.startswith("lost"):
            conn.connection_lost(1.0)
        else:
            conn.close("stop timeout")
        closed = [e for e in conn.outputs() if isinstance(e, ConnectionClosed)]
        assert len(closed) == 1 and closed[0].after_close_wait is False, how


def test_connection_lost_fails_pending() -> None:
    conn = ready_connection()
    rid = conn.publish("t", b"x")
    conn.outputs()
    conn.connection_lost(1.0, OSError("reset"))
    out = conn.outputs()
    assert isinstance(out[0], PublishFailed) and out[0].request_id == rid
    assert isinstance(out[0].error, ConnectionClosedError)
    assert isinstance(out[1], ConnectionClosed) and isinstance(out[1].error, ConnectionClosedError)


def test_a_connection_that_never_opened_is_not_said_to_be_lost() -> None:
    """Connecting failed (refused, timed out): it was never open, so it is not "lost"; the
    event says it never connected, and its error is what the transport said."""
    conn = Connection(address=("127.0.0.1", 4150))
    refused = ConnectionRefusedError("connecting to 127.0.0.1:4150 failed: connection refused")
    conn.connection_lost(1.0, refused)
    (closed,) = conn.outputs()
    assert isinstance(closed, ConnectionClosed) and not closed.connected
    assert isinstance(closed.error, ConnectionClosedError) and closed.error.__cause__ is refused
    assert str(closed.error) == closed.reason == str(refused)
    conn = Connection()
    conn.connection_lost(1.0)
    (closed,) = conn.outputs()
    assert isinstance(closed, ConnectionClosed) and not closed.connected
    assert closed.reason == str(closed.error) == "could not connect"
    # once connected, it was open: lost
    conn = ready_connection()
    conn.connection_lost(1.0, OSError("reset"))
    (closed,) = conn.outputs()
    assert isinstance(closed, ConnectionClosed) and closed.connected
    assert str(closed.error) == "connection lost: reset"


def test_read_timeout_closes_a_silent_connection() -> None:
    conn = subscribed_connection(now=0.0, heartbeat_interval=30.0)
    assert conn.next_deadline() == 60.0
    conn.receive_data(response(b"_heartbeat_"), 30.0)
    assert conn.next_deadline() == 90.0
    conn.outputs()
    conn.handle_timer(89.9)
    assert conn.outputs() == []
    conn.handle_timer(90.0)
    out = conn.outputs()
    # nsqd is judged dead: its transport is closed at once, without waiting on it
    assert out[0] == Close(0, "read timeout", abort=True)
    assert isinstance(out[1], ConnectionClosed) and isinstance(out[1].error, ReadTimeout)


def test_heartbeats_disabled_means_no_deadline() -> None:
    conn = ready_connection(heartbeat_interval=None)
    assert conn.next_deadline() is None
    assert b'"heartbeat_interval":-1' in cmd.identify(conn.config.identify_body())


def test_close_flushes_queued_commands_first() -> None:
    conn = subscribed_connection()
    conn.finish(mid(1))
    conn.close()
    out = conn.outputs()
    assert out[0] == Send(0, b"FIN " + mid(1) + b"\n")
    assert out[1] == Close(0, "closed by the application", abort=False)  # the FIN goes first


COMMANDS = {
    Command.SUB: lambda c: c.subscribe("t", "c"),
    Command.PUB: lambda c: c.publish("t", b"x"),
    Command.RDY: lambda c: c.rdy(1),
    Command.ANSWER: lambda c: c.finish(mid(1)),
    Command.CLS: lambda c: c.start_close(),
    Command.NOP: lambda c: c.nop(),
}


def connection_in(state: ConnectionState) -> Connection:
    conn = Connection(ConnectionConfig(tls_v1=True, auth_secret=b"s"))
    if state is ConnectionState.INIT:
        return conn
    conn.connection_made(0.0)
    if state is ConnectionState.IDENTIFYING:
        return conn
    conn.receive_data(identify_response(tls_v1=True, auth_required=True), 0.0)
    if state is ConnectionState.TLS_HANDSHAKE:
        return conn
    conn.tls_established(0.0)
    if state is ConnectionState.TLS_RESPONSE:
        return conn
    conn.receive_data(response(b"OK"), 0.0)
    if state is ConnectionState.AUTHENTICATING:
        return conn
    conn.receive_data(response(b'{"identity":"u","identity_url":"","permission_count":1}'), 0.0)
    if state is ConnectionState.READY:
        return conn
    conn.subscribe("t", "c")
    if state is ConnectionState.SUBSCRIBING:
        return conn
    conn.receive_data(response(b"OK"), 0.0)
    if state is ConnectionState.SUBSCRIBED:
        return conn
    conn.start_close()
    if state is ConnectionState.CLOSING:
        return conn
    conn.receive_data(response(b"CLOSE_WAIT"), 0.0)
    if state is ConnectionState.CLOSE_WAIT:
        return conn
    conn.close()
    return conn


REACHABLE = [s for s in ConnectionState if s is not ConnectionState.COMPRESSION_RESPONSE]


@settings(max_examples=200)
@given(state=st.sampled_from(REACHABLE), command=st.sampled_from(list(Command)))
def test_every_state_and_command(state: ConnectionState, command: Command) -> None:
    conn = connection_in(state)
    assert conn.state is state
    conn.outputs()
    if state in ALLOWED[command]:
        COMMANDS[command](conn)
        assert sent(conn.outputs())
    else:
        with pytest.raises(LocalProtocolError):
            COMMANDS[command](conn)
        assert conn.state is state
        assert conn.outputs() == []


def test_a_deflate_bomb_is_refused() -> None:
    import zlib

    from nsq_proto._compress import MAX_INFLATE

    conn = Connection(ConnectionConfig(deflate=True))
    conn.connection_made(0.0)
    conn.outputs()
    bomb = zlib.compressobj(9, zlib.DEFLATED, -15)
    payload = bomb.compress(b"\0" * (MAX_INFLATE + 1)) + bomb.flush(zlib.Z_SYNC_FLUSH)
    assert len(payload) < MAX_INFLATE // 500
    with pytest.raises(RemoteProtocolError, match="compression bomb"):
        conn.receive_data(identify_response(deflate=True) + payload, 0.0)
    assert conn.state is ConnectionState.CLOSED


def partitioned_connection() -> Connection:
    conn = Connection()
    conn.connection_made(0.0)
    conn.receive_data(identify_response(version="0.3.7-HA.1.13.0"), 0.0)
    conn.outputs()
    return conn


@pytest.mark.parametrize(
    "code",
    [
        "E_FAILED_ON_NOT_LEADER",
        "E_FAILED_ON_NOT_WRITABLE",
        "E_PUB_FAILED",
        "E_MPUB_FAILED",
        "E_EXT_NOT_SUPPORT",
        "E_INVALID_JSON_HEADER",
        "INVALID_TRACE_ID",
    ],
)
def test_partitioned_publish_errors_fail_only_their_request(code: str) -> None:
    # the partitioned server answers these without closing: the requests pipelined behind
    # the refused one were read and stored, and must not be sent again
    conn = partitioned_connection()
    r1 = conn.publish("t", b"a", 0)
    r2 = conn.publish("t", b"b", 0)
    r3 = conn.publish_traced("t", b"c", 7, partition=0)
    conn.outputs()
    receipt = TraceReceipt(3, 7, 0, 32)
    conn.receive_data(
        error(code.encode() + b" ") + response(b"OK") + response(encode_trace_receipt(receipt)),
        0.0,
    )
    out = conn.outputs()
    assert out[0] == ErrorReceived(0, code, "", False)
    assert isinstance(out[1], PublishFailed) and out[1].request_id == r1
    assert isinstance(out[1].error, ServerError) and out[1].error.code == code
    assert not out[1].error.fatal
    assert out[2:] == [PublishSucceeded(0, r2), PublishSucceeded(0, r3, receipt)]
    assert conn.state is ConnectionState.READY


def test_an_error_to_mpub_ext_fails_it_and_closes_the_desynchronised_connection() -> None:
    # the server stops reading the batch at the refused message: what follows is unread
    conn = partitioned_connection()
    r1 = conn.publish_encoded(cmd.mpub_ext("t", [(b'{"a":"1"}', b"x"), (b"{}", b"y")], 0))
    r2 = conn.publish("t", b"b", 0)
    conn.outputs()
    conn.receive_data(error(b"E_EXT_NOT_SUPPORT ext content not supported in topic t"), 0.0)
    out = conn.outputs()
    failed = {o.request_id: o.error for o in out if isinstance(o, PublishFailed)}
    refused = failed[r1]
    assert isinstance(refused, ServerError) and refused.code == "E_EXT_NOT_SUPPORT"
    assert isinstance(failed[r2], ConnectionClosedError)
    assert conn.state is ConnectionState.CLOSED


def test_on_standard_nsqd_a_publish_error_stays_fatal() -> None:
    conn = ready_connection()
    r1 = conn.publish("t", b"a")
    conn.outputs()
    conn.receive_data(error(b"E_PUB_FAILED PUB failed exiting"), 0.0)
    out = conn.outputs()
    assert isinstance(out[1], PublishFailed) and out[1].request_id == r1
    assert conn.state is ConnectionState.CLOSED


def test_handshake_timeout_closes_a_connection_nsqd_never_answers() -> None:
    conn = Connection(ConnectionConfig(handshake_timeout=2.0), conn_id=5)
    conn.connection_made(10.0)
    assert sent_on(conn.outputs(), 5).startswith(cmd.MAGIC_V2 + b"IDENTIFY\n")
    assert conn.next_deadline() == 12.0  # before the read timeout (60 s)
    conn.handle_timer(11.9)
    assert conn.outputs() == []
    conn.handle_timer(12.0)
    close, closed = conn.outputs()
    assert close == Close(5, "handshake timeout", abort=True)
    assert isinstance(closed, ConnectionClosed) and closed.reason == "handshake timeout"
    assert isinstance(closed.error, HandshakeTimeout)
    assert str(closed.error) == (
        "nsqd did not complete the handshake within 2.0 s (stuck in IDENTIFYING)"
    )
    assert conn.state is ConnectionState.CLOSED and conn.next_deadline() is None


def test_tls_upgrade_hands_over_the_bytes_that_belong_to_tls() -> None:
    conn = Connection(ConnectionConfig(tls_v1=True), conn_id=3)
    conn.connection_made(0.0)
    body = sent_on(conn.outputs(), 3)
    assert b'"tls_v1":true' in body
    record = b"\x16\x03\x03\x00\x05hello"  # the server's first TLS record, read with the answer
    conn.receive_data(identify_response(tls_v1=True) + record, 0.1)
    assert conn.outputs() == [StartTLS(3, record)]
    assert state_of(conn) is ConnectionState.TLS_HANDSHAKE
    with pytest.raises(LocalProtocolError, match="receive_data in state TLS_HANDSHAKE"):
        conn.receive_data(b"more", 0.2)
    conn.tls_established(0.3)
    assert state_of(conn) is ConnectionState.TLS_RESPONSE
    with pytest.raises(LocalProtocolError, match="tls_established in state TLS_RESPONSE"):
        conn.tls_established(0.3)
    conn.receive_data(response(b"OK"), 0.4)
    (ready,) = conn.outputs()
    assert isinstance(ready, Ready) and ready.features.tls_v1
    assert state_of(conn) is ConnectionState.READY


def test_tls_must_be_confirmed_with_ok() -> None:
    conn = Connection(ConnectionConfig(tls_v1=True), conn_id=3)
    conn.connection_made(0.0)
    conn.receive_data(identify_response(tls_v1=True), 0.0)
    conn.outputs()
    conn.tls_established(0.1)
    with pytest.raises(RemoteProtocolError, match="expected OK after the TLS handshake"):
        conn.receive_data(response(b"NOPE"), 0.2)
    outputs = conn.outputs()
    assert of_type(outputs, Close) and of_type(outputs, ConnectionClosed)


@pytest.mark.parametrize(
    ("features", "says"),
    [
        ({"tls_v1": True}, "nsqd enabled TLS, which was not asked for"),
        ({"snappy": True}, "nsqd enabled snappy, which was not asked for"),
        ({"deflate": True}, "nsqd enabled deflate, which was not asked for"),
    ],
)
def test_features_that_were_not_asked_for_fail_the_connection(
    features: dict[str, Any], says: str
) -> None:
    conn = Connection(conn_id=1)
    conn.connection_made(0.0)
    conn.outputs()
    with pytest.raises(RemoteProtocolError, match=says):
        conn.receive_data(identify_response(**features), 0.0)
    close, closed = conn.outputs()
    assert close == Close(1, f"protocol error: {says}")
    assert isinstance(closed, ConnectionClosed) and isinstance(closed.error, RemoteProtocolError)


def test_transport_calls_in_the_wrong_state_are_local_errors() -> None:
    conn = Connection()
    with pytest.raises(LocalProtocolError, match="receive_data in state INIT"):
        conn.receive_data(b"x", 0.0)
    with pytest.raises(LocalProtocolError, match="tls_established in state INIT"):
        conn.tls_established(0.0)
    conn.connection_made(0.0)
    with pytest.raises(LocalProtocolError, match="connection_made in state IDENTIFYING"):
        conn.connection_made(0.0)


@pytest.mark.parametrize(
    ("setup", "answer", "says"),
    [
        (lambda c: None, b"OK", "unexpected response frame b'OK'"),
        (lambda c: c.publish("t", b"x"), b"E?", "expected OK to a publish, got b'E?'"),
        (lambda c: c.subscribe("t", "c"), b"NO", "expected OK to SUB, got b'NO'"),
    ],
)
def test_answers_that_match_no_request_fail_the_connection(
    setup: Any, answer: bytes, says: str
) -> None:
    conn = ready_connection()
    setup(conn)
    conn.outputs()
    with pytest.raises(RemoteProtocolError) as info:
        conn.receive_data(response(answer), 1.0)
    assert str(info.value) == says
    assert conn.state is ConnectionState.CLOSED


def test_cls_must_be_answered_with_close_wait() -> None:
    conn = ready_connection()
    conn.subscribe("t", "c")
    conn.receive_data(response(b"OK"), 0.0)
    conn.start_close()
    assert sent_on(conn.outputs(), 0).endswith(b"CLS\n")
    with pytest.raises(RemoteProtocolError, match="expected CLOSE_WAIT to CLS, got b'OK'"):
        conn.receive_data(response(b"OK"), 0.1)


def test_traced_publish_answers_with_its_receipt_and_requests_are_counted() -> None:
    conn = ready_connection()
    receipt = TraceReceipt(internal_id=7, trace_id=42, queue_offset=1024, raw_size=30)
    rid = conn.publish_encoded(cmd.pub_trace("t", 42, b"body"), traced=True)
    plain = conn.publish_encoded(cmd.pub("t", b"body"))
    assert conn.pending_requests == 2
    assert sent_on(conn.outputs(), 0) == cmd.pub_trace("t", 42, b"body") + cmd.pub("t", b"body")
    conn.receive_data(response(encode_trace_receipt(receipt)) + response(b"OK"), 0.1)
    assert conn.outputs() == [
        PublishSucceeded(0, rid, receipt),
        PublishSucceeded(0, plain, None),
    ]
    assert conn.pending_requests == 0


def test_close_fails_what_is_pending_once() -> None:
    conn = ready_connection()
    rid = conn.publish("t", b"x")
    conn.close("bye")
    send, failed, close, closed = conn.outputs()
    assert send == Send(0, cmd.pub("t", b"x"))  # issued before the close: it still goes out
    assert isinstance(failed, PublishFailed) and failed.request_id == rid
    assert isinstance(failed.error, ConnectionClosedError)
    assert str(failed.error) == "connection closed before the answer: bye"
    assert (close, closed) == (Close(0, "bye"), ConnectionClosed(0, "bye", None))
    conn.close("again")
    conn.connection_lost(1.0)
    assert conn.outputs() == []  # a finished connection says nothing more
    conn.receive_data(b"late bytes", 1.0)
    assert conn.outputs() == []


def batching_connection() -> Connection:
    conn = Connection(ConnectionConfig(), message_batches=True)
    conn.connection_made(0.0)
    conn.receive_data(identify_response(), 0.0)
    conn.subscribe("t", "c")
    conn.receive_data(response(b"OK"), 0.0)
    conn.outputs()
    return conn


def test_with_message_batches_the_messages_between_other_frames_are_one_event() -> None:
    conn = batching_connection()
    frames = [message(mid(i), b"b%d" % i) for i in range(5)]
    heartbeat = response(b"_heartbeat_")
    # a read that completes a frame cut by the one before, a heartbeat among the messages
    stream = frames[0] + frames[1] + frames[2] + heartbeat + frames[3] + frames[4]
    conn.receive_data(stream[:20], 0.0)
    assert conn.outputs() == []
    conn.finish(mid(99))  # an answer given before the read: its bytes come first
    conn.receive_data(stream[20:], 1.0)
    out = conn.outputs()
    assert [type(o) for o in out] == [
        Send,
        MessagesReceived,
        Send,
        HeartbeatReceived,
        MessagesReceived,
    ]
    assert isinstance(out[0], Send) and out[0].data == b"FIN " + mid(99) + b"\n"
    assert isinstance(out[2], Send) and out[2].data == b"NOP\n"  # the heartbeat's answer
    first, second = of_type(out, MessagesReceived)
    assert [m.id for m in first.messages] == [mid(0), mid(1), mid(2)]
    assert [m.body for m in second.messages] == [b"b3", b"b4"]
    # the next read is an event of its own
    conn.receive_data(message(mid(5), b"b5"), 2.0)
    (third,) = of_type(conn.outputs(), MessagesReceived)
    assert [m.id for m in third.messages] == [mid(5)]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(1, 120), max_size=10), st.lists(st.booleans(), min_size=1, max_size=12))
def test_message_batches_hold_the_same_messages_as_one_event_each(
    cuts: list[int], heartbeats: list[bool]
) -> None:
    """However reads cut the stream, the batches are the messages in order, one event each
    unless a heartbeat came between."""
    stream = b"".join(
        response(b"_heartbeat_") if beat else message(mid(i), b"m%d" % i)
        for i, beat in enumerate(heartbeats)
    )
    told = []
    for batches in (False, True):
        conn = batching_connection() if batches else subscribed_connection()
        got: list[object] = []
        pos = 0
        for cut in [*sorted(set(cuts)), len(stream)]:
            if cut <= pos:
                continue
            conn.receive_data(stream[pos:cut], 0.0)
            pos = cut
            for o in conn.outputs():
                if isinstance(o, MessagesReceived):
                    assert batches and o.messages
                    got += [m.id for m in o.messages]
                elif isinstance(o, MessageReceived):
                    got.append(o.message.id)
                elif isinstance(o, HeartbeatReceived):
                    got.append("heartbeat")
        told.append(got)
    assert told[0] == told[1]
    assert told[0] == ["heartbeat" if beat else mid(i) for i, beat in enumerate(heartbeats)]


def delivered(conn: Connection) -> list[Message]:
    """The messages of the connection's outputs, with or without batches."""
    return [
        m
        for o in conn.outputs()
        for m in (
            o.messages
            if isinstance(o, MessagesReceived)
            else [o.message]
            if isinstance(o, MessageReceived)
            else []
        )
    ]


class _AppMessage(Message):
    """A client's message class: the core's fields and one of its own."""

    __slots__ = ("seen",)

    seen: bool


@pytest.mark.parametrize("batches", [False, True])
def test_a_message_class_given_is_what_the_connection_builds(batches: bool) -> None:
    conn = Connection(ConnectionConfig(), message_batches=batches, message_class=_AppMessage)
    conn.connection_made(0.0)
    conn.receive_data(identify_response(), 0.0)
    conn.subscribe("t", "c")
    conn.receive_data(response(b"OK") + message(mid(1), b"a", attempts=3, timestamp=9), 0.0)
    got = delivered(conn)
    assert [type(m) for m in got] == [_AppMessage]
    (m,) = got
    assert isinstance(m, _AppMessage)
    assert (m.id, m.body, m.attempts, m.timestamp, m.trace_id) == (mid(1), b"a", 3, 9, None)
    # built field by field (the subclass keeps the core's constructor): every field is set
    assert (m.internal_id, m.ext_version, m.ext_data, m.queue_offset, m.raw_size) == (None,) * 5
    m.seen = True  # the subclass's own slot
    # without a class, the core's own
    plain = subscribed_connection()
    plain.receive_data(message(mid(2), b"b"), 0.0)
    (event,) = of_type(plain.outputs(), MessageReceived)
    assert type(event.message) is Message


class _InitMessage(Message):
    """A client's message class with a constructor of its own."""

    __slots__ = ("built",)

    built: int

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.built = len(args)


class _NewMessage(Message):
    """A client's message class with a ``__new__`` of its own."""

    __slots__ = ("made",)

    made: bool

    def __new__(cls, *args: Any) -> _NewMessage:
        self = super().__new__(cls)
        self.made = True
        return self


@pytest.mark.parametrize("batches", [False, True])
@pytest.mark.parametrize("cls", [_InitMessage, _NewMessage])
def test_a_message_class_with_its_own_constructor_is_built_by_calling_it(
    batches: bool, cls: type[Message]
) -> None:
    conn = Connection(ConnectionConfig(), message_batches=batches, message_class=cls)
    conn.connection_made(0.0)
    conn.receive_data(identify_response(), 0.0)
    conn.subscribe("t", "c")
    conn.receive_data(response(b"OK"), 0.0)
    # two in one read: with batches, the second joins the first's run (the frame loop's
    # fast path), the first starts it
    conn.receive_data(message(mid(1), b"a", timestamp=5) + message(mid(2), b"b"), 0.0)
    got = delivered(conn)
    assert [(type(m), m.id, m.body) for m in got] == [(cls, mid(1), b"a"), (cls, mid(2), b"b")]
    assert got[0].timestamp == 5
    for m in got:
        if isinstance(m, _InitMessage):
            assert m.built == 4  # its __init__ ran, with the standard fields
        else:
            assert isinstance(m, _NewMessage) and m.made
            assert m.trace_id is None and m.raw_size is None


#: a frame as nsqd writes it, and for a message its (id, timestamp, attempts, body)
_HeaderFrame = tuple[bytes, tuple[bytes, int, int, bytes] | None]

_header_frame_st: st.SearchStrategy[_HeaderFrame] = st.one_of(
    st.builds(
        lambda i, ts, a, b: (message(mid(i), b, attempts=a, timestamp=ts), (mid(i), ts, a, b)),
        st.integers(0, 2**32),
        # the whole signed range: the compiled frame loop reads headers byte by byte and
        # leaves a negative timestamp to the unpack
        st.one_of(st.integers(-(2**63), 2**63 - 1), st.sampled_from([0, 2**56, -1, 2**63 - 1])),
        st.integers(0, 2**16 - 1),
        st.binary(max_size=300),
    ),
    st.just((response(b"_heartbeat_"), None)),
    st.builds(
        lambda i: (error(b"E_FIN_FAILED FIN " + mid(i) + b" failed ID not in flight"), None),
        st.integers(0, 99),
    ),
)


@settings(max_examples=200, deadline=None)
@given(
    frames=st.lists(_header_frame_st, max_size=14),
    cuts=st.lists(st.integers(min_value=0), max_size=8),
    cls=st.sampled_from([Message, _AppMessage, _InitMessage, _NewMessage]),
)
def test_every_header_value_reaches_the_message_whatever_the_reads_and_the_class(
    frames: list[_HeaderFrame], cuts: list[int], cls: type[Message]
) -> None:
    """Each message's id, timestamp, attempts and body are the frame's, in the order sent,
    for any values of the header, any class of message and any cuts of the stream (the
    messages of one read go in runs between heartbeats and errors)."""
    stream = b"".join(frame for frame, _ in frames)
    conn = Connection(ConnectionConfig(), message_batches=True, message_class=cls)
    conn.connection_made(0.0)
    conn.receive_data(identify_response(), 0.0)
    conn.subscribe("t", "c")
    conn.receive_data(response(b"OK"), 0.0)
    conn.outputs()
    got: list[Message] = []
    pos = 0
    for cut in [*sorted({c % (len(stream) + 1) for c in cuts}), len(stream)]:
        if cut > pos:
            conn.receive_data(stream[pos:cut], 1.0)
            pos = cut
            got += delivered(conn)
    want = [fields for _, fields in frames if fields is not None]
    assert [(m.id, m.timestamp, m.attempts, m.body) for m in got] == want
    assert all(type(m) is cls for m in got)
    assert all(
        (m.trace_id, m.internal_id, m.ext_version, m.ext_data, m.queue_offset, m.raw_size)
        == (None,) * 6
        for m in got
    )
    assert conn.state is ConnectionState.SUBSCRIBED


@settings(max_examples=200, deadline=None)
@given(
    frames=st.lists(_header_frame_st, max_size=10),
    cut=st.integers(min_value=0),
    max_size=st.sampled_from([100, 1 << 20]),
    cls=st.sampled_from([Message, _AppMessage, _InitMessage]),
)
def test_the_run_of_standard_messages_ends_at_the_first_frame_it_leaves_to_the_loop(
    frames: list[_HeaderFrame], cut: int, max_size: int, cls: type[Message]
) -> None:
    """The frame loop's common case (called directly): it takes the whole messages at the
    start of the bytes, and stops at an incomplete frame, one of another type, one over
    ``max_size`` or, compiled, a message with a negative timestamp."""
    stream = b"".join(frame for frame, _ in frames)
    buf = stream[: cut % (len(stream) + 1)]
    want, end = [], 0
    for frame, fields in frames:
        if fields is None or (fields[1] < 0 and _BYTEWISE_HEADERS) or len(frame) - 4 > max_size:
            break
        if end + len(frame) > len(buf):
            break
        want.append(fields)
        end += len(frame)
    batch: list[Message] = []
    native, by_fields = cls is Message, builds_by_fields(cls)
    assert _standard_run(buf, 0, batch, max_size, native, by_fields, cls.__new__, cls) == end
    assert [(m.id, m.timestamp, m.attempts, m.body) for m in batch] == want
    assert all(type(m) is cls for m in batch)
    if cls is _InitMessage:
        assert all(m.built == 4 for m in batch if isinstance(m, _InitMessage))


@pytest.mark.parametrize("batches", [False, True])
def test_a_frame_size_limit_beyond_what_a_frame_can_say_still_reads_messages(
    batches: bool,
) -> None:
    """``max_frame_size`` has no upper bound: one beyond a 64-bit int reads messages as any
    other (the compiled frame loop keeps its limit in a machine int)."""
    conn = Connection(ConnectionConfig(max_frame_size=2**70), message_batches=batches)
    conn.connection_made(0.0)
    conn.receive_data(identify_response(), 0.0)
    conn.subscribe("t", "c")
    conn.receive_data(response(b"OK"), 0.0)
    conn.outputs()
    conn.receive_data(message(mid(1), b"a") + message(mid(2), b"b"), 1.0)
    assert [m.body for m in delivered(conn)] == [b"a", b"b"]
    assert conn.state is ConnectionState.SUBSCRIBED


def test_a_message_class_given_is_built_for_the_partitioned_layout_too() -> None:
    conn = Connection(message_class=_AppMessage)
    conn.connection_made(0.0)
    conn.receive_data(identify_response(version="0.3.7-HA.1.13.0"), 0.0)
    conn.subscribe("orders", "c", 1, ordered=True)
    msg_id = (7).to_bytes(8, "big") + (12345).to_bytes(8, "big")
    data = encode_message_data(msg_id, 5, 1, b"hi", queue_position=(4096, 36))
    conn.receive_data(response(b"OK") + encode_frame(2, data), 0.0)
    (event,) = of_type(conn.outputs(), MessageReceived)
    m = event.message
    assert type(m) is _AppMessage
    assert (m.internal_id, m.trace_id, m.queue_offset, m.raw_size, m.body) == (
        7,
        12345,
        4096,
        36,
        b"hi",
    )
