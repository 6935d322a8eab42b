"""spec-fixtures/ against nsq_proto, in the client role.

* sessions/ (captured from nsqd v1.3.0): every session the client can produce is replayed
  through a real Connection; it must write exactly the captured client bytes (compressed bytes
  included) and turn the captured server bytes, however they are chunked, into the events the
  frames imply.  Sessions it cannot produce must indeed be refused, and their server frames must
  still decode.
* frames/ (byte examples of the specifications): encoders produce the bytes, decoders read back
  the stated fields.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nsq_proto import ConfigError, ConnectionConfig, LocalProtocolError, commands
from nsq_proto._features import (
    parse_auth_response,
    parse_identify_response,
    parse_trace_receipt,
)
from nsq_proto.wire import FrameDecoder, MessageLayout, decode_message, parse_error_frame

from .support.spec_fixtures import (
    FIXTURES,
    FRAME_TYPE_CODES,
    ClientMismatch,
    Unproducible,
    bytewise,
    config_kwargs,
    expected_features,
    expected_outputs,
    features_summary,
    first_identify_body,
    fixture_frames,
    iter_steps,
    load_frame_cases,
    load_http,
    load_sessions,
    plain_server_stream,
    replay,
    split_at,
    whole,
)

SESSIONS = load_sessions()
PRODUCIBLE = [s for s in SESSIONS if s["client"]["producible"]]
NOT_PRODUCIBLE = [s for s in SESSIONS if not s["client"]["producible"]]
HTTP = load_http()
FRAME_CASES = load_frame_cases()
COMMAND_CASES = [c for c in FRAME_CASES if c["kind"] == "command"]
SERVER_FRAME_CASES = [c for c in FRAME_CASES if c["kind"] == "server_frame"]

HYPOTHESIS = settings(
    max_examples=50,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def by_scenario(sessions: list[dict[str, Any]]) -> pytest.MarkDecorator:
    return pytest.mark.parametrize("session", sessions, ids=[s["scenario"] for s in sessions])


def by_name(cases: list[dict[str, Any]]) -> pytest.MarkDecorator:
    return pytest.mark.parametrize("case", cases, ids=[f"{c['file']}:{c['name']}" for c in cases])


# --------------------------------------------------------------------------- the fixture set


def test_fixture_set_is_complete() -> None:
    assert len(SESSIONS) == 96
    assert len(HTTP) == 16
    assert len(PRODUCIBLE) >= 30
    assert {s["scenario"] for s in PRODUCIBLE} >= {
        "snappy",
        "deflate",
        "tls",
        "tls_snappy",
        "heartbeat_nop",
        "auth_enabled_good_secret",
        "consume_fin_req_touch",
        "pipelined_commands",
    }
    assert (len(COMMAND_CASES), len(SERVER_FRAME_CASES)) == (23, 14)


@by_scenario(SESSIONS)
def test_session_shape(session: dict[str, Any]) -> None:
    assert session["format"] == "nsq-session/1"
    assert session["source"]["kind"] == "capture"
    assert session["source"]["file"] == session["scenario"] + ".json"
    client = session["client"]
    assert isinstance(client["producible"], bool)
    assert client["producible"] or client["reason"]
    previous = -1.0
    for step in session["steps"]:
        (kind,) = step
        assert kind in ("c2s", "s2c", "tls_handshake")
        if kind == "tls_handshake":
            continue
        body = step[kind]
        assert body["t_ms"] >= previous
        previous = body["t_ms"]
        inside_tls = body["wire_hex"] is None
        assert inside_tls == ("tls_plain_hex" in body)
        if not inside_tls and body["layer"] == "plain":
            assert body["wire_hex"] == body["plain_hex"]
    last_s2c = [s["s2c"] for s in session["steps"] if "s2c" in s][-1]
    assert session["closed_by_server"] == last_s2c["closed"]
    assert "t_ms" in session["varying"]


@pytest.mark.parametrize("http", HTTP, ids=[h["scenario"] for h in HTTP])
def test_http_fixture_bytes_match_fields(http: dict[str, Any]) -> None:
    assert http["format"] == "nsq-http/1"
    req, resp = http["request"], http["response"]
    raw_req = bytes.fromhex(req["raw_hex"])
    head = f"{req['method']} {req['target']} {req['version']}\r\n" + "".join(
        f"{k}: {v}\r\n" for k, v in req["headers"]
    )
    assert raw_req == head.encode() + b"\r\n" + bytes.fromhex(req["body_hex"])
    raw_resp = bytes.fromhex(resp["raw_hex"])
    head = f"{resp['version']} {resp['status']} {resp['reason']}\r\n" + "".join(
        f"{k}: {v}\r\n" for k, v in resp["headers"]
    )
    body = bytes.fromhex(resp["body_hex"])
    assert raw_resp == head.encode() + b"\r\n" + body
    length = [v for k, v in resp["headers"] if k.lower() == "content-length"]
    assert length == [str(len(body))]
    if "body_json" in resp:
        assert json.loads(body) == resp["body_json"]


def test_readme_lists_every_fixture_file() -> None:
    readme = (FIXTURES / "README.md").read_text(encoding="utf-8")
    files = [
        p.relative_to(FIXTURES).as_posix()
        for sub in ("sessions", "http", "frames", "tools")
        for p in (FIXTURES / sub).iterdir()
        if p.is_file()
    ]
    assert len(files) == 96 + 16 + 2 + 1
    missing = [f for f in files if f"`{f}`" not in readme]
    assert missing == []


def test_fixtures_are_up_to_date_with_the_captures(tmp_path: Path) -> None:
    script = FIXTURES / "tools" / "convert_captures.py"
    spec = importlib.util.spec_from_file_location("convert_captures", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not module.DEFAULT_CAPTURES.is_dir():
        pytest.skip(f"captures not available at {module.DEFAULT_CAPTURES}")
    outputs = module.convert_all(module.DEFAULT_CAPTURES)
    on_disk = {
        f"{sub}/{p.name}" for sub in ("sessions", "http") for p in (FIXTURES / sub).glob("*.json")
    }
    assert set(outputs) == on_disk
    stale = [rel for rel, text in outputs.items() if (FIXTURES / rel).read_text() != text]
    assert stale == [], "run spec-fixtures/tools/convert_captures.py"


# --------------------------------------------------------------------------- producible sessions


@by_scenario(PRODUCIBLE)
def test_config_reproduces_the_captured_identify(session: dict[str, Any]) -> None:
    config = ConnectionConfig(**config_kwargs(session["client"]["config"]))
    body = json.dumps(config.identify_body(), separators=(",", ":")).encode()
    assert body == first_identify_body(session)


@by_scenario(PRODUCIBLE)
def test_replay_whole_reads(session: dict[str, Any]) -> None:
    assert replay(session, whole) == expected_outputs(session)


@by_scenario(PRODUCIBLE)
def test_replay_byte_by_byte(session: dict[str, Any]) -> None:
    assert replay(session, bytewise) == expected_outputs(session)


@by_scenario(PRODUCIBLE)
@HYPOTHESIS
@given(data=st.data())
def test_replay_random_splits(session: dict[str, Any], data: st.DataObject) -> None:
    def chunker(index: int, payload: bytes) -> list[bytes]:
        if len(payload) < 2:
            return [payload] if payload else []
        cuts = data.draw(
            st.lists(st.integers(1, len(payload) - 1), max_size=12), label=f"cuts of step {index}"
        )
        return split_at(payload, cuts)

    assert replay(session, chunker) == expected_outputs(session)


@by_scenario(PRODUCIBLE)
def test_replay_sees_every_captured_event(session: dict[str, Any]) -> None:
    """The oracle itself is not vacuous: every server frame maps to an output."""
    flat = [o for step in expected_outputs(session) for o in step]
    kinds = [o[0] for o in flat]
    frames = fixture_frames(session)
    assert kinds.count("MessageReceived") == sum(f["type"] == "message" for f in frames)
    assert kinds.count("ErrorReceived") == sum(f["type"] == "error" for f in frames)
    assert kinds.count("HeartbeatReceived") == sum(f.get("text") == "_heartbeat_" for f in frames)
    ready = [o for o in flat if o[0] == "Ready"]
    fatal = any(o[0] == "ErrorReceived" and o[3] for o in flat)
    assert len(ready) == 1 or fatal
    if session["closed_by_server"]:
        assert kinds[-1] == "ConnectionClosed"


# --------------------------------------------------------------------------- non-producible sessions


@by_scenario(NOT_PRODUCIBLE)
def test_unproducible_sessions_are_refused_by_the_client(session: dict[str, Any]) -> None:
    client = session["client"]
    refused = client.get("refused_config")
    if refused is not None:
        with pytest.raises(ConfigError):
            ConnectionConfig(**config_kwargs(refused))
        return
    with pytest.raises((ClientMismatch, Unproducible, LocalProtocolError)):
        replay(session, whole)


# --------------------------------------------------------------------------- server frames


def decode_all(stream: bytes, chunks: list[bytes]) -> list[tuple[int, bytes]]:
    decoder = FrameDecoder()
    frames: list[tuple[int, bytes]] = []
    for chunk in chunks:
        frames.extend(decoder.feed(chunk))
    assert decoder.buffered == 0
    return frames


def want_frames(session: dict[str, Any]) -> list[tuple[int, bytes]]:
    return [
        (FRAME_TYPE_CODES[f["type"]], bytes.fromhex(f["data_hex"])) for f in fixture_frames(session)
    ]


@by_scenario(SESSIONS)
def test_session_frames_decode(session: dict[str, Any]) -> None:
    stream = plain_server_stream(session)
    want = want_frames(session)
    assert decode_all(stream, [stream]) == want
    assert decode_all(stream, bytewise(0, stream)) == want
    for frame in fixture_frames(session):
        data = bytes.fromhex(frame["data_hex"])
        if frame["type"] == "message":
            m = frame["message"]
            msg = decode_message(data)
            assert (msg.timestamp, msg.attempts, msg.id.hex(), msg.body.hex()) == (
                m["timestamp_ns"],
                m["attempts"],
                m["id_hex"],
                m["body_hex"],
            )
            continue
        if "text" in frame:
            assert data.decode("utf-8") == frame["text"]
        if "json" in frame:
            assert json.loads(data) == frame["json"]
        if frame["type"] == "error":
            code, text = parse_error_frame(data)
            assert code.startswith("E_")
            assert data.decode("utf-8", "replace") in (code, f"{code} {text}")


@by_scenario(NOT_PRODUCIBLE)
@HYPOTHESIS
@given(data=st.data())
def test_unproducible_session_frames_decode_random_splits(
    session: dict[str, Any], data: st.DataObject
) -> None:
    stream = plain_server_stream(session)
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=16))
    assert decode_all(stream, split_at(stream, cuts)) == want_frames(session)


@by_scenario(SESSIONS)
def test_identify_responses_parse(session: dict[str, Any]) -> None:
    """Every JSON IDENTIFY response of a capture parses to the features it states."""
    seen_identify = False
    for _, s2c in iter_steps(session, "s2c"):
        for frame in s2c["frames"]:
            obj = frame.get("json")
            if isinstance(obj, dict) and "max_rdy_count" in obj:
                seen_identify = True
                features = parse_identify_response(bytes.fromhex(frame["data_hex"]))
                assert features_summary(features) == expected_features(obj)
    client = session["client"]
    if client["producible"]:
        first = next(f for _, s in iter_steps(session, "s2c") for f in s["frames"])
        assert seen_identify or first["type"] == "error" or first.get("text") == "OK"


# --------------------------------------------------------------------------- frames/ fixtures


def encoder_args(case: dict[str, Any]) -> dict[str, Any]:
    """Fixture args -> keyword arguments of the encoder (``x_hex`` is the bytes ``x``)."""
    args: dict[str, Any] = {}
    for key, value in case["args"].items():
        if key == "bodies_hex":
            args["bodies"] = [bytes.fromhex(v) for v in value]
        elif key == "items":
            args["items"] = [(trace_id, bytes.fromhex(body)) for trace_id, body in value]
        elif key.endswith("_hex"):
            args[key[: -len("_hex")]] = bytes.fromhex(value)
        else:
            args[key] = value
    return args


@by_name(COMMAND_CASES)
def test_frame_case_command_encodes(case: dict[str, Any]) -> None:
    want = bytes.fromhex(case["hex"])
    encoder = case["encoder"]
    target = getattr(commands, encoder)
    got = target if isinstance(target, bytes) else target(**encoder_args(case))
    assert got.hex() == want.hex()
    if case["command"] != "MAGIC":
        assert got.split(b"\n", 1)[0].split(b" ", 1)[0] == case["command"].encode()


@by_name(SERVER_FRAME_CASES)
def test_frame_case_server_frame_decodes(case: dict[str, Any]) -> None:
    raw = bytes.fromhex(case["hex"])
    frame = case["frame"]
    data = bytes.fromhex(frame["data_hex"])
    want = [(FRAME_TYPE_CODES[frame["type"]], data)]
    assert decode_all(raw, [raw]) == want
    assert decode_all(raw, bytewise(0, raw)) == want
    if "text" in frame:
        assert data.decode("utf-8") == frame["text"]
    if "json" in frame:
        assert json.loads(data) == frame["json"]
    if "error" in case:
        assert parse_error_frame(data) == (case["error"]["code"], case["error"]["text"])
    if "identify" in case:
        features = parse_identify_response(data)
        got = features_summary(features)
        for key, value in case["identify"].items():
            if key.endswith("_ms"):
                assert got[key[: -len("_ms")]] == value / 1000
            else:
                assert got[key] == value, key
    if "auth" in case:
        auth = parse_auth_response(data)
        assert (auth.identity, auth.identity_url, auth.permission_count) == (
            case["auth"]["identity"],
            case["auth"]["identity_url"],
            case["auth"]["permission_count"],
        )
    if "receipt" in case:
        receipt = parse_trace_receipt(data)
        r = case["receipt"]
        assert (receipt.internal_id, receipt.trace_id, receipt.queue_offset, receipt.raw_size) == (
            r["internal_id"],
            r["trace_id"],
            r["queue_offset"],
            r["raw_size"],
        )
    if "message" in case:
        m = case["message"]
        msg = decode_message(data, MessageLayout(**case["layout"]))
        ext = None if msg.ext_data is None else msg.ext_data.hex()
        assert {
            "timestamp_ns": msg.timestamp,
            "attempts": msg.attempts,
            "id_hex": msg.id.hex(),
            "body_hex": msg.body.hex(),
            "internal_id": msg.internal_id,
            "trace_id": msg.trace_id,
            "ext_version": msg.ext_version,
            "ext_data_hex": ext,
            "queue_offset": msg.queue_offset,
            "raw_size": msg.raw_size,
        } == m
