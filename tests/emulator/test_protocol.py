"""Protocol details of the emulated nsqd beyond what the captures show."""

from __future__ import annotations

import json
import struct

import pytest
import snappy

from nsq_emulator import Authorization, AuthState, Nsqd, NsqdOptions, static_authorizer
from nsq_emulator._protocol import decode_identify
from nsq_proto._compress import SnappyCodec
from tests.support.emulator_client import Client, body, identify_cmd, pub_cmd


@pytest.mark.parametrize(
    ("raw", "ok"),
    [
        (b'{"Heartbeat_Interval":1000}', True),  # Go matches keys case-insensitively
        (b'{"heartbeat_interval":null}', True),
        (b"null", True),
        (b'{"heartbeat_interval":1000.0}', False),
        (b'{"heartbeat_interval":"1000"}', False),
        (b'{"sample_rate":2147483648}', False),  # int32 overflow
        (b'{"tls_v1":1}', False),
        (b'{"client_id":5}', False),
        (b"[]", False),
        (b'{"x":NaN}', False),
        (b'{"unknown":{"nested":[1,2]}}', True),
    ],
)
def test_identify_body_decoding_follows_go(raw: bytes, ok: bool) -> None:
    assert (decode_identify(raw) is not None) is ok


def test_identify_values_in_the_response() -> None:
    c = Client(Nsqd(), 0.0)
    c.send(
        identify_cmd(feature_negotiation=True, output_buffer_size=-1, output_buffer_timeout=-1), 0.0
    )
    ((_, data),) = c.read()
    obj = json.loads(data)
    assert (obj["output_buffer_size"], obj["output_buffer_timeout"]) == (1, 0)


def test_second_identify_changes_the_connection_but_not_the_pump() -> None:
    nsqd = Nsqd()
    c = Client(nsqd, 0.0, identify={"feature_negotiation": True, "heartbeat_interval": 1000})
    c.send(identify_cmd(feature_negotiation=True, heartbeat_interval=5000), 0.5)
    assert json.loads(c.read()[0][1])["msg_timeout"] == 60000
    assert c.conn.heartbeat_interval == 5.0
    nsqd.handle_timer(1.0)  # the ticker still runs every second
    assert c.read() == [(0, b"_heartbeat_")]
    nsqd.handle_timer(10.4)  # but the read deadline uses the new interval (2 x 5 s)
    assert not c.conn.closed
    nsqd.handle_timer(10.5)
    assert c.conn.closed


def test_overlong_command_line_closes_silently() -> None:
    c = Client(Nsqd(), 0.0)
    c.send(b"X" * 16384, 0.0)
    assert c.conn.closed and c.read() == []
    ok = Client(Nsqd(), 0.0)
    ok.send(b"PUB " + b"t" * 16379 + b"\n", 0.0)  # 16384 bytes with the newline: read
    assert ok.read() == [(1, b'E_BAD_TOPIC PUB topic name "' + b"t" * 16379 + b'" is not valid')]


def test_eof_inside_a_body_sends_the_read_error() -> None:
    c = Client(Nsqd(), 0.0)
    c.send(b"PUB t\n\x00\x00\x00\x05he", 0.0)
    assert c.read() == []
    c.send(b"", 0.1)
    assert c.read() == [(1, b"E_BAD_MESSAGE PUB failed to read message body")]
    assert c.conn.closed


def test_read_timeout_inside_a_body_sends_the_read_error() -> None:
    nsqd = Nsqd()
    c = Client(nsqd, 0.0, identify={"feature_negotiation": True, "heartbeat_interval": 1000})
    c.send(b"IDENTIFY\n\x00\x00", 0.5)
    nsqd.handle_timer(2.5)  # the deadline runs from the end of the previous command (0.0)
    assert c.read() == [(0, b"_heartbeat_"), (1, b"E_BAD_BODY IDENTIFY failed to read body size")]
    assert c.conn.closed


def test_before_magic_nothing_times_out() -> None:
    nsqd = Nsqd()
    conn = nsqd.accept(0.0)
    assert nsqd.next_deadline() is None
    conn.receive_data(b"  V", 1000.0)
    assert not conn.closed


def test_auth_ttl_expiry_queries_the_auth_server_again() -> None:
    calls: list[str] = []
    state = AuthState("me", "", (Authorization("^t$"),), ttl=10.0)

    def authorize(request: object) -> AuthState | None:
        calls.append("q")
        return state if len(calls) < 2 else None

    nsqd = Nsqd(NsqdOptions(auth=authorize))
    c = Client(nsqd, 0.0)
    c.send(b"AUTH\n" + body(b"secret"), 0.0)
    assert json.loads(c.read()[0][1]) == {
        "identity": "me",
        "identity_url": "",
        "permission_count": 1,
    }
    c.send(pub_cmd("t", b"x"), 5.0)
    assert c.read() == [(0, b"OK")]
    c.send(pub_cmd("t", b"y"), 10.0)
    assert c.read() == [(1, b"E_AUTH_FAILED AUTH failed")]
    assert calls == ["q", "q"]


def test_auth_after_sub_is_refused_and_unauthorized_channel() -> None:
    auth = static_authorizer(
        {"s": AuthState("me", "", (Authorization("^t$", ("^c$",), ("subscribe",)),))}
    )
    nsqd = Nsqd(NsqdOptions(auth=auth))
    c = Client(nsqd, 0.0, identify={"feature_negotiation": True})
    c.send(b"AUTH\n" + body(b"s"), 0.0)
    c.read()
    c.send(b"SUB t d\n", 0.1)
    assert c.read() == [(1, b'E_UNAUTHORIZED AUTH failed for SUB on "t" "d"')]
    c2 = Client(nsqd, 0.0)
    c2.send(b"AUTH\n" + body(b"s") + b"SUB t c\nAUTH\n", 0.0)
    assert [f[1] for f in c2.read()][1:] == [b"OK", b"E_INVALID cannot AUTH in current state"]


def test_snappy_chunks_follow_the_output_buffer() -> None:
    nsqd = Nsqd()
    c = Client(nsqd, 0.0)
    c.send(identify_cmd(feature_negotiation=True, snappy=True), 0.0)
    out = c.conn.data_to_send()
    json_end = 8 + struct.unpack(">i", out[:4])[0] - 4
    compressed = out[json_end:]
    assert compressed.startswith(b"\xff\x06\x00\x00sNaPpY")
    codec = SnappyCodec()
    client_stream = snappy.StreamCompressor()
    big = bytes(range(256)) * 100  # 25600 bytes: more than the 16 KiB buffer
    c.send(client_stream.add_chunk(b"SUB t c\nRDY 1\n" + pub_cmd("t", big)), 0.1)
    wire = c.conn.data_to_send()
    plain = codec.decompress(compressed + wire)
    assert plain.startswith(b"\x00\x00\x00\x06\x00\x00\x00\x00OK" * 3)
    assert plain.endswith(big)
    # the 8-byte header sits in the buffer, 16376 bytes of the message fill it, the rest
    # (larger than the buffer) goes out directly: chunk boundaries as Go's bufio makes them
    chunk_sizes = []
    pos = 0
    while pos < len(wire):
        length = int.from_bytes(wire[pos + 1 : pos + 4], "little")
        chunk_sizes.append(length)
        pos += 4 + length
    assert len(chunk_sizes) == 4  # OK, OK, then the message in two writes


def test_corrupt_compressed_input_closes() -> None:
    c = Client(Nsqd(), 0.0)
    c.send(identify_cmd(feature_negotiation=True, deflate=True), 0.0)
    c.conn.data_to_send()
    c.send(b"\xff\xff\xff garbage", 0.1)
    assert c.conn.closed


def test_tls_then_snappy_and_trailing_bytes() -> None:
    nsqd = Nsqd(NsqdOptions(tls=True))
    conn = nsqd.accept(0.0)
    conn.receive_data(
        b"  V2" + identify_cmd(feature_negotiation=True, tls_v1=True) + b"\x16\x03\x01", 0.0
    )
    assert conn.tls_requested
    assert conn.take_trailing_data() == b"\x16\x03\x01"
    conn.receive_data(b"more handshake", 0.1)
    assert conn.take_trailing_data() == b"more handshake"
    first = conn.data_to_send()
    assert json.loads(first[8:])["tls_v1"] is True
    conn.tls_established(0.2)
    assert conn.data_to_send() == b"\x00\x00\x00\x06\x00\x00\x00\x00OK"
    assert conn.tls and not conn.tls_requested
    with pytest.raises(RuntimeError):
        conn.tls_established(0.3)


def test_max_channel_consumers() -> None:
    nsqd = Nsqd(NsqdOptions(max_channel_consumers=1))
    a = Client(nsqd, 0.0, identify={"feature_negotiation": True})
    a.subscribe("t", "c", 0.0)
    b = Client(nsqd, 0.0, identify={"feature_negotiation": True})
    b.send(b"SUB t c\n", 0.0)
    assert b.read() == [(1, b"E_SUB_FAILED SUB failed consumers for t:c exceeds limit of 1")]


def test_rdy_parsing_wraps_like_uint64() -> None:
    nsqd = Nsqd()
    c = Client(nsqd, 0.0, identify={"feature_negotiation": True})
    c.subscribe("t", "c", 0.0)
    c.send(b"RDY \n", 0.0)  # an empty count parses as 0
    assert c.read() == [] and c.conn.ready_count == 0
    c.send(b"RDY 18446744073709551615\n", 0.0)
    assert c.read() == [(1, b"E_INVALID RDY count -1 out of range 0-2500")]
