"""Hostile servers at every stage of the handshake: whatever bytes answer IDENTIFY, the TLS
switch, the compression switch or AUTH, the connection raises RemoteProtocolError (and
nothing else), closes itself and reports why; a well-formed handshake still reaches READY.

``NSQ_FUZZ_EXAMPLES`` raises the number of examples for a long local run."""

from __future__ import annotations

import json
import os
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nsq_proto import Connection, ConnectionClosed, ConnectionConfig, RemoteProtocolError
from nsq_proto._connection import UNREADABLE
from nsq_proto._state import ConnectionState
from nsq_proto.wire import DeflateCodec, SnappyCodec, encode_frame

from .helpers import IDENTIFY_JSON

EXAMPLES = int(os.environ.get("NSQ_FUZZ_EXAMPLES", "1500"))

json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=False),
    st.text(max_size=20),
)
json_value = st.recursive(
    json_leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
KEYS = [*IDENTIFY_JSON, "auth_required", "identity", "identity_url", "permission_count"]


@st.composite
def hostile_json(draw: st.DrawFn, base: dict[str, Any]) -> bytes:
    kind = draw(st.sampled_from(["mutated", "typed", "nested", "raw", "flipped"]))
    if kind == "nested":
        depth = draw(st.integers(1, 200_000))
        opener = draw(st.sampled_from(["[", '{"a":']))
        return (opener * depth).encode()
    if kind == "raw":
        return draw(st.binary(max_size=200))
    doc = dict(base)
    for key in draw(st.lists(st.sampled_from(KEYS), max_size=4)):
        if draw(st.booleans()):
            doc.pop(key, None)
        else:
            doc[key] = draw(json_value)
    text = json.dumps(doc).encode()
    if kind == "flipped" and text:
        at = draw(st.integers(0, len(text) - 1))
        text = text[:at] + bytes([draw(st.integers(0, 255))]) + text[at + 1 :]
    return text


def frame(draw: st.DrawFn, payload: bytes) -> bytes:
    frame_type = draw(st.sampled_from([0, 0, 0, 1, 2, 7]))
    data = encode_frame(frame_type, payload)
    if draw(st.integers(0, 9)) == 0:
        # a lying size field
        data = draw(st.binary(min_size=4, max_size=4)) + data[4:]
    return data


@st.composite
def session(draw: st.DrawFn) -> tuple[ConnectionConfig, list[tuple[str, bytes]]]:
    tls = draw(st.booleans())
    compression = draw(st.sampled_from([None, "snappy", "deflate"]))
    secret = draw(st.sampled_from([None, b"s3cret"]))
    config = ConnectionConfig(
        tls_v1=tls,
        snappy=compression == "snappy",
        deflate=compression == "deflate",
        auth_secret=secret,
    )
    base = dict(IDENTIFY_JSON)
    base.update(
        tls_v1=draw(st.booleans()) if draw(st.booleans()) else tls,
        snappy=compression == "snappy",
        deflate=compression == "deflate",
        auth_required=draw(st.booleans()),
    )
    codec: Any = {None: None, "snappy": SnappyCodec(), "deflate": DeflateCodec(6)}[compression]
    steps: list[tuple[str, bytes]] = []
    identify = hostile_json(base) if draw(st.booleans()) else st.just(json.dumps(base).encode())
    steps.append(("plain", frame(draw, draw(identify))))
    if base["tls_v1"]:
        steps.append(("tls", frame(draw, draw(st.sampled_from([b"OK", b"NO", b""])))))
    after: bytes = frame(draw, draw(st.sampled_from([b"OK", b"OK", b"E_BAD", b"\x00"])))
    auth = {"identity": "me", "identity_url": "", "permission_count": 1}
    after += frame(draw, draw(hostile_json(auth)))
    if codec is not None and draw(st.booleans()):
        after = codec.compress(after)
    steps.append(("after", after + draw(st.binary(max_size=30))))
    return config, steps


def run_session(config: ConnectionConfig, steps: list[tuple[str, bytes]], cut: int) -> None:
    conn = Connection(config, conn_id=7)
    conn.connection_made(0.0)
    conn.outputs()
    try:
        for stage, data in steps:
            if conn.state is ConnectionState.CLOSED:
                break
            if stage == "tls":
                if conn.state is not ConnectionState.TLS_HANDSHAKE:
                    continue
                conn.tls_established(1.0)
            elif conn.state is ConnectionState.TLS_HANDSHAKE:
                break  # the server went on without the TLS switch: the adapter waits
            at = cut % (len(data) + 1)
            for chunk in (data[:at], data[at:]):
                if chunk and conn.state not in (
                    ConnectionState.CLOSED,
                    ConnectionState.TLS_HANDSHAKE,
                ):
                    conn.receive_data(chunk, 1.0)
    except RemoteProtocolError as exc:
        assert UNREADABLE not in str(exc), f"a check is missing: {exc!r} from {exc.__cause__!r}"
        assert conn.state is ConnectionState.CLOSED
        closed = [o for o in conn.outputs() if isinstance(o, ConnectionClosed)]
        assert len(closed) == 1 and closed[0].error is exc
        return
    if conn.state is ConnectionState.CLOSED:
        closed = [o for o in conn.outputs() if isinstance(o, ConnectionClosed)]
        assert len(closed) == 1 and closed[0].error is not None


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(session(), st.integers(min_value=0))
def test_hostile_handshakes_raise_only_remote_protocol_errors(
    case: tuple[ConnectionConfig, list[tuple[str, bytes]]], cut: int
) -> None:
    run_session(*case, cut)


def test_the_cases_the_issue_names() -> None:
    for body in (
        b"[" * 100_000,
        b'{"max_rdy_count": ' + b"[" * 50_000,
        json.dumps({**IDENTIFY_JSON, "max_rdy_count": None}).encode(),
        json.dumps({**IDENTIFY_JSON, "max_msg_timeout": 10**400}).encode(),
    ):
        conn = Connection(ConnectionConfig())
        conn.connection_made(0.0)
        try:
            conn.receive_data(encode_frame(0, body), 1.0)
        except RemoteProtocolError as exc:
            assert UNREADABLE not in str(exc)
        assert conn.state in (ConnectionState.CLOSED, ConnectionState.READY)
    # null means "not said": the default applies
    conn = Connection(ConnectionConfig())
    conn.connection_made(0.0)
    conn.receive_data(
        encode_frame(0, json.dumps({**IDENTIFY_JSON, "max_rdy_count": None}).encode()), 1.0
    )
    assert conn.state is ConnectionState.READY and conn.features is not None
    assert conn.features.max_rdy_count == 2500
    # deflate on with a null level: the default level, and the switch works
    conn = Connection(ConnectionConfig(deflate=True))
    conn.connection_made(0.0)
    body = json.dumps({**IDENTIFY_JSON, "deflate": True, "deflate_level": None}).encode()
    conn.receive_data(encode_frame(0, body) + DeflateCodec(6).compress(encode_frame(0, b"OK")), 1.0)
    assert conn.state is ConnectionState.READY
    # AUTH answered with deep nesting
    conn = Connection(ConnectionConfig(auth_secret=b"x"))
    conn.connection_made(0.0)
    body = json.dumps({**IDENTIFY_JSON, "auth_required": True}).encode()
    try:
        conn.receive_data(encode_frame(0, body) + encode_frame(0, b"[" * 100_000), 1.0)
    except RemoteProtocolError as exc:
        assert UNREADABLE not in str(exc) and "nested" in str(exc)
    assert conn.state is ConnectionState.CLOSED
