from __future__ import annotations

import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsq_proto import InvalidName, LocalProtocolError
from nsq_proto import commands as cmd

from ..compiled import COMPILED, WRONG_TYPE

name_st = st.from_regex(r"[.a-zA-Z0-9_-]{1,54}(#ephemeral)?", fullmatch=True)
body_st = st.binary(min_size=1, max_size=200)
id_st = st.binary(min_size=16, max_size=16)
partition_st = st.none() | st.integers(min_value=0, max_value=10_000)


def parse(data: bytes) -> tuple[bytes, list[bytes], bytes | None, bytes]:
    """A deliberately naive reader of one command: (name, params, body, rest)."""
    name = data.split(b" ", 1)[0].split(b"\n", 1)[0]
    if name in (b"FIN", b"TOUCH"):
        line_end = len(name) + 1 + 16
        assert data[line_end : line_end + 1] == b"\n"
        return name, [data[len(name) + 1 : line_end]], None, data[line_end + 1 :]
    if name == b"REQ":
        msg_id = data[4:20]
        assert data[20:21] == b" "
        end = data.index(b"\n", 21)
        return name, [msg_id, data[21:end]], None, data[end + 1 :]
    line, _, rest = data.partition(b"\n")
    tokens = line.split(b" ")
    if tokens[0] in (b"IDENTIFY", b"AUTH", b"PUB", b"MPUB", b"DPUB", b"PUB_TRACE", b"MPUB_TRACE"):
        (size,) = struct.unpack(">I", rest[:4])
        return tokens[0], tokens[1:], rest[4 : 4 + size], rest[4 + size :]
    return tokens[0], tokens[1:], None, rest


def unpack_mpub(body: bytes) -> list[bytes]:
    (count,) = struct.unpack(">I", body[:4])
    pos, out = 4, []
    for _ in range(count):
        (n,) = struct.unpack(">I", body[pos : pos + 4])
        out.append(body[pos + 4 : pos + 4 + n])
        pos += 4 + n
    assert pos == len(body)
    return out


def test_spec_examples() -> None:
    assert cmd.MAGIC_V2 == b"  V2"
    assert cmd.sub("t", "c") == b"SUB t c\n"
    assert cmd.rdy(1) == b"RDY 1\n"
    assert cmd.nop() == b"NOP\n"
    assert cmd.cls() == b"CLS\n"
    assert cmd.pub("t", b"hello") == b"PUB t\n\x00\x00\x00\x05hello"
    assert cmd.mpub("t", [b"m1", b"m2", b"m3"]) == (
        b"MPUB t\n\x00\x00\x00\x16\x00\x00\x00\x03\x00\x00\x00\x02m1\x00\x00\x00\x02m2\x00\x00\x00\x02m3"
    )
    assert cmd.dpub("t", 1000, b"deferred") == b"DPUB t 1000\n\x00\x00\x00\x08deferred"
    assert cmd.fin(b"18a3a3bb6c669000") == b"FIN 18a3a3bb6c669000\n"
    ids = [b"18a3a3bb6c669000", b"18a3a3bb6c669001"]
    assert cmd.fin_many(ids) == b"".join(cmd.fin(i) for i in ids)
    assert cmd.fin_many([]) == b""
    assert cmd.touch_many(ids) == b"".join(cmd.touch(i) for i in ids)
    assert cmd.touch_many([]) == b""
    assert cmd.auth(b"good-secret") == b"AUTH\n\x00\x00\x00\x0bgood-secret"


def test_partitioned_examples() -> None:
    # partitioned-nsq.md 3.6 and 3.7
    pid = bytes.fromhex("0000000000000a200000000000000000")
    assert cmd.fin(pid).hex() == "46494e200000000000000a2000000000000000000a"
    assert cmd.req(pid, 0).hex() == "524551200000000000000a20000000000000000020300a"
    assert cmd.touch(pid).hex() == "544f554348200000000000000a2000000000000000000a"
    assert cmd.pub_trace("orders", 12345, b"hi", partition=2) == bytes.fromhex(
        "5055425f5452414345206f726465727320320a0000000a00000000000030396869"
    )
    assert cmd.mpub_trace("orders", [(1, b"a"), (2, b"bc")], partition=1) == bytes.fromhex(
        "4d5055425f5452414345206f72646572732031"
        "0a"
        "0000001f"
        "00000002"
        "00000009"
        "0000000000000001"
        "61"
        "0000000a"
        "0000000000000002"
        "6263"
    )
    assert cmd.sub_ordered("t", "c", 3) == b"SUB_ORDERED t c 3\n"
    assert cmd.sub("t", "c", 0) == b"SUB t c 0\n"


@pytest.mark.parametrize(
    "name", ["", "a" * 65, "bad!topic", "bad/topic", "t#eph", "#ephemeral", "a b", "é"]
)
def test_invalid_names(name: str) -> None:
    with pytest.raises(InvalidName):
        cmd.sub(name, "c")
    with pytest.raises(InvalidName):
        cmd.sub("t", name)
    with pytest.raises(InvalidName):
        cmd.pub(name, b"x")


def test_valid_edge_names() -> None:
    assert cmd.sub("a" * 64, "c" * 54 + "#ephemeral") == (
        b"SUB " + b"a" * 64 + b" " + b"c" * 54 + b"#ephemeral\n"
    )


@pytest.mark.parametrize(
    "call",
    [
        lambda: cmd.pub("t", b""),
        lambda: cmd.mpub("t", []),
        lambda: cmd.mpub("t", [b"a", b""]),
        lambda: cmd.dpub("t", -1, b"x"),
        lambda: cmd.rdy(-1),
        pytest.param(lambda: cmd.rdy(True), marks=pytest.mark.skipif(COMPILED, reason=WRONG_TYPE)),
        lambda: cmd.fin(b"short"),
        lambda: cmd.fin_many([b"0" * 16, b"short"]),
        lambda: cmd.req(b"0" * 16, -5),
        lambda: cmd.touch(b"0" * 17),
        lambda: cmd.touch_many([b"0" * 16, b"0" * 15]),
        lambda: cmd.sub("t", "c", -1),
        lambda: cmd.pub_trace("t", -1, b"x"),
        lambda: cmd.pub_trace("t", 2**64, b"x"),
        lambda: cmd.auth(b""),
        pytest.param(
            lambda: cmd.pub("t", "text"),  # type: ignore[arg-type]
            marks=pytest.mark.skipif(COMPILED, reason=WRONG_TYPE),
        ),
    ],
)
def test_bad_arguments_are_local_errors(call: object) -> None:
    assert callable(call)
    with pytest.raises(LocalProtocolError):
        call()


@settings(max_examples=300)
@given(topic=name_st, channel=name_st, partition=partition_st)
def test_sub_round_trip(topic: str, channel: str, partition: int | None) -> None:
    for encoder, name in ((cmd.sub, b"SUB"), (cmd.sub_ordered, b"SUB_ORDERED")):
        got, params, body, rest = parse(encoder(topic, channel, partition))
        assert (got, rest, body) == (name, b"", None)
        want = [topic.encode(), channel.encode()]
        if partition is not None:
            want.append(str(partition).encode())
        assert params == want


@settings(max_examples=300)
@given(topic=name_st, bodies=st.lists(body_st, min_size=1, max_size=10), partition=partition_st)
def test_publish_round_trips(topic: str, bodies: list[bytes], partition: int | None) -> None:
    suffix = [] if partition is None else [str(partition).encode()]
    name, params, body, rest = parse(cmd.pub(topic, bodies[0], partition))
    assert (name, params, body, rest) == (b"PUB", [topic.encode(), *suffix], bodies[0], b"")
    name, params, body, rest = parse(cmd.mpub(topic, bodies, partition))
    assert (name, params, rest) == (b"MPUB", [topic.encode(), *suffix], b"")
    assert body is not None and unpack_mpub(body) == bodies
    name, params, body, rest = parse(cmd.dpub(topic, 1500, bodies[0]))
    assert (name, params, body, rest) == (b"DPUB", [topic.encode(), b"1500"], bodies[0], b"")
    traces = [(i * 7919, b) for i, b in enumerate(bodies)]
    name, params, body, rest = parse(cmd.mpub_trace(topic, traces, partition))
    assert body is not None
    assert [(struct.unpack(">Q", m[:8])[0], m[8:]) for m in unpack_mpub(body)] == traces
    name, params, body, rest = parse(cmd.pub_trace(topic, 42, bodies[0], partition))
    assert body == struct.pack(">Q", 42) + bodies[0]


@settings(max_examples=300)
@given(msg_id=id_st, delay=st.integers(min_value=0, max_value=10**9), count=st.integers(0, 10**6))
def test_answer_round_trips(msg_id: bytes, delay: int, count: int) -> None:
    # binary ids may hold "\n" and " ": the commands are read by position
    assert parse(cmd.fin(msg_id)) == (b"FIN", [msg_id], None, b"")
    assert parse(cmd.touch(msg_id)) == (b"TOUCH", [msg_id], None, b"")
    assert parse(cmd.req(msg_id, delay)) == (b"REQ", [msg_id, str(delay).encode()], None, b"")
    assert parse(cmd.rdy(count)) == (b"RDY", [str(count).encode()], None, b"")


@settings(max_examples=100)
@given(
    body=st.dictionaries(st.text(max_size=10), st.integers() | st.text(max_size=10) | st.booleans())
)
def test_identify_round_trip(body: dict[str, object]) -> None:
    name, params, payload, rest = parse(cmd.identify(body))
    assert (name, params, rest) == (b"IDENTIFY", [], b"")
    assert payload is not None and json.loads(payload) == body


@settings(max_examples=100)
@given(secret=st.binary(min_size=1, max_size=100))
def test_auth_nop_cls_round_trip(secret: bytes) -> None:
    assert parse(cmd.auth(secret)) == (b"AUTH", [], secret, b"")
    assert parse(cmd.nop()) == (b"NOP", [], None, b"")
    assert parse(cmd.cls()) == (b"CLS", [], None, b"")


def test_pub_ext_matches_the_spec_example_and_round_trips() -> None:
    # partitioned-nsq.md 3.7
    header = b'{"##trace_id":"12345","k":"v"}'
    assert cmd.pub_ext("orders", b"hi", header, 0) == bytes.fromhex(
        "5055425f455854206f726465727320300a00000022001e" + header.hex() + "6869"
    )
    assert cmd.pub_ext("t", b"x", {"a": "b"}) == cmd.pub_ext("t", b"x", b'{"a":"b"}')
    data = cmd.mpub_ext("t", [({"k": "1"}, b"a"), (b'{"k":"2"}', b"bc")], 3)
    _name, params, body, rest = parse(data.replace(b"MPUB_EXT", b"MPUB", 1))
    assert (params, rest) == ([b"t", b"3"], b"")
    assert body is not None
    messages = unpack_mpub(body)
    decoded = []
    for m in messages:
        (n,) = struct.unpack(">H", m[:2])
        decoded.append((json.loads(m[2 : 2 + n]), m[2 + n :]))
    assert decoded == [({"k": "1"}, b"a"), ({"k": "2"}, b"bc")]
    for bad in (b"", b"x" * 70000):
        with pytest.raises(LocalProtocolError):
            cmd.pub_ext("t", b"x", bad)
