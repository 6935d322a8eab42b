"""Paths of the core that the scenario tests do not take: configuration errors, the TLS and
handshake corners of a connection, TOUCH, stopping with unanswered messages, closing one
connection or the producer, lookupd requests that fail, and the small value types."""

from __future__ import annotations

import pickle
import random
import zlib
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from nsq_emulator.frames import encode_trace_receipt
from nsq_proto import (
    Close,
    CloseWaitReceived,
    ConfigError,
    Connect,
    Connection,
    ConnectionClosed,
    ConnectionClosedError,
    ConnectionConfig,
    ConnectionState,
    Consumer,
    ConsumerConfig,
    ExtFilter,
    HandshakeTimeout,
    HttpRequest,
    LocalProtocolError,
    LookupdError,
    LookupFailed,
    MessageReceived,
    Output,
    Producer,
    ProducerConfig,
    ProtocolError,
    PublishFailed,
    PublishSucceeded,
    Ready,
    RemoteProtocolError,
    Send,
    ServerError,
    StartFrom,
    StartFromApplied,
    StartFromFailed,
    StartTLS,
    Stopped,
    Subscribed,
    TraceReceipt,
)
from nsq_proto import commands as cmd
from nsq_proto._consumer import REQUEUE_GRACE
from nsq_proto.wire import DeflateCodec, MessageLayout, SnappyCodec, decode_message

from ..compiled import COMPILED, WRONG_TYPE
from .helpers import (
    error,
    identify_response,
    message,
    mid,
    ready_connection,
    response,
    state_of,
)


def sent_on(outputs: list[Output], conn_id: int) -> bytes:
    return b"".join(o.data for o in outputs if isinstance(o, Send) and o.conn_id == conn_id)


def of_type(outputs: list[Output], kind: type[Any]) -> list[Any]:
    return [o for o in outputs if isinstance(o, kind)]


def consumer(n: int = 1, **config: Any) -> tuple[Consumer, list[int]]:
    """A consumer subscribed on ``n`` nsqd (RDY sent), its outputs drained."""
    core = Consumer(
        "t",
        "c",
        ConsumerConfig(**config),
        nsqd_tcp_addresses=[f"10.0.0.{i}:4150" for i in range(n)],
        rng=random.Random(7),
    )
    core.start(0.0)
    conns = [o.conn_id for o in core.outputs() if isinstance(o, Connect)]
    for c in conns:
        core.connection_made(c, 0.0)
        core.receive_data(c, identify_response(), 0.0)
        core.receive_data(c, response(b"OK"), 0.0)
    core.outputs()
    return core, conns


def producer(**config: Any) -> tuple[Producer, int]:
    """A producer with one ready connection to one nsqd, its outputs drained."""
    core = Producer(ProducerConfig(**config), nsqd_tcp_addresses=["n1:4150"], rng=random.Random(0))
    core.start(0.0)
    (connect,) = of_type(core.outputs(), Connect)
    core.connection_made(connect.conn_id, 0.0)
    core.receive_data(connect.conn_id, identify_response(), 0.0)
    core.outputs()
    return core, connect.conn_id


# --------------------------------------------------------------------------- configuration


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"read_timeout": 0}, "read_timeout must be a positive number of seconds, not 0"),
        ({"read_timeout": float("inf")}, "read_timeout must be a positive number"),
        ({"handshake_timeout": True}, "handshake_timeout must be a positive number"),
        ({"handshake_timeout": 0}, "handshake_timeout must be a positive number"),
        ({"handshake_timeout": float("inf")}, "handshake_timeout must be a positive number"),
        (
            {"heartbeat_interval": 30.0, "read_timeout": 30.0},
            "read_timeout must be longer than heartbeat_interval",
        ),
        ({"snappy": True, "deflate": True}, "snappy and deflate are mutually exclusive"),
        ({"deflate_level": 0}, "deflate_level must be 1..9, not 0"),
        ({"sample_rate": 100}, "sample_rate must be 0..99, not 100"),
        ({"msg_timeout": 0.5}, "msg_timeout must be at least 1 s, not 0.5"),
        ({"output_buffer_size": 63}, "output_buffer_size must be -1 or >= 64, not 63"),
        ({"output_buffer_timeout": 0.01}, "output_buffer_timeout must be 0 or 0.025..30 s"),
        ({"max_frame_size": 1023}, "max_frame_size must be at least 1024"),
        ({"desired_tag": "x" * 101}, "desired_tag is at most 100 characters"),
        ({"ext_filter": {"type": 1}}, "ext_filter must be an ExtFilter"),
    ],
)
def test_connection_config_refuses_what_nsqd_would(changes: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError) as info:
        ConnectionConfig(**changes)
    assert says in str(info.value)
    # a ConfigError is both a local protocol error and a ValueError
    assert isinstance(info.value, LocalProtocolError)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"max_in_flight": True}, "max_in_flight must be an int"),
        ({"max_in_flight": 2.0}, "max_in_flight must be an int"),
        ({"max_attempts": 65536}, "max_attempts must be 0..65535, not 65536"),
        ({"reconnect_jitter": 1.5}, "reconnect_jitter must be 0..1, not 1.5"),
        ({"stop_timeout": -1}, "stop_timeout must be a non-negative number of seconds, not -1"),
        ({"dial_timeout": 0}, "dial_timeout must be a positive number of seconds, not 0"),
        ({"partitions": (0, -1)}, "partitions must be non-negative"),
        ({"start_from": "end"}, "start_from must be a StartFrom or a mapping"),
        ({"start_from": {-1: StartFrom.end()}}, "start_from must be a StartFrom or a mapping"),
        ({"start_from": {0: "end"}}, "start_from must be a StartFrom or a mapping"),
    ],
)
def test_consumer_config_errors(changes: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError, match="^" + says.replace(".", r"\.")):
        ConsumerConfig(**changes)


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"pool_size": 0}, "pool_size must be an int >= 1, not 0"),
        ({"max_outstanding": True}, "max_outstanding must be an int >= 1, not True"),
        ({"max_publish_attempts": 1.0}, "max_publish_attempts must be an int >= 1, not 1.0"),
        ({"publish_timeout": 0}, "publish_timeout must be a positive number of seconds"),
        ({"reconnect_jitter": -0.1}, "reconnect_jitter must be 0..1"),
        ({"hasher": 5}, "hasher must be a function of the key bytes, not 5"),
    ],
)
def test_producer_config_errors(changes: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError) as info:
        ProducerConfig(**changes)
    assert str(info.value).startswith(says)


def test_cores_need_an_address_and_start_once() -> None:
    for make in (lambda: Consumer("t", "c"), lambda: Producer()):
        with pytest.raises(ConfigError, match="give nsqd_tcp_addresses or lookupd_http_addresses"):
            make()
    with pytest.raises(ConfigError, match="start_from needs lookupd_http_addresses"):
        Consumer("t", "c", ConsumerConfig(start_from=StartFrom.end()), nsqd_tcp_addresses=["h:1"])
    core = Consumer("t", "c", nsqd_tcp_addresses=["h:4150"])
    core.start(0.0)
    with pytest.raises(LocalProtocolError, match="the consumer is already started"):
        core.start(1.0)
    prod = Producer(nsqd_tcp_addresses=["h:4150"])
    prod.start(0.0)
    with pytest.raises(LocalProtocolError, match="the producer is already started"):
        prod.start(1.0)


def test_set_max_in_flight_refuses_what_is_not_a_count() -> None:
    core, _ = consumer(max_in_flight=4)
    # the compiled core's signature takes True as 1 and refuses 2.5 itself (WRONG_TYPE)
    for bad in (-1,) if COMPILED else (-1, True, 2.5):
        with pytest.raises(ConfigError, match="max_in_flight must be an int >= 0"):
            core.set_max_in_flight(bad, 1.0)  # type: ignore[arg-type]
    assert core.max_in_flight == 4


def test_identify_carries_the_partitioned_options_in_a_stable_order() -> None:
    config = ConnectionConfig(
        client_id="me",
        hostname="box",
        heartbeat_interval=None,
        user_agent=None,
        deflate=True,
        deflate_level=3,
        msg_timeout=2.5,
        sample_rate=10,
        output_buffer_size=-1,
        output_buffer_timeout=0,
        extend_support=True,
        desired_tag="blue",
        ext_filter=ExtFilter.exact("k", "v"),
        identify_extra={"extra": 1},
    )
    assert config.identify_body() == {
        "client_id": "me",
        "hostname": "box",
        "heartbeat_interval": -1,
        "feature_negotiation": True,
        "deflate": True,
        "deflate_level": 3,
        "msg_timeout": 2500,
        "sample_rate": 10,
        "output_buffer_size": -1,
        "output_buffer_timeout": -1,
        "extend_support": True,
        "desired_tag": "blue",
        "ext_filter": {"type": 1, "filter_ext_key": "k", "filter_data": "v"},
        "extra": 1,
    }
    assert list(config.identify_body())[-1] == "extra"  # extras come after the known keys
    # no heartbeats and no read timeout: nothing ever times a quiet connection out
    assert config.effective_read_timeout is None
    assert ConnectionConfig(read_timeout=90.0).effective_read_timeout == 90.0


# --------------------------------------------------------------------------- one connection


def test_handshake_timeout_closes_a_connection_nsqd_never_answers() -> None:
    conn = Connection(ConnectionConfig(handshake_timeout=2.0), conn_id=5)
    conn.connection_made(10.0)
    assert sent_on(conn.outputs(), 5).startswith(cmd.MAGIC_V2 + b"IDENTIFY\n")
    assert conn.next_deadline() == 12.0  # before the read timeout (60 s)
    conn.handle_timer(11.9)
    assert conn.outputs() == []
    conn.handle_timer(12.0)
    close, closed = conn.outputs()
    assert close == Close(5, "handshake timeout")
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


def test_corrupt_compressed_streams_are_remote_errors() -> None:
    with pytest.raises(RemoteProtocolError, match="corrupt deflate stream"):
        DeflateCodec().decompress(b"\xff\xff\xff\xff")
    with pytest.raises(LocalProtocolError, match=r"deflate level must be 1\.\.9, not 0"):
        DeflateCodec(0)
    final = zlib.compressobj(6, zlib.DEFLATED, -15)  # a sender that ends its stream
    stream = final.compress(b"hello") + final.flush(zlib.Z_FINISH)
    with pytest.raises(RemoteProtocolError, match="deflate stream ended"):
        DeflateCodec().decompress(stream)
    framed = SnappyCodec().compress(b"hello, " * 20)  # stream identifier, then a chunk
    assert SnappyCodec().decompress(framed) == b"hello, " * 20
    corrupt = framed[:-4] + bytes(b ^ 0xFF for b in framed[-4:])  # the chunk's data flipped
    with pytest.raises(RemoteProtocolError, match="corrupt snappy stream"):
        SnappyCodec().decompress(corrupt)


# --------------------------------------------------------------------------- the consumer


def test_touch_resets_the_timeout_of_the_newest_delivery_only() -> None:
    core, (c,) = consumer(max_in_flight=4)
    core.receive_data(c, message(mid(1), b"x", attempts=1), 0.0)
    core.outputs()
    assert core.touch(c, mid(1), 1.0) is True
    assert sent_on(core.outputs(), c) == b"TOUCH " + mid(1) + b"\n"
    core.receive_data(c, message(mid(1), b"x", attempts=2), 2.0)  # delivered again
    core.outputs()
    assert core.touch(c, mid(1), 3.0, attempts=1) is True  # the older copy: nothing sent
    assert sent_on(core.outputs(), c) == b""
    assert core.touch(c, mid(1), 3.0, attempts=2) is True
    assert sent_on(core.outputs(), c) == b"TOUCH " + mid(1) + b"\n"
    with pytest.raises(LocalProtocolError, match=r"message b'0+9' is not in flight on connection"):
        core.touch(c, mid(9), 3.0)
    assert core.touch(99, mid(1), 3.0) is False  # a connection that is gone


def test_touch_many_writes_once_per_connection_and_skips_older_copies() -> None:
    core, (c1, c2) = consumer(2, max_in_flight=8)
    core.receive_data(c1, message(mid(1), b"a") + message(mid(2), b"b", attempts=3), 0.0)
    core.receive_data(c2, message(mid(3), b"c"), 0.0)
    core.outputs()
    sent = core.touch_many(
        [(c1, mid(1), None), (c2, mid(3), 1), (c1, mid(2), 2), (77, mid(4), None)], 1.0
    )
    assert sent == 2  # mid(2)'s attempts name an older copy; connection 77 is gone
    writes = of_type(core.outputs(), Send)
    assert [(w.conn_id, w.data) for w in writes] == [
        (c1, b"TOUCH " + mid(1) + b"\n"),
        (c2, b"TOUCH " + mid(3) + b"\n"),
    ]
    with pytest.raises(LocalProtocolError, match="is not in flight"):
        core.touch_many([(c1, mid(9), None), (c1, mid(1), None)], 2.0)
    # the messages that were in flight were still touched, in one write
    assert sent_on(core.outputs(), c1) == b"TOUCH " + mid(1) + b"\n"


def test_stop_requeue_unanswered_gives_everything_back_and_closes_on_close_wait() -> None:
    core, (c1, c2) = consumer(2, max_in_flight=8, stop_timeout=30.0)
    core.receive_data(c1, message(mid(1), b"a") + message(mid(2), b"b"), 0.0)
    core.receive_data(c2, message(mid(3), b"c"), 0.0)
    assert len(of_type(core.outputs(), MessageReceived)) == 3
    core.stop(1.0, requeue_unanswered=True)
    out = core.outputs()
    assert sent_on(out, c1) == b"CLS\nREQ " + mid(1) + b" 0\nREQ " + mid(2) + b" 0\n"
    assert sent_on(out, c2) == b"CLS\nREQ " + mid(3) + b" 0\n"
    assert of_type(out, Close) == []  # nsqd may have sent more before it read the CLS
    assert core.messages_requeued == 3 and not core.stopped
    # what nsqd sent before it read the CLS goes back at once, never to the application,
    # even a message it wrote right after its CLOSE_WAIT (taken before it read the CLS)
    core.receive_data(
        c1, message(mid(4), b"d") + response(b"CLOSE_WAIT") + message(mid(5), b"e"), 1.1
    )
    out = core.outputs()
    assert of_type(out, MessageReceived) == []
    assert sent_on(out, c1) == b"REQ " + mid(4) + b" 0\nREQ " + mid(5) + b" 0\n"
    assert [(o.conn_id, o.reason) for o in of_type(out, Close)] == [(c1, "consumer stopped")]
    assert core.messages_received == 5 and core.messages_requeued == 5
    # c2's nsqd never confirms: closed after the grace, not after stop_timeout
    assert core.next_deadline() == pytest.approx(1.0 + REQUEUE_GRACE)
    core.handle_timer(1.0 + REQUEUE_GRACE)
    out = core.outputs()
    assert [o.conn_id for o in of_type(out, Close)] == [c2]
    assert of_type(out, Stopped) == [Stopped()]
    assert core.stopped and core.connections() == [] and core.next_deadline() is None
    # the application's late answer finds the connection gone: nsqd redelivers anyway
    assert core.finish(c1, mid(1), 2.0) is False


def test_a_second_stop_can_requeue_what_the_first_left_waiting() -> None:
    core, (c,) = consumer(max_in_flight=2)
    core.receive_data(c, message(mid(1), b"a"), 0.0)
    core.outputs()
    core.stop(1.0)
    assert sent_on(core.outputs(), c) == b"CLS\n"
    core.receive_data(c, response(b"CLOSE_WAIT"), 1.1)
    assert of_type(core.outputs(), CloseWaitReceived) == [CloseWaitReceived(c)]
    assert core.stopping and not core.stopped  # waiting for the application's answer
    core.stop(2.0)  # again: nothing changes
    assert core.outputs() == []
    core.stop(3.0, requeue_unanswered=True)
    out = core.outputs()
    assert sent_on(out, c) == b"REQ " + mid(1) + b" 0\n"
    assert of_type(out, Close) == [Close(c, "consumer stopped")]  # CLOSE_WAIT came before
    assert of_type(out, Stopped) == [Stopped()]


def test_stop_closes_connections_still_in_their_handshake() -> None:
    core = Consumer("t", "c", nsqd_tcp_addresses=["h1:4150", "h2:4150"])
    core.start(0.0)
    c1, c2 = (o.conn_id for o in of_type(core.outputs(), Connect))
    core.connection_made(c1, 0.0)  # IDENTIFY sent, no answer yet; c2 is not even connected
    core.outputs()
    core.stop(1.0)
    out = core.outputs()
    assert [(o.conn_id, o.reason) for o in of_type(out, Close)] == [
        (c1, "consumer stopping"),
        (c2, "consumer stopping"),
    ]
    assert of_type(out, Stopped) == [Stopped()]
    assert not of_type(out, Send)  # no CLS: neither was subscribed


def test_stop_fails_lookupd_requests_in_flight() -> None:
    core = Consumer("t", "c", lookupd_http_addresses=["l1:4161"])
    core.start(0.0)
    (request,) = of_type(core.outputs(), HttpRequest)
    core.stop(1.0)
    out = core.outputs()
    (failed,) = of_type(out, LookupFailed)
    assert failed.address == ("l1", 4161)
    assert isinstance(failed.error, LookupdError) and str(failed.error) == "consumer stopping"
    assert of_type(out, Stopped) == [Stopped()]
    core.http_data(request.request_id, b"HTTP/1.1 200 OK\r\n", 2.0)  # too late: ignored
    assert core.outputs() == []


def test_close_connection_closes_that_one_and_reconnects_later() -> None:
    core, (c1, c2) = consumer(2, max_in_flight=2, reconnect_delay=8.0, reconnect_jitter=0.0)
    core.receive_data(c1, message(mid(1), b"a"), 0.0)
    core.outputs()
    assert [m.id for m in core.in_flight(c1)] == [mid(1)]
    assert (core.in_flight_count(c1), core.in_flight_count(c2)) == (1, 0)
    core.finish(c1, mid(1), 0.5)
    assert core.in_flight_count(c1) == 0
    core.close_connection(c1, 0.5, "rotating")
    out = core.outputs()
    assert sent_on(out, c1).startswith(b"FIN " + mid(1) + b"\n")  # answered before the close
    assert of_type(out, Close) == [Close(c1, "rotating")]
    assert of_type(out, ConnectionClosed) == [ConnectionClosed(c1, "rotating", None)]
    assert core.connection_stats(c1) is None and core.connection(c1) is None
    assert core.in_flight(c1) == () and core.in_flight_count(c1) == 0
    stats = core.connection_stats(c2)
    assert stats is not None and stats.state == "SUBSCRIBED" and stats.address == ("10.0.0.1", 4150)
    assert core.connection(c2) is not None
    core.close_connection(12345, 0.6)  # unknown: nothing happens
    assert core.outputs() == []
    core.handle_timer(8.4)  # reconnect_delay after the close
    assert not of_type(core.outputs(), Connect)
    core.handle_timer(8.5)
    (again,) = of_type(core.outputs(), Connect)
    assert (again.host, again.port) == ("10.0.0.0", 4150) and again.conn_id not in (c1, c2)


def test_a_consumer_upgrades_to_tls_when_asked() -> None:
    core = Consumer("t", "c", ConsumerConfig(tls_v1=True), nsqd_tcp_addresses=["h:4150"])
    core.start(0.0)
    (connect,) = of_type(core.outputs(), Connect)
    c = connect.conn_id
    core.connection_made(c, 0.0)
    core.receive_data(c, identify_response(tls_v1=True), 0.1)
    assert of_type(core.outputs(), StartTLS) == [StartTLS(c, b"")]
    core.tls_established(c, 0.2)
    core.receive_data(c, response(b"OK"), 0.3)  # nsqd's OK, inside TLS
    out = core.outputs()
    assert of_type(out, Ready) and sent_on(out, c) == cmd.sub("t", "c") + cmd.rdy(1)
    core.receive_data(c, response(b"OK"), 0.4)
    assert of_type(core.outputs(), Subscribed) == [Subscribed(c)]


def test_transport_events_for_unknown_connections_are_ignored() -> None:
    core, (c,) = consumer()
    calls: list[Callable[[], object]] = [
        lambda: core.connection_made(99, 1.0),
        lambda: core.tls_established(99, 1.0),
        lambda: core.receive_data(99, response(b"OK"), 1.0),
        lambda: core.connection_lost(99, 1.0, OSError("gone")),
        lambda: core.http_data(99, b"", 1.0),
        lambda: core.http_failed(99, OSError("gone"), 1.0),
    ]
    for call in calls:
        call()
        assert core.outputs() == []
    assert [s.conn_id for s in core.connections()] == [c]


def test_http_failed_is_a_failed_lookup_and_the_poll_goes_on() -> None:
    core = Consumer(
        "t",
        "c",
        ConsumerConfig(lookupd_poll_interval=10.0, lookupd_poll_jitter=0.0),
        lookupd_http_addresses=["l1:4161"],
    )
    core.start(0.0)
    (request,) = of_type(core.outputs(), HttpRequest)
    refused = ConnectionRefusedError(111, "refused")
    core.http_failed(request.request_id, refused, 0.5)
    (failed,) = of_type(core.outputs(), LookupFailed)
    assert failed.address == ("l1", 4161)
    assert isinstance(failed.error, LookupdError)
    assert str(failed.error) == "lookupd request failed: [Errno 111] refused"
    assert failed.error.__cause__ is refused
    core.http_failed(request.request_id, refused, 0.6)  # already failed: nothing more
    assert core.outputs() == []
    core.handle_timer(10.0)
    (again,) = of_type(core.outputs(), HttpRequest)
    assert again.request_id != request.request_id and again.host == "l1"


# --------------------------------------------------------------------------- the producer


def test_producer_close_fails_queued_publishes_and_refuses_new_ones() -> None:
    core = Producer(nsqd_tcp_addresses=["n1:4150"])
    core.start(0.0)
    (connect,) = of_type(core.outputs(), Connect)  # never connected: the publish waits
    rid = core.publish("t", b"x", 0.0)
    assert core.pending == 1
    assert core.connections() == [(connect.conn_id, ("n1", 4150), "INIT", 0)]
    core.close(1.0)
    out = core.outputs()
    (failed,) = of_type(out, PublishFailed)
    assert failed.request_id == rid and isinstance(failed.error, ConnectionClosedError)
    assert str(failed.error) == "producer closed"
    assert of_type(out, Close) == [Close(connect.conn_id, "producer closed")]
    assert core.pending == 0 and core.connections() == []
    with pytest.raises(LocalProtocolError, match="the producer is closing"):
        core.publish("t", b"y", 2.0)
    core.handle_timer(100.0)  # no reconnect, nothing left to time out
    assert core.outputs() == []


def test_producer_close_fails_publishes_already_sent() -> None:
    core, c = producer(publish_timeout=30.0)
    rid = core.publish("t", b"x", 0.0)
    assert sent_on(core.outputs(), c) == cmd.pub("t", b"x")
    core.close(1.0)
    out = core.outputs()
    assert of_type(out, Close) == [Close(c, "producer closed")]
    assert [f.request_id for f in of_type(out, PublishFailed)] == [rid]


def test_producer_lookupd_failure_is_named_when_the_publish_times_out() -> None:
    core = Producer(ProducerConfig(publish_timeout=5.0), lookupd_http_addresses=["l1:4161"])
    core.start(0.0)
    assert core.outputs() == []  # nothing to connect to before a lookup
    rid = core.publish("t", b"x", 0.0)
    (request,) = of_type(core.outputs(), HttpRequest)
    assert request.data.startswith(b"GET /lookup?topic=t&access=w&metainfo=true HTTP/1.1\r\n")
    core.http_failed(request.request_id, OSError("no route to host"), 0.1)
    (failed_lookup,) = of_type(core.outputs(), LookupFailed)
    assert str(failed_lookup.error) == "lookupd request failed: no route to host"
    core.handle_timer(1.1)  # looked up again a second later
    (retry,) = of_type(core.outputs(), HttpRequest)
    core.http_failed(retry.request_id, OSError("no route to host"), 1.2)
    core.outputs()
    core.handle_timer(5.0)
    (failed,) = of_type(core.outputs(), PublishFailed)
    assert failed.request_id == rid and failed.conn_id == 0  # it was never sent
    assert str(failed.error) == (
        "publish 1 not acknowledged in time (no route: lookupd request failed: no route to host)"
    )


def test_producer_fails_a_publish_nsqd_refuses_without_retrying() -> None:
    core, c = producer(max_publish_attempts=3)
    rid = core.publish("t", b"x", 0.0)
    core.outputs()
    core.receive_data(c, error(b"E_BAD_MESSAGE PUB bad message"), 0.1)
    out = core.outputs()
    (failed,) = of_type(out, PublishFailed)
    assert failed.request_id == rid and failed.conn_id == c
    assert str(failed.error) == "E_BAD_MESSAGE PUB bad message"
    assert not of_type(out, Send)  # not sent again
    assert core.pending == 0


# --------------------------------------------------------------------------- value types


def test_start_from_positions_and_their_wire_form() -> None:
    assert StartFrom.end().token() == b"special:-1"
    assert StartFrom.timestamp(1700000000.9).token() == b"timestamp:1700000000"
    when = datetime(2024, 1, 2, 3, 4, 5, tzinfo=timezone(timedelta(hours=1)))
    assert StartFrom.timestamp(when) == StartFrom("timestamp", 1704161045)
    assert StartFrom.queue_offset(4096).token() == b"virtual_queue:4096"
    assert StartFrom.message_count(1).token() == b"msgcount:1"
    assert StartFrom.parse(" end ") == StartFrom.end()
    assert StartFrom.parse("msgcount:12") == StartFrom.message_count(12)
    assert StartFrom.parse("timestamp:5") == StartFrom.timestamp(5)
    assert StartFrom.timestamp(datetime(2024, 1, 1, tzinfo=UTC)).value == 1704067200


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda: StartFrom("offset", 1), "unknown start position kind 'offset'"),  # type: ignore[arg-type]
        (lambda: StartFrom("msgcount", True), "a start position is an int, not True"),
        (lambda: StartFrom("special", 0), "the only special start position is -1 (the end)"),
        (lambda: StartFrom.queue_offset(-1), "a virtual_queue start position must be 0..2^63-1"),
        (lambda: StartFrom.message_count(1 << 63), "a msgcount start position must be 0..2^63-1"),
        (lambda: StartFrom.timestamp(True), "a start time is Unix seconds or a datetime"),
        (lambda: StartFrom.timestamp("today"), "a start time is Unix seconds or a datetime"),  # type: ignore[arg-type]
        (lambda: StartFrom.timestamp(datetime(2024, 1, 1)), "give an aware datetime"),
        (lambda: StartFrom.timestamp(float("nan")), "a start time must be finite, not nan"),
        (lambda: StartFrom.parse("12"), "a start position reads 'end' or 'kind:value'"),
        (lambda: StartFrom.parse("msgcount:x"), "start position 'msgcount:x': 'x' is not an int"),
    ],
)
def test_start_from_refuses_what_the_server_would(make: Any, says: str) -> None:
    with pytest.raises(ConfigError) as info:
        make()
    assert str(info.value).startswith(says)


def test_ext_filters_as_identify_sends_them() -> None:
    assert ExtFilter.regexp("a.b", "^x+$", inverse=True).to_json() == {
        "type": 2,
        "inverse": True,
        "filter_ext_key": "a.b",
        "filter_data": "^x+$",
    }
    assert ExtFilter.glob("k", "v*").to_json() == {
        "type": 3,
        "filter_ext_key": "k",
        "filter_data": "v*",
    }
    assert ExtFilter.any_of({"k1": "v1", "k2": "v2"}).to_json() == {
        "type": 4,
        "filter_ext_key": "any",
        "filter_data_list": [
            {"filter_ext_key": "k1", "filter_data": "v1"},
            {"filter_ext_key": "k2", "filter_data": "v2"},
        ],
    }
    assert ExtFilter.all_of({"k": "v"}, inverse=True).to_json() == {
        "type": 4,
        "inverse": True,
        "filter_ext_key": "all",
        "filter_data_list": [{"filter_ext_key": "k", "filter_data": "v"}],
    }


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda: ExtFilter("like", "k", "v"), "ext_filter kind must be one of"),  # type: ignore[arg-type]
        (lambda: ExtFilter.exact("k", "v", inverse=1), "ext_filter inverse must be a bool"),  # type: ignore[arg-type]
        (lambda: ExtFilter.any_of({}), "an ext_filter of kind 'any' needs at least one match"),
        (lambda: ExtFilter.all_of({"k": ""}), "an ext_filter value must be a non-empty string"),
        (lambda: ExtFilter.exact("", "v"), "an ext_filter key must be a non-empty string"),
        (lambda: ExtFilter.regexp("k", "(unclosed"), "ext_filter regexp '(unclosed' does not"),
    ],
)
def test_ext_filter_refuses_what_the_server_would_ignore(make: Any, says: str) -> None:
    with pytest.raises(ConfigError) as info:
        make()
    assert str(info.value).startswith(says)


# --------------------------------------------------------------------------- lookupd and nsqd HTTP


def http_response(body: bytes, status: bytes = b"200 OK") -> bytes:
    head = f"HTTP/1.1 {status.decode()}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    return head.encode() + body


def peer(host: str) -> str:
    return (
        f'{{"id":"{host}","remote_address":"{host}","hostname":"{host}",'
        f'"broadcast_address":"{host}","tcp_port":4150,"http_port":4151,'
        f'"version":"0.3.7-HA.1.13.0","distributed_id":""}}'
    )


PARTITIONED_LOOKUP = (
    '{"status_code":200,"status_txt":"OK","data":{"channels":[],"meta":{"partition_num":2,'
    '"replica":1,"extend_support":false,"ordered":false,"multi_part":false,'
    '"disable_channel_auto_create":false},"producers":[],"partitions":{'
    f'"0":{peer("n1")},"1":{peer("n2")}}}}}}}'
).encode()


def standard_lookup(*hosts: str) -> bytes:
    producers = ",".join(
        f'{{"remote_address":"{h}:1","hostname":"{h}","broadcast_address":"{h}",'
        f'"tcp_port":4150,"http_port":4151,"version":"1.3.0"}}'
        for h in hosts
    )
    return f'{{"channels":["c"],"producers":[{producers}]}}'.encode()


def requests_by_target(outputs: list[Output]) -> dict[tuple[str, str], HttpRequest]:
    """HttpRequest outputs by (host, the request line's path without the query)."""
    found = {}
    for o in of_type(outputs, HttpRequest):
        path = o.data.split(b" ", 2)[1].split(b"?")[0].decode()
        found[(o.host, path)] = o
    return found


def test_start_from_sets_each_partitions_position_before_subscribing() -> None:
    core = Consumer(
        "t",
        "c",
        ConsumerConfig(start_from=StartFrom.message_count(5)),
        lookupd_http_addresses=["l:4161"],
    )
    core.start(0.0)
    (lookup,) = of_type(core.outputs(), HttpRequest)
    core.http_data(lookup.request_id, http_response(PARTITIONED_LOOKUP), 0.1)
    out = core.outputs()
    assert not of_type(out, Connect)  # no subscription before the position is set
    calls = requests_by_target(out)
    assert set(calls) == {
        ("l", "/listlookup"),  # a partitioned answer: learn the cluster's other lookupd
        ("n1", "/channel/setoffset"),
        ("n2", "/channel/setoffset"),
    }
    first, second = calls[("n1", "/channel/setoffset")], calls[("n2", "/channel/setoffset")]
    assert first.port == 4151 and first.data.endswith(b"\r\n\r\nmsgcount:5")
    assert b"?topic=t&partition=0&channel=c " in first.data
    # partition 0: set; its connection opens
    core.http_data(first.request_id, http_response(b"OK"), 0.2)
    out = core.outputs()
    assert out[0] == StartFromApplied(("n1", 4150), 0)
    assert [(o.host, o.port) for o in of_type(out, Connect)] == [("n1", 4150)]
    # partition 1: the channel does not exist yet: created, then its position set
    core.http_data(second.request_id, http_response(b"CHANNEL_NOT_FOUND", b"404 Not Found"), 0.3)
    create = requests_by_target(core.outputs())[("n2", "/channel/create")]
    core.http_data(create.request_id, http_response(b""), 0.4)
    again = requests_by_target(core.outputs())[("n2", "/channel/setoffset")]
    core.http_data(again.request_id, http_response(b"boom", b"500 Internal Server Error"), 0.5)
    out = core.outputs()
    (failed,) = of_type(out, StartFromFailed)
    assert (failed.address, failed.partition) == (("n2", 4150), 1)
    assert str(failed.error) == (
        "start_from for partition 1: /channel/setoffset answered HTTP 500: boom"
    )
    assert not of_type(out, Connect)  # not consumed from until a later lookup sets it


def test_an_nsqd_call_cut_short_is_a_failed_start_from() -> None:
    core = Consumer(
        "t", "c", ConsumerConfig(start_from=StartFrom.end()), lookupd_http_addresses=["l:4161"]
    )
    core.start(0.0)
    (lookup,) = of_type(core.outputs(), HttpRequest)
    core.http_data(lookup.request_id, http_response(PARTITIONED_LOOKUP), 0.1)
    calls = requests_by_target(core.outputs())
    setoffset = calls[("n1", "/channel/setoffset")]
    assert setoffset.data.endswith(b"special:-1")
    core.http_data(setoffset.request_id, b"", 0.2)  # EOF before a byte of the answer
    (failed,) = of_type(core.outputs(), StartFromFailed)
    assert (failed.address, failed.partition) == (("n1", 4150), 0)
    assert str(failed.error) == "the connection closed before an HTTP response arrived"
    setoffset = calls[("n2", "/channel/setoffset")]
    core.http_data(setoffset.request_id, b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nOK", 0.3)
    assert core.outputs() == []  # half a response: waiting for the rest
    core.http_failed(setoffset.request_id, OSError("connection reset"), 0.4)
    (failed,) = of_type(core.outputs(), StartFromFailed)
    assert failed.partition == 1 and str(failed.error).endswith(": connection reset")
    assert not of_type(core.outputs(), Connect)


def test_listlookup_adds_the_clusters_other_lookupd_to_the_polls() -> None:
    core = Consumer("t", "c", lookupd_http_addresses=["l1:4161"])
    core.start(0.0)
    (lookup,) = of_type(core.outputs(), HttpRequest)
    core.http_data(lookup.request_id, http_response(PARTITIONED_LOOKUP), 0.1)
    listlookup = requests_by_target(core.outputs())[("l1", "/listlookup")]
    nodes = (
        b'{"status_code":200,"status_txt":"OK","data":{"lookupdnodes":['
        b'{"ID":"1","NodeIP":"l1","TcpPort":"4160","HttpPort":"4161","RpcPort":"4162"},'
        b'{"ID":"2","NodeIP":"l2","TcpPort":"4160","HttpPort":"4161","RpcPort":"4162"}]}}'
    )
    core.http_data(listlookup.request_id, http_response(nodes), 0.2)
    assert core.outputs() == []
    core.handle_timer(0.2)  # a new lookupd: the topic is looked up everywhere at once
    assert {(h, p) for h, p in requests_by_target(core.outputs())} == {
        ("l1", "/lookup"),
        ("l2", "/lookup"),
        ("l1", "/listlookup"),
    }


def test_a_lost_nsqd_is_looked_up_again_soon_until_it_is_back() -> None:
    core = Consumer(
        "t",
        "c",
        ConsumerConfig(lookupd_recheck_delay=1.0, lookupd_poll_jitter=0.0),
        lookupd_http_addresses=["l:4161"],
    )
    core.start(0.0)
    (lookup,) = of_type(core.outputs(), HttpRequest)
    core.http_data(lookup.request_id, http_response(standard_lookup("n1")), 0.1)
    (connect,) = of_type(core.outputs(), Connect)
    core.connection_lost(connect.conn_id, 0.5, OSError("reset"))
    assert of_type(core.outputs(), ConnectionClosed)
    core.handle_timer(1.4)
    assert core.outputs() == []
    core.handle_timer(1.5)  # lookupd_recheck_delay after the loss
    (recheck,) = of_type(core.outputs(), HttpRequest)
    core.http_data(recheck.request_id, http_response(standard_lookup()), 1.6)  # not listed
    assert not of_type(core.outputs(), Connect)
    core.handle_timer(3.4)
    assert core.outputs() == []
    core.handle_timer(3.5)  # twice the delay: it stays away, lookupd is asked less often
    (recheck,) = of_type(core.outputs(), HttpRequest)
    core.http_data(recheck.request_id, http_response(standard_lookup("n1")), 3.6)
    (back,) = of_type(core.outputs(), Connect)
    assert (back.host, back.port) == ("n1", 4150)
    core.handle_timer(59.9)  # back: no more rechecks before the regular poll
    assert not of_type(core.outputs(), HttpRequest)
    core.handle_timer(60.0)
    assert of_type(core.outputs(), HttpRequest)


def test_a_permanent_failure_fails_every_publish_at_once() -> None:
    core = Producer(ProducerConfig(auth_secret=b"secret"), nsqd_tcp_addresses=["n1:4150"])
    core.start(0.0)
    (connect,) = of_type(core.outputs(), Connect)
    c = connect.conn_id
    waiting = core.publish("t", b"a", 0.0)
    core.connection_made(c, 0.0)
    core.receive_data(c, identify_response(auth_required=True), 0.0)
    assert sent_on(core.outputs(), c).endswith(cmd.auth(b"secret"))
    core.receive_data(c, error(b"E_AUTH_FAILED AUTH failed"), 0.1)
    out = core.outputs()
    (closed,) = of_type(out, ConnectionClosed)
    (failed,) = of_type(out, PublishFailed)
    assert failed.request_id == waiting
    assert isinstance(failed.error, ServerError) and failed.error.code == "E_AUTH_FAILED"
    assert failed.error.permanent and failed.error is not closed.error  # a copy of its own
    later = core.publish("t", b"b", 0.2)  # the next one is not kept waiting either
    (failed,) = of_type(core.outputs(), PublishFailed)
    assert failed.request_id == later and str(failed.error) == "E_AUTH_FAILED AUTH failed"


def test_a_topic_lookupd_refuses_twice_fails_its_publishes_with_the_answer() -> None:
    core = Producer(lookupd_http_addresses=["l:4161"])
    core.start(0.0)
    rid = core.publish("t", b"x", 0.0)
    refusal = http_response(
        b'{"status_code":500,"status_txt":"TOPIC_NOT_READY","data":null}',
        b"500 Internal Server Error",
    )
    (lookup,) = of_type(core.outputs(), HttpRequest)
    core.http_data(lookup.request_id, refusal, 0.1)
    assert of_type(core.outputs(), LookupFailed) and core.pending == 1
    core.handle_timer(1.1)  # asked again a second later
    (lookup,) = of_type(core.outputs(), HttpRequest)
    core.http_data(lookup.request_id, refusal, 1.2)
    out = core.outputs()
    (failed,) = of_type(out, PublishFailed)
    assert failed.request_id == rid and isinstance(failed.error, LookupdError)
    assert str(failed.error).startswith("no route to topic 't': ")
    assert isinstance(failed.error.__cause__, LookupdError)
    assert core.pending == 0


@pytest.mark.parametrize(
    ("publish", "says"),
    [
        (lambda p: p.publish("t", b"x", 0.0, partition=1, sharding_key=b"k"), "not both"),
        (lambda p: p.publish("t", b"x", 0.0, partition=-1), "partition must be a non-negative"),
        (lambda p: p.publish("t", b"x", 0.0, sharding_key="k"), "a sharding key needs lookupd"),
        (lambda p: p.publish("t", b"x", 0.0, delay=1.0, trace_id=1), "DPUB takes no partition"),
        (lambda p: p.publish("t", b"x", 0.0, delay=-1.0), "delay cannot be negative"),
        (lambda p: p.publish("t", b"", 0.0), "message bodies must be non-empty bytes"),
        pytest.param(
            lambda p: p.publish("t", "text", 0.0),
            "message bodies must be non-empty bytes",
            marks=pytest.mark.skipif(COMPILED, reason=WRONG_TYPE),
        ),
        (lambda p: p.publish_many("t", [], 0.0), "nothing to publish"),
        (lambda p: p.publish_many("t", [b"a"], 0.0, trace_ids=[1, 2]), "one trace id per body"),
        (
            lambda p: p.publish_many("t", [b"a"], 0.0, trace_ids=[1], ext={"k": "v"}),
            "MPUB_EXT takes no trace ids",
        ),
    ],
)
def test_publish_refuses_misuse_at_the_call(publish: Any, says: str) -> None:
    core, _ = producer()
    with pytest.raises(LocalProtocolError) as info:
        publish(core)
    assert says in str(info.value)
    assert core.pending == 0 and core.outputs() == []


def test_publish_takes_any_bytes_like_body() -> None:
    core, c = producer()
    # taken at run time, though publish_many's bodies are annotated Iterable[bytes] (bytearray
    # and memoryview are not bytes to mypy)
    rid = core.publish_many("t", [bytearray(b"ab"), memoryview(b"cd")], 0.0)  # type: ignore[list-item]
    assert sent_on(core.outputs(), c) == cmd.mpub("t", [b"ab", b"cd"])
    core.receive_data(c, response(b"OK"), 0.1)
    assert of_type(core.outputs(), PublishSucceeded) == [PublishSucceeded(c, rid, None)]


# --------------------------------------------------------------------------- errors and frames


def test_protocol_error_is_abstract_and_server_errors_survive_pickling() -> None:
    with pytest.raises(TypeError, match="ProtocolError is abstract"):
        ProtocolError("x")
    refused = ServerError("E_AUTH_FAILED", "AUTH failed", True)
    copy = pickle.loads(pickle.dumps(refused))
    assert (copy.code, copy.text, copy.fatal, copy.permanent) == (
        "E_AUTH_FAILED",
        "AUTH failed",
        True,
        True,
    )
    assert str(copy) == "E_AUTH_FAILED AUTH failed"
    assert ServerError("E_INVALID", "TLS required", True).permanent
    assert not ServerError("E_INVALID", "bad", True).permanent
    assert str(ServerError("E_TIMEOUT", "", False)) == "E_TIMEOUT"


@pytest.mark.parametrize(
    ("layout", "tail", "says"),
    [
        (MessageLayout(ext_header=True), b"", "ends inside its extension header"),
        (MessageLayout(ext_header=True), b"\x01\x00", "ends inside its extension length"),
        (MessageLayout(ext_header=True), b"\x01\x00\x05ab", "ends inside its extension data"),
        (MessageLayout(queue_position=True), b"\x00" * 11, "ends inside its queue position"),
    ],
)
def test_truncated_partitioned_message_frames_are_remote_errors(
    layout: MessageLayout, tail: bytes, says: str
) -> None:
    header = b"\x00" * 8 + b"\x00\x01" + mid(1)  # timestamp, attempts, id
    with pytest.raises(RemoteProtocolError, match=f"message frame {says}"):
        decode_message(header + tail, layout)
    full = decode_message(header + b"\x01\x00\x02{}" + b"body", MessageLayout(ext_header=True))
    assert (full.ext_version, full.ext_data, full.body) == (1, b"{}", b"body")
