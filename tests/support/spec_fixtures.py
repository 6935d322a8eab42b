"""Loading spec-fixtures/ and replaying its sessions against nsq_proto in the client role.

Two independent halves:

* :func:`replay` drives a real :class:`nsq_proto.Connection` through a session: each captured
  client step becomes the API call that should produce it, the bytes the connection writes are
  compared with the captured client bytes, and the captured server bytes are fed back in.  It
  returns what the connection emitted (events and non-Send actions), normalised to tuples.
* :func:`expected_outputs` derives, from the fixture alone, what a correct client must emit for
  the same session.  The tests compare the two.
"""

from __future__ import annotations

import itertools
import json
import struct
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nsq_proto import (
    Close,
    CloseWaitReceived,
    Connection,
    ConnectionClosed,
    ConnectionConfig,
    ErrorReceived,
    HeartbeatReceived,
    MessageReceived,
    NegotiatedFeatures,
    Output,
    PublishFailed,
    PublishSucceeded,
    Ready,
    Send,
    StartTLS,
    Subscribed,
)

from . import ROOT

FIXTURES = ROOT / "spec-fixtures"
HEARTBEAT = "_heartbeat_"
DEFAULT_MAX_RDY_COUNT = 2500

#: (step index, server bytes of that step) -> the pieces to hand to receive_data, in order
Chunker = Callable[[int, bytes], Sequence[bytes]]
Normalised = tuple[Any, ...]


# --------------------------------------------------------------------------- loading


def load_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def load_sessions() -> list[dict[str, Any]]:
    return [load_json(p) for p in sorted((FIXTURES / "sessions").glob("*.json"))]


def load_http() -> list[dict[str, Any]]:
    return [load_json(p) for p in sorted((FIXTURES / "http").glob("*.json"))]


def load_frame_cases() -> list[dict[str, Any]]:
    cases = []
    for path in sorted((FIXTURES / "frames").glob("*.json")):
        doc = load_json(path)
        assert doc["format"] == "nsq-frames/1", path
        for case in doc["cases"]:
            cases.append({**case, "file": path.name})
    return cases


def config_kwargs(raw: dict[str, Any]) -> dict[str, Any]:
    """Fixture config -> ConnectionConfig kwargs (the auth secret is stored as text)."""
    kwargs = dict(raw)
    if isinstance(kwargs.get("auth_secret"), str):
        kwargs["auth_secret"] = kwargs["auth_secret"].encode("utf-8")
    return kwargs


def session_config(session: dict[str, Any]) -> ConnectionConfig:
    raw = session["client"]["config"]
    return ConnectionConfig(**config_kwargs(raw)) if raw is not None else ConnectionConfig()


def client_bytes(c2s: dict[str, Any]) -> bytes:
    """What the client wrote: wire bytes, or inside TLS the bytes before encryption."""
    wire = c2s["wire_hex"]
    return bytes.fromhex(wire if wire is not None else c2s["tls_plain_hex"])


def server_bytes(s2c: dict[str, Any]) -> bytes:
    """What receive_data gets: wire bytes, or inside TLS the decrypted bytes."""
    wire = s2c["wire_hex"]
    return bytes.fromhex(wire if wire is not None else s2c["tls_plain_hex"])


def plain_server_stream(session: dict[str, Any]) -> bytes:
    """The server's frame stream (decompressed, decrypted) over the whole session."""
    return b"".join(bytes.fromhex(s["s2c"]["plain_hex"]) for s in session["steps"] if "s2c" in s)


def fixture_frames(session: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for s in session["steps"] if "s2c" in s for f in s["s2c"]["frames"]]


FRAME_TYPE_CODES = {"response": 0, "error": 1, "message": 2}


# --------------------------------------------------------------------------- chunkers


def whole(_index: int, data: bytes) -> list[bytes]:
    return [data] if data else []


def bytewise(_index: int, data: bytes) -> list[bytes]:
    return [data[i : i + 1] for i in range(len(data))]


def split_at(data: bytes, cuts: Sequence[int]) -> list[bytes]:
    points = [0, *sorted(set(cuts)), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(points) if b > a]


# --------------------------------------------------------------------------- client commands


class Unproducible(Exception):
    """A captured client command has no API call of nsq_proto.Connection behind it."""


class ClientMismatch(AssertionError):
    """The connection wrote other bytes than the captured client."""


@dataclass(frozen=True)
class Command:
    name: str
    args: tuple[Any, ...] = ()


class CommandParser:
    """Splits the captured client stream (protocol plaintext) into commands, step by step.

    Deliberately lenient: it only extracts the arguments of the API call; whether the call
    writes exactly the captured bytes is decided by comparing bytes.
    """

    def __init__(self) -> None:
        self._started = False

    def read(self, data: bytes) -> list[Command]:
        try:
            return self._read(data)
        except (IndexError, struct.error, UnicodeDecodeError) as exc:
            raise Unproducible(f"cannot split {data[:40]!r} into commands: {exc}") from exc

    def _read(self, data: bytes) -> list[Command]:
        out: list[Command] = []
        pos = 0
        if not self._started:
            self._started = True
            out.append(Command("MAGIC", (data[:4],)))
            pos = 4
        while pos < len(data):
            nl = data.find(b"\n", pos)
            if nl < 0:
                raise Unproducible(f"unterminated command {data[pos:]!r}")
            tokens = data[pos:nl].split(b" ")
            pos = nl + 1
            name = tokens[0].decode("latin-1")
            args = [t.decode("latin-1") for t in tokens[1:]]
            if name in ("IDENTIFY", "AUTH", "PUB", "DPUB", "MPUB"):
                (size,) = struct.unpack_from(">I", data, pos)
                body = data[pos + 4 : pos + 4 + size]
                pos += 4 + size
                if name == "MPUB":
                    out.append(Command(name, (args[0], split_mpub(body))))
                else:
                    out.append(Command(name, (*args, body)))
            elif name in ("FIN", "TOUCH", "REQ"):
                out.append(Command(name, (tokens[1], *args[1:])))
            elif name in ("SUB", "RDY", "NOP", "CLS"):
                out.append(Command(name, tuple(args)))
            else:
                raise Unproducible(f"no API call sends {tokens[0]!r}")
        return out


def split_mpub(body: bytes) -> list[bytes]:
    (count,) = struct.unpack_from(">I", body)
    items, pos = [], 4
    for _ in range(count):
        (size,) = struct.unpack_from(">I", body, pos)
        items.append(body[pos + 4 : pos + 4 + size])
        pos += 4 + size
    return items


def call_api(conn: Connection, cmd: Command) -> None:
    """The Connection method call that corresponds to one captured client command."""
    name, args = cmd.name, cmd.args
    try:
        if name == "SUB":
            (topic, channel) = args
            conn.subscribe(topic, channel)
        elif name == "RDY":
            (count,) = args
            conn.rdy(int(count))
        elif name == "FIN":
            conn.finish(args[0])
        elif name == "TOUCH":
            conn.touch(args[0])
        elif name == "REQ":
            msg_id, delay_ms = args
            conn.requeue(msg_id, int(delay_ms) / 1000)
        elif name == "NOP":
            conn.nop()
        elif name == "CLS":
            conn.start_close()
        elif name == "PUB":
            topic, body = args
            conn.publish(topic, body)
        elif name == "MPUB":
            topic, bodies = args
            conn.publish_many(topic, bodies)
        elif name == "DPUB":
            topic, delay_ms, body = args
            conn.publish_deferred(topic, body, int(delay_ms) / 1000)
        else:
            raise Unproducible(f"no API call sends {name}")
    except (ValueError, TypeError) as exc:  # arguments our API cannot even express
        raise Unproducible(f"{name} {args!r}: {exc}") from exc


# --------------------------------------------------------------------------- normalising


def features_summary(features: NegotiatedFeatures) -> dict[str, Any]:
    return {
        "negotiated": features.negotiated,
        "raw": features.raw,
        "max_rdy_count": features.max_rdy_count,
        "version": features.version,
        "max_msg_timeout": features.max_msg_timeout,
        "msg_timeout": features.msg_timeout,
        "tls_v1": features.tls_v1,
        "snappy": features.snappy,
        "deflate": features.deflate,
        "deflate_level": features.deflate_level,
        "max_deflate_level": features.max_deflate_level,
        "auth_required": features.auth_required,
        "sample_rate": features.sample_rate,
        "output_buffer_size": features.output_buffer_size,
        "output_buffer_timeout": features.output_buffer_timeout,
        "partitioned": features.partitioned,
    }


def expected_features(obj: dict[str, Any] | None) -> dict[str, Any]:
    """What the IDENTIFY response ``obj`` (None: a bare OK) says, in NegotiatedFeatures terms."""
    j = obj or {}

    def seconds(key: str) -> float | None:
        return None if key not in j else j[key] / 1000

    version = j.get("version")
    return {
        "negotiated": obj is not None,
        "raw": j,
        "max_rdy_count": j.get("max_rdy_count", DEFAULT_MAX_RDY_COUNT),
        "version": version,
        "max_msg_timeout": seconds("max_msg_timeout"),
        "msg_timeout": seconds("msg_timeout"),
        "tls_v1": j.get("tls_v1", False),
        "snappy": j.get("snappy", False),
        "deflate": j.get("deflate", False),
        "deflate_level": j.get("deflate_level", 0),
        "max_deflate_level": j.get("max_deflate_level"),
        "auth_required": j.get("auth_required", False),
        "sample_rate": j.get("sample_rate", 0),
        "output_buffer_size": j.get("output_buffer_size"),
        "output_buffer_timeout": seconds("output_buffer_timeout"),
        "partitioned": version is not None and "-HA." in version,
    }


def _error_info(error: BaseException | None) -> tuple[str | None, str | None]:
    if error is None:
        return None, None
    return type(error).__name__, getattr(error, "code", None)


def normalise(out: Output) -> Normalised:
    """One non-Send output as a comparable tuple."""
    if isinstance(out, Ready):
        auth = out.auth
        auth_t = None if auth is None else (auth.identity, auth.identity_url, auth.permission_count)
        return ("Ready", features_summary(out.features), auth_t)
    if isinstance(out, Subscribed):
        return ("Subscribed",)
    if isinstance(out, MessageReceived):
        m = out.message
        return (
            "MessageReceived",
            m.id.hex(),
            m.timestamp,
            m.attempts,
            m.body.hex(),
            (m.trace_id, m.internal_id, m.ext_version, m.ext_data, m.queue_offset, m.raw_size),
        )
    if isinstance(out, HeartbeatReceived):
        return ("HeartbeatReceived",)
    if isinstance(out, PublishSucceeded):
        return ("PublishSucceeded", out.request_id, out.receipt)
    if isinstance(out, PublishFailed):
        return ("PublishFailed", out.request_id, *_error_info(out.error))
    if isinstance(out, ErrorReceived):
        return ("ErrorReceived", out.code, out.text, out.fatal)
    if isinstance(out, CloseWaitReceived):
        return ("CloseWaitReceived",)
    if isinstance(out, ConnectionClosed):
        return ("ConnectionClosed", *_error_info(out.error))
    if isinstance(out, Close):
        return ("Close",)
    if isinstance(out, StartTLS):
        return ("StartTLS", out.buffered.hex())
    raise AssertionError(f"unexpected output {out!r}")


# --------------------------------------------------------------------------- replay


def _drain(conn: Connection, produced: bytearray) -> list[Normalised]:
    result = []
    for out in conn.outputs():
        if isinstance(out, Send):
            produced += out.data
        else:
            result.append(normalise(out))
    return result


def replay(session: dict[str, Any], chunker: Chunker = whole) -> list[list[Normalised]]:
    """Drive a Connection through ``session``; element 0 is what connection_made emitted,
    element i+1 what step i emitted.  Raises ClientMismatch, Unproducible or the API's own
    LocalProtocolError/ConfigError when the client cannot reproduce the captured client side."""
    conn = Connection(session_config(session))
    steps = session["steps"]
    parser = CommandParser()
    produced = bytearray()
    auto_nops = 0
    now = 0.0
    conn.connection_made(now)
    log = [_drain(conn, produced)]
    for index, step in enumerate(steps):
        if "tls_handshake" in step:
            conn.tls_established(now)
            log.append(_drain(conn, produced))
        elif "c2s" in step:
            c2s = step["c2s"]
            now = c2s["t_ms"] / 1000
            conn.handle_timer(now)
            for cmd in parser.read(bytes.fromhex(c2s["plain_hex"])):
                if cmd.name in ("MAGIC", "IDENTIFY", "AUTH"):
                    continue  # the connection writes these by itself
                if cmd.name == "NOP" and auto_nops:
                    auto_nops -= 1  # the automatic answer to a heartbeat
                    continue
                call_api(conn, cmd)
            log.append(_drain(conn, produced))
            want = client_bytes(c2s)
            got = bytes(produced[: len(want)])
            if got != want:
                raise ClientMismatch(
                    f"step {index}: the client wrote {got.hex()} where the capture has {want.hex()}"
                )
            del produced[: len(want)]
        else:
            s2c = step["s2c"]
            now = s2c["t_ms"] / 1000
            conn.handle_timer(now)
            data = server_bytes(s2c)
            if data and produced:
                raise ClientMismatch(
                    f"step {index}: the client wrote {bytes(produced).hex()} before the server "
                    "answered; the capture has nothing there"
                )
            for chunk in chunker(index, data):
                conn.receive_data(chunk, now)
            if s2c["closed"]:
                conn.connection_lost(now)
            outs = _drain(conn, produced)
            auto_nops += sum(1 for o in outs if o[0] == "HeartbeatReceived")
            log.append(outs)
    if produced:
        raise ClientMismatch(f"the client wrote {bytes(produced).hex()} the capture does not have")
    return log


# --------------------------------------------------------------------------- expectations


def expected_outputs(session: dict[str, Any]) -> list[list[Normalised]]:
    """What a correct client emits for ``session``, derived from the fixture alone.

    An error frame counts as fatal exactly when nsqd closed the connection right after it (it
    is the last frame of a window in which EOF was read).
    """
    parser = CommandParser()
    phase = "identify"
    identify: dict[str, Any] | None = None
    pending: deque[tuple[str, int]] = deque()
    next_request = 1
    closed = False
    close_wait = False
    log: list[list[Normalised]] = [[]]

    def fail_pending(first_error: tuple[str, str | None]) -> list[Normalised]:
        out: list[Normalised] = []
        for i, (kind, rid) in enumerate(pending):
            if kind == "PUB":
                err = first_error if i == 0 else ("ConnectionClosedError", None)
                out.append(("PublishFailed", rid, *err))
        pending.clear()
        return out

    def handshake_done(out: list[Normalised], auth: Normalised | None) -> str:
        features = expected_features(identify)
        if features["auth_required"] and auth is None:
            return "auth"
        out.append(("Ready", features, auth))
        return "open"

    for step in session["steps"]:
        out: list[Normalised] = []
        log.append(out)
        if "tls_handshake" in step:
            assert phase == "tls", "a TLS handshake the client did not ask for"
            phase = "tls_response"
            continue
        if "c2s" in step:
            for cmd in parser.read(bytes.fromhex(step["c2s"]["plain_hex"])):
                if cmd.name == "SUB":
                    pending.append(("SUB", 0))
                elif cmd.name in ("PUB", "MPUB", "DPUB"):
                    pending.append(("PUB", next_request))
                    next_request += 1
                elif cmd.name == "CLS":
                    pending.append(("CLS", 0))
            continue
        s2c = step["s2c"]
        frames = s2c["frames"]
        for i, frame in enumerate(frames):
            if closed:
                break
            data = bytes.fromhex(frame["data_hex"])
            if frame["type"] == "error":
                code, _, text = data.decode("utf-8", "replace").partition(" ")
                fatal = s2c["closed"] and i == len(frames) - 1
                out.append(("ErrorReceived", code, text, fatal))
                if fatal:
                    out.extend(fail_pending(("ServerError", code)))
                    out.append(("Close",))
                    out.append(("ConnectionClosed", "ServerError", code))
                    closed = True
                continue
            if frame["type"] == "message":
                m = frame["message"]
                none6 = (None, None, None, None, None, None)
                out.append(
                    (
                        "MessageReceived",
                        m["id_hex"],
                        m["timestamp_ns"],
                        m["attempts"],
                        m["body_hex"],
                        none6,
                    )
                )
                continue
            if frame.get("text") == HEARTBEAT:
                out.append(("HeartbeatReceived",))
                continue
            if phase == "identify":
                identify = frame.get("json")
                features = expected_features(identify)
                if features["tls_v1"]:
                    out.append(("StartTLS", ""))
                    phase = "tls"
                elif features["snappy"] or features["deflate"]:
                    phase = "compression"
                else:
                    phase = handshake_done(out, None)
            elif phase == "tls_response":
                assert frame.get("text") == "OK"
                features = expected_features(identify)
                if features["snappy"] or features["deflate"]:
                    phase = "compression"
                else:
                    phase = handshake_done(out, None)
            elif phase == "compression":
                assert frame.get("text") == "OK"
                phase = handshake_done(out, None)
            elif phase == "auth":
                a = frame["json"]
                phase = handshake_done(
                    out, (a["identity"], a["identity_url"], a["permission_count"])
                )
            else:
                kind, rid = pending.popleft()
                if kind == "SUB":
                    out.append(("Subscribed",))
                elif kind == "PUB":
                    out.append(("PublishSucceeded", rid, None))
                else:
                    out.append(("CloseWaitReceived",))
                    close_wait = True
        if s2c["closed"] and not closed:
            # EOF: orderly only after CLOSE_WAIT with nothing left unanswered
            error = (None, None) if close_wait and not pending else ("ConnectionClosedError", None)
            out.extend(fail_pending(("ConnectionClosedError", None)))
            out.append(("ConnectionClosed", *error))
            closed = True
    return log


def first_identify_body(session: dict[str, Any]) -> bytes | None:
    """The JSON body of the session's IDENTIFY, if the client sent one right after the magic."""
    parser = CommandParser()
    for step in session["steps"]:
        if "c2s" in step:
            try:
                commands = parser.read(bytes.fromhex(step["c2s"]["plain_hex"]))
            except Unproducible:
                return None
            for cmd in commands:
                if cmd.name == "IDENTIFY":
                    body: bytes = cmd.args[-1]
                    return body
                if cmd.name != "MAGIC":
                    return None
    return None


def iter_steps(session: dict[str, Any], kind: str) -> Iterator[tuple[int, dict[str, Any]]]:
    for i, step in enumerate(session["steps"]):
        if kind in step:
            yield i, step[kind]
