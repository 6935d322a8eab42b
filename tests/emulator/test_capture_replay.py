"""Replay every capture of a real nsqd/nsqlookupd v1.3.0 against the emulator.

The captured client bytes go in (with the captured message ids replaced by the emulator's,
since ids come from the clock), ``now`` advances by the captured ``t_ms``, and the emulator
must answer with exactly the captured server bytes.  Allowed differences: message ids and
timestamps inside message frames, ``Date`` headers, and timing (the emulator's timers fire
exactly on time; nsqd's fire up to one queue-scan interval late, so a frame may be ready
earlier than nsqd sent it, never later than the captured window).  Snappy output is compared
chunk by chunk, byte for byte (a chunk carrying a message is compared after putting the
captured id and timestamp into the emulator's plaintext and compressing it with the same
encoder the emulator uses); deflate output is compared as decompressed plaintext, because
zlib and Go's compress/flate choose different encodings.
"""

from __future__ import annotations

import dataclasses
import json
import re
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import snappy

from nsq_emulator import (
    Authorization,
    AuthRequest,
    AuthState,
    HttpResponse,
    Lookupd,
    Nsqd,
    NsqdConnection,
    NsqdOptions,
)

CAPTURES = Path(__file__).resolve().parents[2].parent / "shared" / "spec" / "captures"

#: captures that are not replayed, with the reason; asserted to be exactly the skipped set
OUT_OF_SCOPE: dict[str, str] = {}

T0 = 1000.0  # emulator time of the capture's t_ms = 0
SETUP_AT = T0 - 10.0
STREAM_ID = b"\xff\x06\x00\x00sNaPpY"


def _capture_files() -> list[Path]:
    if not CAPTURES.is_dir():
        return []
    return sorted(CAPTURES.glob("*.json"))


def _load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _duration(text: str) -> float:
    m = re.fullmatch(r"(\d+)(ms|s|m|h)", text)
    assert m, text
    return int(m.group(1)) * {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}[m.group(2)]


def _port(addr: str) -> int:
    return int(addr.rsplit(":", 1)[1])


class Authd:
    """The capture's auth server behaviour, recording the queries nsqd made."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.behaviour: dict[str, Any] = spec["behaviour"]
        self.requests: list[AuthRequest] = []

    def __call__(self, request: AuthRequest) -> AuthState | None:
        self.requests.append(request)
        answer = self.behaviour.get(request.secret, self.behaviour["anything else"])
        if answer["status"] != 200:
            return None
        body = answer["body"]
        return AuthState(
            identity=body["identity"],
            identity_url=body["identity_url"],
            authorizations=tuple(
                Authorization(a["topic"], tuple(a["channels"]), tuple(a["permissions"]))
                for a in body["authorizations"]
            ),
            ttl=float(body["ttl"]),
        )


def options_for(capture: dict[str, Any], authd: Authd | None) -> NsqdOptions:
    kw: dict[str, Any] = {"hostname": "vm"}
    for flag in capture.get("nsqd_flags", []):
        name, _, value = flag.partition("=")
        if name == "--tcp-address":
            kw["tcp_port"] = _port(value)
        elif name == "--http-address":
            kw["http_port"] = _port(value)
        elif name == "--https-address":
            kw["https_port"] = _port(value)
        elif name == "--broadcast-address":
            kw["broadcast_address"] = value
        elif name in ("--data-path", "--lookupd-tcp-address", "--tls-key"):
            pass
        elif name == "--tls-cert":
            kw["tls"] = True
        elif name == "--tls-required":
            kw["tls_required"] = value == "true"
        elif name == "--max-msg-size":
            kw["max_msg_size"] = int(value)
        elif name == "--max-body-size":
            kw["max_body_size"] = int(value)
        elif name == "--max-req-timeout":
            kw["max_req_timeout"] = _duration(value)
        elif name == "--snappy":
            kw["snappy"] = value == "true"
        elif name == "--auth-http-address":
            assert authd is not None
            kw["auth"] = authd
        else:  # pragma: no cover - a new capture flag needs a mapping here
            raise AssertionError(f"unmapped nsqd flag {flag}")
    return NsqdOptions(**kw)


def _http_parts(raw: str) -> tuple[str, str, list[tuple[str, str]], bytes]:
    head, _, body = raw.partition("\r\n\r\n")
    lines = head.split("\r\n")
    method, target, _ = lines[0].split(" ", 2)
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        name, value = line.split(": ", 1)
        headers.append((name, value))
    return method, target, headers, body.encode("latin-1")


def _without_date(raw: bytes) -> bytes:
    return re.sub(rb"\r\nDate: [^\r]*", b"\r\nDate: <date>", raw)


def _render(resp: HttpResponse, close: bool) -> bytes:
    from nsq_emulator._http import REASONS

    lines = [f"HTTP/1.1 {resp.status} {REASONS[resp.status]}"]
    lines += [f"{k}: {v}" for k, v in resp.headers]
    if close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + resp.body


def run_setup(nsqd: Nsqd, capture: dict[str, Any]) -> None:
    for i, step in enumerate(capture.get("setup", [])):
        method, target, headers, body = _http_parts(step["request"])
        resp = nsqd.handle_http(method, target, headers, body, now=SETUP_AT + i * 0.01)
        assert _without_date(_render(resp, True)) == _without_date(
            step["response"].encode("latin-1")
        )


# -- frame helpers -----------------------------------------------------------------------


def frames(data: bytes) -> list[tuple[int, bytes]]:
    out = []
    pos = 0
    while pos < len(data):
        size, ftype = struct.unpack_from(">ii", data, pos)
        out.append((ftype, data[pos + 8 : pos + 4 + size]))
        pos += 4 + size
    assert pos == len(data), "trailing partial frame"
    return out


def snappy_chunks(data: bytes) -> list[bytes]:
    out = []
    pos = 0
    while pos < len(data):
        length = int.from_bytes(data[pos + 1 : pos + 4], "little")
        out.append(data[pos : pos + 4 + length])
        pos += 4 + length
    assert pos == len(data)
    return out


def snappy_plain(chunk: bytes) -> bytes:
    if chunk[0] == 0xFF:
        return b""
    out: bytes = snappy.StreamDecompressor().decompress(STREAM_ID + chunk)
    return out


def snappy_encode(plain: bytes) -> bytes:
    """The chunk(s) the emulator's snappy encoder writes for one flush of ``plain``."""
    out: bytes = snappy.StreamCompressor().add_chunk(plain)
    assert out.startswith(STREAM_ID)
    return out[len(STREAM_ID) :]


@dataclass
class IdMap:
    """Captured message id <-> emulator message id (and timestamps), learnt in order."""

    ours_by_theirs: dict[bytes, bytes] = field(default_factory=dict)
    theirs_by_ours: dict[bytes, bytes] = field(default_factory=dict)
    ts_theirs_by_ours: dict[bytes, bytes] = field(default_factory=dict)

    def learn(self, ours: bytes, theirs: bytes, ts_ours: bytes, ts_theirs: bytes) -> None:
        assert self.ours_by_theirs.setdefault(theirs, ours) == ours, "id mapping is not 1:1"
        assert self.theirs_by_ours.setdefault(ours, theirs) == theirs, "id mapping is not 1:1"
        self.ts_theirs_by_ours[ts_ours] = ts_theirs

    def to_ours(self, data: bytes) -> bytes:
        for theirs, ours in self.ours_by_theirs.items():
            data = data.replace(theirs, ours)
        return data

    def to_theirs(self, data: bytes) -> bytes:
        for ours, theirs in self.theirs_by_ours.items():
            data = data.replace(ours, theirs)
        for ours, theirs in self.ts_theirs_by_ours.items():
            data = data.replace(ours, theirs)
        return data


def compare_frames(ours: bytes, theirs: bytes, ids: IdMap, where: str) -> None:
    """Frame by frame; message frames may differ in timestamp and id only."""
    a, b = frames(ours), frames(theirs)
    assert [f[0] for f in a] == [f[0] for f in b], f"{where}: frame types {a} != {b}"
    for (ftype, da), (_, db) in zip(a, b, strict=True):
        if ftype == 2:
            assert len(da) == len(db), f"{where}: message frame sizes differ"
            assert da[8:10] == db[8:10], f"{where}: attempts {da[8:10]!r} != {db[8:10]!r}"
            assert da[26:] == db[26:], f"{where}: message bodies differ"
            assert re.fullmatch(rb"[0-9a-f]{16}", da[10:26]), f"{where}: id {da[10:26]!r}"
            ids.learn(da[10:26], db[10:26], da[0:8], db[0:8])
        else:
            assert da == db, f"{where}: {da!r} != {db!r}"


# -- the client side of the capture's compression ----------------------------------------


class ClientView:
    """Decodes what the emulator sends the way the capture's client did: plain frames until
    the IDENTIFY response negotiates compression (after the TLS ``OK`` if TLS is on)."""

    def __init__(self) -> None:
        self.mode = "plain"
        self.pending_switch: str | None = None
        self.wait_tls_ok = False
        self._inflate = zlib.decompressobj(-15)

    def split(self, data: bytes) -> tuple[bytes, bytes]:
        """Return (plain part, compressed part) of one read."""
        if self.mode != "plain":
            return b"", data
        pos = 0
        while pos + 8 <= len(data):
            size, ftype = struct.unpack_from(">ii", data, pos)
            body = data[pos + 8 : pos + 4 + size]
            pos += 4 + size
            if ftype == 0 and body.startswith(b"{") and b'"max_rdy_count"' in body:
                negotiated = json.loads(body)
                comp = (
                    "snappy"
                    if negotiated["snappy"]
                    else "deflate"
                    if negotiated["deflate"]
                    else None
                )
                self.wait_tls_ok = negotiated["tls_v1"]
                if comp and not self.wait_tls_ok:
                    self.mode = comp
                    return data[:pos], data[pos:]
                self.pending_switch = comp
            elif self.wait_tls_ok and ftype == 0 and body == b"OK":
                self.wait_tls_ok = False
                if self.pending_switch:
                    self.mode = self.pending_switch
                    return data[:pos], data[pos:]
        return data, b""

    def inflate(self, data: bytes) -> bytes:
        return self._inflate.decompress(data)


class ClientDeflate:
    def __init__(self) -> None:
        self._c = zlib.compressobj(6, zlib.DEFLATED, -15)

    def compress(self, data: bytes) -> bytes:
        return self._c.compress(data) + self._c.flush(zlib.Z_SYNC_FLUSH)


# -- replay of TCP captures ------------------------------------------------------------------


def _expected_server_bytes(ex: dict[str, Any]) -> tuple[bytes, bytes | None]:
    """(plaintext, wire bytes as the layer below compression carries them)."""
    plain = bytes.fromhex(ex.get("plain_hex") or ex.get("hex") or "")
    if "tls_plain_hex" in ex:
        wire: bytes | None = bytes.fromhex(ex["tls_plain_hex"])
    elif ex.get("hex") is not None:
        wire = bytes.fromhex(ex["hex"])
    else:
        wire = plain
    return plain, wire


def _client_plain(ex: dict[str, Any]) -> bytes:
    return bytes.fromhex(ex.get("plain_hex") or ex.get("hex") or "")


def _client_wire(ex: dict[str, Any]) -> bytes:
    if "tls_plain_hex" in ex:
        return bytes.fromhex(ex["tls_plain_hex"])
    if ex.get("hex") is None:
        return bytes.fromhex(ex["plain_hex"])
    return bytes.fromhex(ex["hex"])


#: captures whose client half-closes (EOF) right before the exchange with this note
_EOF_NOTES = ("after client SHUT_WR",)


#: per capture: when nsqd was started (ms before t=0), for the queue-scan refresh model
_PROCESS_START_MS = {"msg_timeout_new_channel.json": 53.0}


def replay_tcp(capture: dict[str, Any], *, split: bool = False) -> tuple[Nsqd, NsqdConnection]:
    authd = Authd(capture["auth_server"]) if "auth_server" in capture else None
    options = options_for(capture, authd)
    started = _PROCESS_START_MS.get(capture["scenario"] + ".json")
    if started is not None:
        options = dataclasses.replace(options, queue_scan_refresh_interval=5.0)
        nsqd = Nsqd(options, now=T0 - started / 1000.0)
    else:
        nsqd = Nsqd(options, now=SETUP_AT - 1.0)
    run_setup(nsqd, capture)
    conn = nsqd.accept(T0, remote_address="127.0.0.1:41000")
    ids = IdMap()
    view = ClientView()
    tls_info = capture.get("tls")
    deflating: ClientDeflate | None = None
    for index, ex in enumerate(capture["exchanges"]):
        now = T0 + ex["t_ms"] / 1000.0
        where = f"{capture['scenario']}#{index} ({ex['dir']} t={ex['t_ms']})"
        if ex["dir"] == "c2s":
            layer = ex["layer"]
            if "snappy" in layer:
                data = _client_wire(ex)
                plain = _client_plain(ex)
                mapped = ids.to_ours(plain)
                if mapped != plain:
                    has_id = snappy_chunks(data)[0][:1] == b"\xff"
                    data = (STREAM_ID if has_id else b"") + snappy_encode(mapped)
            elif "deflate" in layer:
                if deflating is None:
                    deflating = ClientDeflate()
                data = deflating.compress(ids.to_ours(_client_plain(ex)))
            else:
                data = ids.to_ours(_client_wire(ex) if layer == "plain" else _client_plain(ex))
            if split:
                for i in range(len(data)):
                    conn.receive_data(data[i : i + 1], now)
            else:
                conn.receive_data(data, now)
        else:
            if any(note in ex.get("note", "") for note in _EOF_NOTES):
                conn.receive_data(b"", now)
            check_at = max(now, T0 + ex.get("closed_t_ms", 0.0) / 1000.0)
            nsqd.handle_timer(check_at)
            ours = conn.data_to_send()
            check_server_window(ours, ex, view, ids, where)
            assert conn.closed == bool(ex.get("closed")), f"{where}: closed={conn.closed}"
        if tls_info is not None and index == tls_info["after_exchange_index"]:
            assert conn.tls_requested, f"{where}: no TLS upgrade requested"
            assert conn.take_trailing_data() == b""
            conn.tls_established(T0 + tls_info["handshake_done_t_ms"] / 1000.0)
    assert conn.closed == capture["closed_by_server"]
    if authd is not None:
        check_auth_queries(authd, capture["auth_server"])
    return nsqd, conn


def check_server_window(
    ours: bytes, ex: dict[str, Any], view: ClientView, ids: IdMap, where: str
) -> None:
    plain_expected, wire_expected = _expected_server_bytes(ex)
    head, rest = view.split(ours)
    if view.mode == "plain":
        compare_frames(ours, plain_expected, ids, where)
        assert wire_expected is not None
        assert ids.to_theirs(ours) == wire_expected, f"{where}: wire bytes differ"
        return
    if view.mode == "snappy":
        plain_ours = head + b"".join(snappy_plain(c) for c in snappy_chunks(rest))
        compare_frames(plain_ours, plain_expected, ids, where)
        expected_tail = wire_expected[len(head) :] if wire_expected is not None else b""
        rebuilt = []
        for chunk in snappy_chunks(rest):
            if chunk.startswith(b"\xff"):
                rebuilt.append(chunk)
                continue
            mine = snappy_plain(chunk)
            assert snappy_encode(mine) == chunk, f"{where}: chunk not from the reference encoder"
            rebuilt.append(snappy_encode(ids.to_theirs(mine)))
        assert ids.to_theirs(head) == (wire_expected or b"")[: len(head)]
        assert b"".join(rebuilt) == expected_tail, f"{where}: snappy chunks differ"
        return
    plain_ours = head + view.inflate(rest)
    compare_frames(plain_ours, plain_expected, ids, where)


def check_auth_queries(authd: Authd, spec: dict[str, Any]) -> None:
    got = [(r.secret, r.remote_ip, r.tls, r.common_name) for r in authd.requests]
    want = [
        (
            q["query"]["secret"],
            q["query"]["remote_ip"],
            q["query"]["tls"] == "true",
            q["query"]["common_name"],
        )
        for q in spec.get("requests_received", [])
    ]
    assert got == want


# -- replay of HTTP captures ------------------------------------------------------------------


def replay_http(capture: dict[str, Any]) -> None:
    request_ex = [ex for ex in capture["exchanges"] if ex["dir"] == "c2s"]
    response_ex = [ex for ex in capture["exchanges"] if ex["dir"] == "s2c"]
    assert len(request_ex) == len(response_ex) == 1
    expected = response_ex[0]["text"].encode("latin-1")
    options = options_for(capture, None)
    start = re.search(rb'"start_time":(\d+)', expected)
    if start is not None:
        # put the process start (and the consumer's connect time) in the captured second
        options = dataclasses.replace(options, wall_clock_offset=int(start.group(1)) - T0 + 0.5)
    nsqd = Nsqd(options, now=T0 - 0.4 if start is not None else SETUP_AT - 1.0)
    run_setup(nsqd, capture)
    server: Any
    if capture["server"].startswith("nsqlookupd"):
        lookupd = Lookupd(**lookupd_kwargs(capture))
        remote = re.search(rb'"remote_address":"([^"]+)"', expected)
        lookupd.register(nsqd, remote_address=remote.group(1).decode() if remote else None)
        server = lookupd
    else:
        server = nsqd
        if "consumer_conn_note" in capture:
            open_stats_consumer(nsqd, expected)
    now = T0 + request_ex[0]["t_ms"] / 1000.0
    http = server.http_connection(now)
    http.receive_data(request_ex[0]["text"].encode("latin-1"), now)
    assert _without_date(http.data_to_send()) == _without_date(expected)
    assert http.closed == bool(response_ex[0].get("closed"))


def lookupd_kwargs(capture: dict[str, Any]) -> dict[str, Any]:
    kw: dict[str, Any] = {}
    for flag in capture.get("nsqlookupd_flags", []):
        name, _, value = flag.partition("=")
        if name == "--tcp-address":
            kw["tcp_port"] = _port(value)
        elif name == "--http-address":
            kw["http_port"] = _port(value)
        elif name == "--broadcast-address":
            kw["broadcast_address"] = value
    return kw


def open_stats_consumer(nsqd: Nsqd, expected: bytes) -> NsqdConnection:
    """The consumer connection the stats capture had open (IDENTIFY, SUB t c, RDY 5)."""
    remote = re.search(rb'"clients":\[\{.*?"remote_address":"([^"]+)"', expected)
    assert remote
    ident = json.dumps(
        {
            "client_id": "capture",
            "hostname": "capture-host",
            "heartbeat_interval": 30000,
            "feature_negotiation": True,
            "user_agent": "nsq-capture/1.0",
        },
        separators=(",", ":"),
    ).encode()
    at = T0 - 0.3
    conn = nsqd.accept(at, remote_address=remote.group(1).decode())
    conn.receive_data(b"  V2IDENTIFY\n" + struct.pack(">I", len(ident)) + ident, at)
    conn.receive_data(b"SUB t c\nRDY 5\n", at)
    assert len(frames(conn.data_to_send())) == 4  # JSON, OK, 2 messages
    return conn


def _http_capture(capture: dict[str, Any]) -> bool:
    return any(ex.get("layer") == "http" for ex in capture["exchanges"])


def _ids() -> Iterator[str]:
    for path in _capture_files():
        yield path.name


_SERVERS = ("nsqd v1.3.0", "nsqlookupd v1.3.0")


def skip_reason(name: str) -> str | None:
    """Why a capture is not replayed (None: it is).  Anything but the documented
    out-of-scope list makes :func:`test_out_of_scope_list_is_exact` fail."""
    if name in OUT_OF_SCOPE:
        return OUT_OF_SCOPE[name]
    capture = _load(CAPTURES / name)
    if capture.get("server") not in _SERVERS:
        return f"capture of an unknown server {capture.get('server')!r}"
    return None


@pytest.mark.parametrize("name", list(_ids()))
def test_replay_capture(name: str) -> None:
    reason = skip_reason(name)
    if reason is not None:
        pytest.skip(reason)
    capture = _load(CAPTURES / name)
    if _http_capture(capture):
        replay_http(capture)
    else:
        replay_tcp(capture)


def _plain_tcp(name: str) -> bool:
    capture = _load(CAPTURES / name)
    return not _http_capture(capture) and all(ex["layer"] == "plain" for ex in capture["exchanges"])


@pytest.mark.parametrize("name", [n for n in _ids() if skip_reason(n) is None and _plain_tcp(n)])
def test_replay_capture_byte_by_byte(name: str) -> None:
    """The same replay with every client write split into single bytes."""
    replay_tcp(_load(CAPTURES / name), split=True)


def test_out_of_scope_list_is_exact() -> None:
    if not CAPTURES.is_dir():
        pytest.skip(f"captures not found at {CAPTURES}")
    skipped = {name: reason for name in _ids() if (reason := skip_reason(name)) is not None}
    assert skipped == OUT_OF_SCOPE


def test_captures_present() -> None:
    if not CAPTURES.is_dir():
        print(f"captures directory {CAPTURES} is absent: replay skipped")
        pytest.skip(f"captures not found at {CAPTURES}")
    assert len(_capture_files()) > 100
