#!/usr/bin/env python3
"""Turn the nsqd/nsqlookupd v1.3.0 captures into the fixture formats of spec-fixtures/.

Usage::

    python spec-fixtures/tools/convert_captures.py [CAPTURES_DIR] [--out SPEC_FIXTURES_DIR] [--check]

CAPTURES_DIR defaults to ``../shared/spec/captures`` relative to the repository root.  Every
nsqd TCP capture becomes ``sessions/<scenario>.json`` ("nsq-session/1"); every HTTP capture
(``lookupd_*``, ``nsqd_http_*``, ``nsqd_stats_json``) becomes ``http/<scenario>.json``
("nsq-http/1").  ``--check`` writes nothing and exits with status 1 when a checked-in file
differs from what the captures produce.

Standard library only.  The script also decides, per session, whether the nsq_proto client can
emit exactly the captured client bytes (``client.producible``) and with which
``ConnectionConfig`` keyword arguments (``client.config``).  That decision follows the client's
documented rules (fixed IDENTIFY key order, configuration ranges, which command is allowed in
which state, automatic AUTH and heartbeat NOP); tests/test_spec_fixtures.py checks every
verdict against the real client.
"""

from __future__ import annotations

import argparse
import json
import re
import struct
import sys
from collections import deque
from pathlib import Path
from typing import Any

FORMAT_SESSION = "nsq-session/1"
FORMAT_HTTP = "nsq-http/1"

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CAPTURES = REPO_ROOT.parent / "shared" / "spec" / "captures"
DEFAULT_OUT = REPO_ROOT / "spec-fixtures"

HTTP_PREFIXES = ("lookupd_", "nsqd_http_")
HTTP_NAMES = ("nsqd_stats_json",)

MAGIC = b"  V2"
FRAME_TYPES = {0: "response", 1: "error", 2: "message"}
HEARTBEAT = b"_heartbeat_"
DEFAULT_MAX_RDY_COUNT = 2500
_NAME_RE = re.compile(r"[.a-zA-Z0-9_-]+(#ephemeral)?\Z")
_DECIMAL_RE = re.compile(rb"(0|[1-9][0-9]*)\Z")


class NotProducible(Exception):
    """The nsq_proto client cannot emit these client bytes."""


class ConfigRefused(NotProducible):
    """The IDENTIFY needs a value that ConnectionConfig refuses."""

    def __init__(self, problems: list[str], config: dict[str, Any]) -> None:
        super().__init__("ConnectionConfig refuses " + ", ".join(problems))
        self.config = config


# --------------------------------------------------------------------------- small helpers


def hexstr(data: bytes | None) -> str | None:
    return None if data is None else data.hex()


def is_http_capture(name: str) -> bool:
    return name.startswith(HTTP_PREFIXES) or name in HTTP_NAMES


def try_text(data: bytes) -> str | None:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def try_json_container(text: str | None) -> Any:
    """The parsed value when ``text`` is a JSON object or array, else None."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict | list) else None


def go_duration_ms(text: str) -> int:
    """Milliseconds of a Go duration such as ``2s``, ``1h``, ``1m30s``, ``500ms``."""
    units = {"ns": 1e-6, "us": 1e-3, "µs": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3, "h": 3600e3}
    total = 0.0
    parts = re.findall(r"([0-9.]+)(ns|us|µs|ms|s|m|h)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a Go duration: {text!r}")
    for number, unit in parts:
        total += float(number) * units[unit]
    return round(total)


def flag_value(flags: list[str], name: str) -> str | None:
    prefix = name + "="
    for flag in flags:
        if flag.startswith(prefix):
            return flag[len(prefix) :]
    return None


def server_options(flags: list[str]) -> dict[str, Any]:
    def as_int(name: str) -> int | None:
        value = flag_value(flags, name)
        return None if value is None else int(value)

    def as_ms(name: str) -> int | None:
        value = flag_value(flags, name)
        return None if value is None else go_duration_ms(value)

    return {
        "flags": list(flags),
        "tls": flag_value(flags, "--tls-cert") is not None,
        "tls_required": flag_value(flags, "--tls-required") == "true",
        "auth": flag_value(flags, "--auth-http-address") is not None,
        "snappy": flag_value(flags, "--snappy") != "false",
        "max_msg_size": as_int("--max-msg-size"),
        "max_body_size": as_int("--max-body-size"),
        "max_req_timeout_ms": as_ms("--max-req-timeout"),
        "max_deflate_level": as_int("--max-deflate-level"),
        "max_heartbeat_interval_ms": as_ms("--max-heartbeat-interval"),
    }


def parse_http_message(raw: bytes) -> dict[str, Any]:
    head, sep, body = raw.partition(b"\r\n\r\n")
    if not sep:
        raise ValueError("HTTP message without the blank line after its headers")
    lines = head.decode("latin-1").split("\r\n")
    headers = []
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers.append([name, value.strip()])
    return {"start_line": lines[0], "headers": headers, "body": body}


def setup_requests(capture: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for item in capture.get("setup", []):
        msg = parse_http_message(item["request"].encode("utf-8"))
        method, target, _version = msg["start_line"].split(" ")
        out.append({"method": method, "path": target, "body_hex": msg["body"].hex()})
    return out


# --------------------------------------------------------------------------- server frames


def split_frames(data: bytes) -> list[tuple[int, bytes]]:
    frames = []
    pos = 0
    while pos < len(data):
        if len(data) - pos < 8:
            raise ValueError("plaintext ends inside a frame header")
        size, frame_type = struct.unpack_from(">ii", data, pos)
        end = pos + 4 + size
        if size < 4 or end > len(data):
            raise ValueError(f"bad frame size {size} at offset {pos}")
        frames.append((frame_type, data[pos + 8 : end]))
        pos = end
    return frames


def convert_frame(frame_type: int, data: bytes, decoded: dict[str, Any]) -> dict[str, Any]:
    name = FRAME_TYPES[frame_type]
    if decoded["frame_type"] != frame_type or decoded["size"] != len(data) + 4:
        raise ValueError(f"capture's decoded frame disagrees with its bytes: {decoded}")
    frame: dict[str, Any] = {"type": name, "data_hex": data.hex()}
    if frame_type == 2:
        timestamp, attempts = struct.unpack_from(">qH", data)
        msg_id, body = data[10:26], data[26:]
        want = decoded["message"]
        if (
            want["timestamp_ns"] != timestamp
            or want["attempts"] != attempts
            or want["id"].encode() != msg_id
            or want["body_hex"] != body.hex()
        ):
            raise ValueError(f"capture's decoded message disagrees with its bytes: {want}")
        frame["message"] = {
            "timestamp_ns": timestamp,
            "attempts": attempts,
            "id_hex": msg_id.hex(),
            "body_hex": body.hex(),
        }
        return frame
    text = try_text(data)
    if text is not None:
        if decoded.get("data_text") != text:
            raise ValueError(f"capture's decoded text disagrees with its bytes: {decoded}")
        frame["text"] = text
        value = try_json_container(text)
        if value is not None:
            frame["json"] = value
    return frame


def convert_frames(plain: bytes, decoded: list[dict[str, Any]]) -> list[dict[str, Any]]:
    frames = split_frames(plain)
    if len(frames) != len(decoded):
        raise ValueError(f"{len(frames)} frames in the bytes, {len(decoded)} decoded")
    return [convert_frame(t, d, dec) for (t, d), dec in zip(frames, decoded, strict=True)]


# --------------------------------------------------------------------------- client commands


def valid_name(raw: bytes) -> bool:
    try:
        name = raw.decode("ascii")
    except UnicodeDecodeError:
        return False
    return 1 <= len(name) <= 64 and _NAME_RE.match(name) is not None


def show(raw: bytes) -> str:
    """Bytes as a quoted, escaped string for messages."""
    return json.dumps(raw.decode("utf-8", "backslashreplace"))


def parse_decimal(raw: bytes, what: str) -> int:
    if not _DECIMAL_RE.match(raw):
        raise NotProducible(f"{what} {show(raw)} is not a non-negative decimal our client writes")
    return int(raw)


class CommandReader:
    """Splits the captured client byte stream into commands, across c2s steps."""

    def __init__(self) -> None:
        self.first = True

    def read(self, data: bytes) -> list[tuple[str, dict[str, Any]]]:
        commands: list[tuple[str, dict[str, Any]]] = []
        pos = 0
        if self.first:
            self.first = False
            if data[:4] != MAGIC:
                raise NotProducible(
                    f"the client bytes do not start with the magic: {show(data[:4])}"
                )
            commands.append(("MAGIC", {}))
            pos = 4
        while pos < len(data):
            nl = data.find(b"\n", pos)
            if nl < 0:
                raise NotProducible(f"command line without its newline: {show(data[pos:][:20])}")
            line = data[pos:nl]
            pos = nl + 1
            tokens = line.split(b" ")
            name = tokens[0]
            args = tokens[1:]

            def body(name: bytes = name) -> bytes:
                nonlocal pos
                if len(data) - pos < 4:
                    raise NotProducible(f"{show(name)} without its 4-byte size")
                (size,) = struct.unpack_from(">I", data, pos)
                if size == 0 or len(data) - pos - 4 < size:
                    raise NotProducible(
                        f"{show(name)} with a body size ({size}) our client never sends"
                    )
                chunk = data[pos + 4 : pos + 4 + size]
                pos += 4 + size
                return chunk

            commands.append(self._command(name, args, body))
        return commands

    @staticmethod
    def _command(name: bytes, args: list[bytes], body: Any) -> tuple[str, dict[str, Any]]:
        def want_args(n: int) -> None:
            if len(args) != n:
                raise NotProducible(f"{show(name)} with {len(args)} argument(s)")

        def topic(raw: bytes) -> str:
            if not valid_name(raw):
                raise NotProducible(
                    f"invalid topic/channel name {show(raw)} (refused by our client)"
                )
            return raw.decode()

        if name in (b"IDENTIFY", b"AUTH"):
            want_args(0)
            return name.decode(), {"body": body()}
        if name == b"SUB":
            want_args(2)
            return "SUB", {"topic": topic(args[0]), "channel": topic(args[1])}
        if name == b"PUB":
            want_args(1)
            return "PUB", {"topic": topic(args[0]), "body": body()}
        if name == b"DPUB":
            want_args(2)
            t = topic(args[0])
            delay = parse_decimal(args[1], "DPUB delay")
            return "DPUB", {"topic": t, "delay_ms": delay, "body": body()}
        if name == b"MPUB":
            want_args(1)
            t = topic(args[0])
            payload = body()
            if len(payload) < 4:
                raise NotProducible("MPUB body shorter than its message count")
            (count,) = struct.unpack_from(">I", payload)
            items, pos = [], 4
            for _ in range(count):
                if len(payload) - pos < 4:
                    raise NotProducible("MPUB body ends inside a message size")
                (size,) = struct.unpack_from(">I", payload, pos)
                item = payload[pos + 4 : pos + 4 + size]
                if size == 0 or len(item) != size:
                    raise NotProducible("MPUB message sizes disagree with the body")
                items.append(item)
                pos += 4 + size
            if not items or pos != len(payload):
                raise NotProducible("MPUB body is not what our client writes (count/size mismatch)")
            return "MPUB", {"topic": t, "bodies": items}
        if name == b"RDY":
            want_args(1)
            return "RDY", {"count": parse_decimal(args[0], "RDY count")}
        if name in (b"FIN", b"TOUCH"):
            want_args(1)
            if len(args[0]) != 16:
                raise NotProducible(f"{show(name)} with an id of {len(args[0])} bytes")
            return name.decode(), {"msg_id": args[0]}
        if name == b"REQ":
            want_args(2)
            if len(args[0]) != 16:
                raise NotProducible(f"REQ with an id of {len(args[0])} bytes")
            return "REQ", {"msg_id": args[0], "delay_ms": parse_decimal(args[1], "REQ delay")}
        if name in (b"NOP", b"CLS"):
            want_args(0)
            return name.decode(), {}
        raise NotProducible(f"command {show(name)} is not one our client sends")


# --------------------------------------------------------------------------- IDENTIFY -> config


def config_from_identify(body: bytes) -> dict[str, Any]:
    """ConnectionConfig kwargs whose identify_body() reproduces ``body`` byte for byte.

    Raises ConfigRefused (carrying the kwargs that would be needed) when a value is outside
    what ConnectionConfig accepts, and NotProducible when no configuration can produce the body.
    """
    try:
        pairs = json.loads(body, object_pairs_hook=lambda p: p)
    except ValueError as exc:
        raise NotProducible("the IDENTIFY body is not JSON") from exc
    if not isinstance(pairs, list):
        raise NotProducible("the IDENTIFY body is not a JSON object")
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise NotProducible("the IDENTIFY body repeats a key")
    kw: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    problems: list[str] = []

    def seconds(ms: int) -> float:
        return ms / 1000

    def is_int(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    if obj.get("feature_negotiation") is not True:
        raise NotProducible("our client always sends feature_negotiation=true")
    if "heartbeat_interval" not in obj:
        raise NotProducible("our client always sends heartbeat_interval")
    for key, value in pairs:
        if key in ("client_id", "hostname", "user_agent") and isinstance(value, str):
            kw[key] = value
        elif key == "heartbeat_interval" and is_int(value):
            if value == -1:
                kw[key] = None
            else:
                kw[key] = seconds(value)
                if not 1000 <= value <= 60000:  # 0 ("server default") included
                    problems.append(f"heartbeat_interval={value} ms")
        elif key == "feature_negotiation":
            pass
        elif key in ("tls_v1", "snappy", "deflate", "extend_support") and value is True:
            kw[key] = True
        elif key == "deflate_level" and obj.get("deflate") is True and is_int(value):
            kw[key] = value
            if not 1 <= value <= 9:
                problems.append(f"deflate_level={value}")
        elif key == "msg_timeout" and is_int(value) and value != 0:
            kw[key] = seconds(value)
            if value < 1000:
                problems.append(f"msg_timeout={value} ms")
        elif key == "sample_rate" and is_int(value) and value != 0:
            kw[key] = value
            if not 0 <= value <= 99:
                problems.append(f"sample_rate={value}")
        elif key == "output_buffer_size" and is_int(value):
            kw[key] = value
            if not (value == -1 or value >= 64):
                problems.append(f"output_buffer_size={value}")
        elif key == "output_buffer_timeout" and is_int(value) and value != 0:
            kw[key] = 0 if value == -1 else seconds(value)
            if not (value == -1 or 25 <= value <= 30000):
                problems.append(f"output_buffer_timeout={value} ms")
        elif key == "desired_tag" and isinstance(value, str) and len(value) <= 100:
            kw[key] = value
        else:
            extra[key] = value
    if "user_agent" not in obj:
        kw["user_agent"] = None  # the config's default would add one
    if kw.get("snappy") and kw.get("deflate"):
        problems.append("snappy and deflate together")
    if extra:
        kw["identify_extra"] = extra
    if problems:
        raise ConfigRefused(problems, kw)
    own = identify_json({k: v for k, v in kw.items() if k != "identify_extra"})
    clash = sorted(set(extra) & set(json.loads(own)))
    if clash:
        # identify_extra would overwrite a key the configuration writes itself
        raise NotProducible(
            f"IDENTIFY {clash[0]}={json.dumps(obj[clash[0]])} is not a value our client sends"
        )
    if identify_json(kw) != body:
        raise NotProducible("the IDENTIFY keys are in an order our client cannot produce")
    return kw


def identify_json(kw: dict[str, Any]) -> bytes:
    """The IDENTIFY body ConnectionConfig(**kw).identify_body() produces (same key order)."""

    def ms(seconds: float) -> int:
        return round(seconds * 1000)

    body: dict[str, Any] = {}
    for key in ("client_id", "hostname"):
        if kw.get(key) is not None:
            body[key] = kw[key]
    hb = kw.get("heartbeat_interval", 30.0)
    body["heartbeat_interval"] = -1 if hb is None else ms(hb)
    body["feature_negotiation"] = True
    ua = kw.get("user_agent", "<default>")
    if ua is not None:
        body["user_agent"] = ua
    for key in ("tls_v1", "snappy"):
        if kw.get(key):
            body[key] = True
    if kw.get("deflate"):
        body["deflate"] = True
        body["deflate_level"] = kw.get("deflate_level", 6)
    if kw.get("msg_timeout") is not None:
        body["msg_timeout"] = ms(kw["msg_timeout"])
    if kw.get("sample_rate"):
        body["sample_rate"] = kw["sample_rate"]
    if kw.get("output_buffer_size") is not None:
        body["output_buffer_size"] = kw["output_buffer_size"]
    if kw.get("output_buffer_timeout") is not None:
        obt = kw["output_buffer_timeout"]
        body["output_buffer_timeout"] = -1 if obt == 0 else ms(obt)
    if kw.get("extend_support"):
        body["extend_support"] = True
    if kw.get("desired_tag") is not None:
        body["desired_tag"] = kw["desired_tag"]
    body.update(kw.get("identify_extra", {}))
    return json.dumps(body, separators=(",", ":")).encode()


# --------------------------------------------------------------------------- client model


_OPEN = {"READY", "SUBSCRIBING", "SUBSCRIBED", "CLOSING", "CLOSE_WAIT"}
_ALLOWED = {
    "SUB": {"READY"},
    "PUB": _OPEN,
    "MPUB": _OPEN,
    "DPUB": _OPEN,
    "NOP": _OPEN,
    "RDY": {"SUBSCRIBING", "SUBSCRIBED"},
    "FIN": {"SUBSCRIBING", "SUBSCRIBED", "CLOSING", "CLOSE_WAIT"},
    "REQ": {"SUBSCRIBING", "SUBSCRIBED", "CLOSING", "CLOSE_WAIT"},
    "TOUCH": {"SUBSCRIBING", "SUBSCRIBED", "CLOSING", "CLOSE_WAIT"},
    "CLS": {"SUBSCRIBING", "SUBSCRIBED"},
}


def client_verdict(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """Whether (and how) the nsq_proto client produces the client side of ``steps``."""
    result: dict[str, Any] = {"producible": False, "config": None}
    try:
        _walk(steps, result)
    except NotProducible as exc:
        result["producible"] = False
        result["reason"] = str(exc)
        return result
    result["producible"] = True
    return result


def _walk(steps: list[dict[str, Any]], result: dict[str, Any]) -> None:
    reader = CommandReader()
    automatic: deque[str] = deque(["MAGIC", "IDENTIFY"])  # what connection_made sends
    pending: deque[str] = deque()
    state = "IDENTIFYING"
    features: dict[str, Any] = {}
    wants_compression = False

    for step in steps:
        if "tls_handshake" in step:
            if state != "TLS_HANDSHAKE":
                raise NotProducible("a TLS handshake our client would not start")
            state = "TLS_RESPONSE"
            continue
        if "c2s" in step:
            for name, args in reader.read(bytes.fromhex(step["c2s"]["plain_hex"])):
                if automatic and automatic[0] == name:
                    automatic.popleft()
                    if name == "IDENTIFY":
                        try:
                            result["config"] = config_from_identify(args["body"])
                        except ConfigRefused as exc:
                            result["refused_config"] = exc.config
                            raise
                    elif name == "AUTH":
                        try:
                            result["config"]["auth_secret"] = args["body"].decode("utf-8")
                        except UnicodeDecodeError as exc:
                            raise NotProducible("AUTH secret is not UTF-8 text") from exc
                    continue
                if automatic:
                    raise NotProducible(
                        f"our client sends {automatic[0]} here, the captured client sent {name}"
                    )
                if name in ("MAGIC", "IDENTIFY", "AUTH"):
                    raise NotProducible(f"our client never sends {name} on request")
                if state not in _ALLOWED[name]:
                    raise NotProducible(f"our client refuses {name} in state {state}")
                if name == "RDY" and args["count"] > features.get(
                    "max_rdy_count", DEFAULT_MAX_RDY_COUNT
                ):
                    raise NotProducible(f"RDY {args['count']} is above max_rdy_count")
                if name == "SUB":
                    pending.append("SUB")
                    state = "SUBSCRIBING"
                elif name in ("PUB", "MPUB", "DPUB"):
                    pending.append("PUB")
                elif name == "CLS":
                    pending.append("CLS")
                    state = "CLOSING"
            continue

        s2c = step["s2c"]
        frames = s2c["frames"]
        if frames and automatic:
            raise NotProducible(
                f"our client sends {automatic[0]} before the server speaks; the captured one did not"
            )
        for frame in frames:
            if state == "CLOSED":
                break
            kind, text = frame["type"], frame.get("text")
            if kind == "error":
                last = frame is frames[-1]
                if s2c["closed"] and last:
                    state = "CLOSED"
                continue
            if kind == "message":
                continue
            if text == HEARTBEAT.decode():
                automatic.append("NOP")
                continue
            if state == "IDENTIFYING":
                features = frame.get("json") or {}
                wants_compression = bool(features.get("snappy") or features.get("deflate"))
                if features.get("tls_v1"):
                    state = "TLS_HANDSHAKE"
                elif wants_compression:
                    state = "COMPRESSION_RESPONSE"
                else:
                    state = _after_upgrades(features, automatic)
            elif state == "TLS_RESPONSE":
                if wants_compression:
                    state = "COMPRESSION_RESPONSE"
                else:
                    state = _after_upgrades(features, automatic)
            elif state == "COMPRESSION_RESPONSE":
                state = _after_upgrades(features, automatic)
            elif state == "AUTHENTICATING":
                state = "READY"
            elif pending:
                answered = pending.popleft()
                if answered == "SUB" and state == "SUBSCRIBING":
                    state = "SUBSCRIBED"
                elif answered == "CLS":
                    state = "CLOSE_WAIT"
            else:
                raise NotProducible(f"a response nobody asked for: {text}")
        if s2c["closed"]:
            state = "CLOSED"
    if automatic:
        raise NotProducible(
            f"our client would send {automatic[0]} (automatically), the captured client did not"
        )


def _after_upgrades(features: dict[str, Any], automatic: deque[str]) -> str:
    if features.get("auth_required"):
        automatic.append("AUTH")
        return "AUTHENTICATING"
    return "READY"


# --------------------------------------------------------------------------- sessions


def convert_session(capture: dict[str, Any], file_name: str) -> dict[str, Any]:
    flags = capture.get("nsqd_flags", [])
    tls = capture.get("tls")
    steps: list[dict[str, Any]] = []
    varying = {"t_ms"}
    inside_tls = False
    for index, ex in enumerate(capture["exchanges"]):
        wire = None if ex["hex"] is None else bytes.fromhex(ex["hex"])
        plain_hex = ex.get("plain_hex")
        plain = bytes.fromhex(plain_hex) if plain_hex is not None else wire
        assert plain is not None, f"{file_name}: exchange {index} has no bytes"
        layer = ex["layer"]
        if wire is None:
            inside_tls = True
        body: dict[str, Any] = {
            "plain_hex": plain.hex(),
            "wire_hex": hexstr(wire),
        }
        if inside_tls:
            tls_plain = ex.get("tls_plain_hex")
            body["tls_plain_hex"] = plain.hex() if tls_plain is None else tls_plain
        body["layer"] = layer
        body["t_ms"] = ex["t_ms"]
        if ex["dir"] == "c2s":
            if "note" in ex:
                body["note"] = ex["note"]
            steps.append({"c2s": body})
        else:
            frames = convert_frames(plain, ex["decoded"])
            body["frames"] = frames
            body["closed"] = bool(ex.get("closed", False))
            body["quiet_ms"] = ex.get("window", {}).get("quiet_ms", 300)
            if "note" in ex:
                body["note"] = ex["note"]
            steps.append({"s2c": body})
            if any(f["type"] == "message" for f in frames):
                varying |= {"message_id", "timestamp"}
                if "snappy" in layer or "deflate" in layer:
                    varying.add("compressed_bytes")
            if body["closed"] and any(f.get("text") == HEARTBEAT.decode() for f in frames):
                varying.add("heartbeat_count")
        if tls is not None and tls["after_exchange_index"] == index:
            steps.append({"tls_handshake": {"version": tls["version"], "cipher": tls["cipher"]}})
    if "message_id" in varying:
        ids = {
            bytes.fromhex(f["message"]["id_hex"])
            for s in steps
            if "s2c" in s
            for f in s["s2c"]["frames"]
            if f["type"] == "message"
        }
        for s in steps:
            if "c2s" in s and any(i in bytes.fromhex(s["c2s"]["plain_hex"]) for i in ids):
                varying.add("echoed_message_id")
                if "snappy" in s["c2s"]["layer"] or "deflate" in s["c2s"]["layer"]:
                    varying.add("compressed_bytes")
    session: dict[str, Any] = {
        "format": FORMAT_SESSION,
        "scenario": capture["scenario"],
        "description": capture["description"],
    }
    if capture.get("notes"):
        session["notes"] = capture["notes"]
    session["source"] = {"kind": "capture", "server": capture["server"], "file": file_name}
    session["server_options"] = server_options(flags)
    if capture.get("auth_server"):
        auth = capture["auth_server"]
        session["auth_server"] = {
            "behaviour": auth["behaviour"],
            "requests": [r["request_line"] for r in auth.get("requests_received", [])],
        }
    session["setup"] = setup_requests(capture)
    session["client"] = client_verdict(steps)
    session["steps"] = steps
    session["closed_by_server"] = bool(capture["closed_by_server"])
    order = [
        "t_ms",
        "message_id",
        "timestamp",
        "echoed_message_id",
        "compressed_bytes",
        "heartbeat_count",
    ]
    session["varying"] = [v for v in order if v in varying]
    return session


# --------------------------------------------------------------------------- HTTP


def convert_http(capture: dict[str, Any], file_name: str) -> dict[str, Any]:
    exchanges = capture["exchanges"]
    if [e["dir"] for e in exchanges] != ["c2s", "s2c"]:
        raise ValueError(f"{file_name}: expected one request and one response")
    raw_req = bytes.fromhex(exchanges[0]["hex"])
    raw_resp = bytes.fromhex(exchanges[1]["hex"])
    req = parse_http_message(raw_req)
    method, target, version = req["start_line"].split(" ")
    resp = parse_http_message(raw_resp)
    resp_version, status, reason = resp["start_line"].split(" ", 2)
    decoded = exchanges[1]["decoded"]
    if decoded["status"] != int(status) or decoded["headers"] != resp["headers"]:
        raise ValueError(f"{file_name}: decoded response disagrees with its bytes")
    response: dict[str, Any] = {
        "version": resp_version,
        "status": int(status),
        "reason": reason,
        "headers": resp["headers"],
        "body_hex": resp["body"].hex(),
    }
    text = try_text(resp["body"])
    if text is not None:
        response["body_text"] = text
        value = try_json_container(text)
        if value is not None:
            response["body_json"] = value
    response["raw_hex"] = raw_resp.hex()
    path, _, query = target.partition("?")
    varying = ["t_ms"]
    if any(h[0].lower() == "date" for h in resp["headers"]):
        varying.append("date_header")
    body_text = response.get("body_text", "")
    for key, token in (
        ("remote_address", "remote_address"),
        ("hostname", "hostname"),
        ("start_time", "start_time"),
        ("connect_ts", "connect_ts"),
        ("memory", "memory_stats"),
    ):
        if f'"{key}"' in body_text:
            varying.append(token)
    if len(varying) > 2:
        varying.append("content_length")
    http: dict[str, Any] = {
        "format": FORMAT_HTTP,
        "scenario": capture["scenario"],
        "description": capture["description"],
    }
    if capture.get("notes"):
        http["notes"] = capture["notes"]
    if capture.get("consumer_conn_note"):
        http["consumer_connection"] = capture["consumer_conn_note"]
    http["source"] = {"kind": "capture", "server": capture["server"], "file": file_name}
    http["server_options"] = {
        "nsqd_flags": capture.get("nsqd_flags"),
        "nsqlookupd_flags": capture.get("nsqlookupd_flags"),
    }
    http["setup"] = setup_requests(capture)
    http["request"] = {
        "method": method,
        "target": target,
        "path": path,
        "query": [list(p.partition("=")[::2]) for p in query.split("&")] if query else [],
        "version": version,
        "headers": req["headers"],
        "body_hex": req["body"].hex(),
        "raw_hex": raw_req.hex(),
    }
    http["response"] = response
    http["closed_by_server"] = bool(capture["closed_by_server"])
    http["varying"] = varying
    return http


# --------------------------------------------------------------------------- main


def render(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def convert_all(captures: Path) -> dict[str, str]:
    """Relative output path -> file content, for every capture in ``captures``."""
    out: dict[str, str] = {}
    files = sorted(p for p in captures.glob("*.json"))
    if not files:
        raise SystemExit(f"no captures in {captures}")
    for path in files:
        capture = json.loads(path.read_text(encoding="utf-8"))
        scenario = capture["scenario"]
        if scenario != path.stem:
            raise SystemExit(f"{path.name}: scenario {scenario!r} does not match the file name")
        if is_http_capture(scenario):
            out[f"http/{scenario}.json"] = render(convert_http(capture, path.name))
        elif capture["server"].startswith("nsqd "):
            out[f"sessions/{scenario}.json"] = render(convert_session(capture, path.name))
        else:
            raise SystemExit(f"{path.name}: neither an nsqd TCP nor an HTTP capture")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("captures", nargs="?", type=Path, default=DEFAULT_CAPTURES)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args(argv)
    outputs = convert_all(args.captures)
    stale = []
    for rel, content in outputs.items():
        target = args.out / rel
        current = target.read_text(encoding="utf-8") if target.exists() else None
        if current == content:
            continue
        stale.append(rel)
        if not args.check:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content, encoding="utf-8")
    for sub in ("sessions", "http"):
        for existing in sorted((args.out / sub).glob("*.json")):
            rel = f"{sub}/{existing.name}"
            if rel not in outputs:
                stale.append(rel)
                if not args.check:
                    existing.unlink()
    sessions = sum(1 for k in outputs if k.startswith("sessions/"))
    verb = "out of date" if args.check else "written/removed"
    print(f"{sessions} sessions, {len(outputs) - sessions} http; {len(stale)} file(s) {verb}")
    for rel in stale:
        print(f"  {rel}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
