"""IDENTIFY and AUTH: what a client negotiates before it consumes or publishes.

:func:`decode_identify` reads the IDENTIFY body as Go's ``json.Unmarshal`` reads it into
nsqd's struct; :class:`NegotiationCommands` applies it (heartbeat, output buffer, sample
rate, message timeout, the partitioned server's extensions), answers with the negotiated
settings and upgrades the connection to TLS, snappy or deflate; AUTH asks the
:data:`~._options.Authorizer`.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from typing import Any

from nsq_proto.wire import OK, DeflateCodec, FrameType, SnappyCodec

from ._conn_core import ConnectionCore, Handler
from ._util import go_json
from ._wire import AWAIT_TLS, ClientError, ClientState, GoBufWriter, Proto, Read, fatal

__all__ = ["IdentifyData", "NegotiationCommands", "decode_identify"]


@dataclass(slots=True)
class IdentifyData:
    """The IDENTIFY body as nsqd's struct decodes it (missing keys are zero values)."""

    client_id: str = ""
    hostname: str = ""
    heartbeat_interval: int = 0
    output_buffer_size: int = 0
    output_buffer_timeout: int = 0
    feature_negotiation: bool = False
    tls_v1: bool = False
    deflate: bool = False
    deflate_level: int = 0
    snappy: bool = False
    sample_rate: int = 0
    user_agent: str = ""
    msg_timeout: int = 0
    # partitioned server
    short_id: str = ""
    long_id: str = ""
    desired_tag: str = ""
    extend_support: bool = False
    ext_filter: Any = None


_I64 = (-(1 << 63), (1 << 63) - 1)
_I32 = (-(1 << 31), (1 << 31) - 1)
_IDENTIFY_FIELDS: dict[str, tuple[str, tuple[int, int] | None]] = {
    "client_id": ("str", None),
    "hostname": ("str", None),
    "heartbeat_interval": ("int", _I64),
    "output_buffer_size": ("int", _I64),
    "output_buffer_timeout": ("int", _I64),
    "feature_negotiation": ("bool", None),
    "tls_v1": ("bool", None),
    "deflate": ("bool", None),
    "deflate_level": ("int", _I64),
    "snappy": ("bool", None),
    "sample_rate": ("int", _I32),
    "user_agent": ("str", None),
    "msg_timeout": ("int", _I64),
}
_PARTITIONED_FIELDS: dict[str, tuple[str, tuple[int, int] | None]] = {
    **_IDENTIFY_FIELDS,
    "short_id": ("str", None),
    "long_id": ("str", None),
    "desired_tag": ("str", None),
    "extend_support": ("bool", None),
    "ext_filter": ("object", None),
}


class _IntLiteral(int):
    """An integer parsed from a JSON number written without fraction or exponent."""


class _Pairs(list[tuple[str, Any]]):
    """The key/value pairs of a JSON object, in order (duplicates kept)."""


def _reject_constant(name: str) -> Any:
    raise ValueError(f"invalid JSON constant {name}")


def _plain(value: Any) -> Any:
    """A decoded JSON value with objects as dicts (the last of duplicate keys wins, as Go's)."""
    if isinstance(value, _Pairs):
        return {k: _plain(v) for k, v in value}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def decode_identify(body: bytes, *, partitioned: bool = False) -> IdentifyData | None:
    """Decode like Go's ``json.Unmarshal`` into nsqd's identify struct: unknown keys are
    ignored, keys match case-insensitively, ``null`` leaves a field alone, and any type
    mismatch (a quoted number, a float for an int, an out-of-range int) is an error.
    Returns ``None`` on error."""
    fields = _PARTITIONED_FIELDS if partitioned else _IDENTIFY_FIELDS
    try:
        text = body.decode("utf-8", "replace")
        obj = json.loads(
            text,
            parse_int=_IntLiteral,
            parse_float=float,
            parse_constant=_reject_constant,
            object_pairs_hook=_Pairs,
        )
    except (ValueError, RecursionError):
        return None
    if obj is None:
        return IdentifyData()
    if not isinstance(obj, _Pairs):
        return None  # not an object: json: cannot unmarshal array/number/... into struct
    result = IdentifyData()
    ok = True
    lowered = {name.lower(): name for name in fields}
    for key, value in obj:
        name = key if key in fields else lowered.get(key.lower())
        if name is None or value is None:
            continue
        kind, bounds = fields[name]
        converted = _field_value(kind, bounds, value)
        if converted is _MISMATCH:
            ok = False
        else:
            setattr(result, name, converted)
    return result if ok else None


_MISMATCH: Any = object()


def _field_value(kind: str, bounds: tuple[int, int] | None, value: Any) -> Any:
    """The value a struct field of ``kind`` gets from a JSON value, or ``_MISMATCH``."""
    if kind == "str":
        return value if isinstance(value, str) else _MISMATCH
    if kind == "bool":
        return value if isinstance(value, bool) else _MISMATCH
    if kind == "int":
        if isinstance(value, _IntLiteral) and bounds and bounds[0] <= value <= bounds[1]:
            return int(value)
        return _MISMATCH
    # "object"
    return _plain(value) if isinstance(value, _Pairs) else _MISMATCH


class ServerDeflate:
    """Raw DEFLATE for the levels :class:`DeflateCodec` refuses (0, Go's -1 and -2)."""

    def __init__(self, level: int) -> None:
        if level == -2:
            self._c = zlib.compressobj(6, zlib.DEFLATED, -15, 8, zlib.Z_HUFFMAN_ONLY)
        else:
            self._c = zlib.compressobj(6 if level == -1 else level, zlib.DEFLATED, -15)
        self._d = zlib.decompressobj(-15)

    def compress(self, data: bytes) -> bytes:
        return self._c.compress(data) + self._c.flush(zlib.Z_SYNC_FLUSH)

    def decompress(self, data: bytes) -> bytes:
        return self._d.decompress(data)


class NegotiationCommands(ConnectionCore):
    """The IDENTIFY and AUTH commands of a connection."""

    def _negotiation_commands(self) -> dict[bytes, Handler]:
        return {b"IDENTIFY": self._identify, b"AUTH": self._auth}

    def _identify(self, params: list[bytes]) -> Proto:
        opts = self._node.options
        if self.state != ClientState.INIT:
            raise fatal("E_INVALID", "cannot IDENTIFY in current state")
        size = yield from self._read_len(fatal("E_BAD_BODY", "IDENTIFY failed to read body size"))
        if size > opts.max_body_size:
            raise fatal("E_BAD_BODY", f"IDENTIFY body too big {size} > {opts.max_body_size}")
        if size <= 0:
            raise fatal("E_BAD_BODY", f"IDENTIFY invalid body size {size}")
        body = yield Read(size, fatal("E_BAD_BODY", "IDENTIFY failed to read body"))
        data = decode_identify(body, partitioned=self.partitioned)
        if data is None:
            raise fatal("E_BAD_BODY", "IDENTIFY failed to decode JSON body")
        problem = self._apply_identify(data)
        if problem is not None:
            raise fatal("E_BAD_BODY", "IDENTIFY " + problem)
        if not data.feature_negotiation:
            return OK
        return (yield from self._negotiate_features(data))

    def _negotiate_features(self, data: IdentifyData) -> Proto:
        """Answer with the negotiated settings, then upgrade: TLS, then snappy or deflate
        (each upgrade is confirmed by an ``OK`` sent through it)."""
        opts = self._node.options
        tls = opts.tls and data.tls_v1
        deflate = opts.deflate and data.deflate
        level = self._deflate_level(deflate, data.deflate_level)
        snappy = opts.snappy and data.snappy
        if deflate and snappy:
            raise fatal("E_IDENTIFY_FAILED", "cannot enable both deflate and snappy compression")
        self._send_frame(
            FrameType.RESPONSE, go_json(self._identify_response(tls, deflate, level, snappy))
        )
        if tls:
            self._trailing += self._rbuf
            self._rbuf.clear()
            self._tls_deadline = self._now + opts.tls_handshake_timeout
            yield AWAIT_TLS
            self._send_frame(FrameType.RESPONSE, OK)
        if snappy:
            self._upgrade_output(SnappyCodec())
            self.snappy = True
            self._upgrade_input(SnappyCodec())
            self._send_frame(FrameType.RESPONSE, OK)
        if deflate:
            codec = self._make_deflate(level)
            if isinstance(codec, ClientError):
                raise codec
            self._upgrade_output(codec)
            self.deflate = True
            self.deflate_level = level
            self._upgrade_input(self._make_deflate(level))
            self._send_frame(FrameType.RESPONSE, OK)
        return None

    def _upgrade_output(self, codec: Any) -> None:
        """What was written so far goes out as is; from now on output goes through
        ``codec``, behind a new writer."""
        self._writer.flush()
        self._codec = codec
        self._writer = GoBufWriter(self.output_buffer_size, self._sink)

    def _deflate_level(self, deflate: bool, asked: int) -> int:
        level = 6
        if deflate and asked > 0:
            level = asked
        return min(level, self._node.options.max_deflate_level)

    def _make_deflate(self, level: int) -> Any:
        if 1 <= level <= 9:
            return DeflateCodec(level)
        if -2 <= level <= 0:
            return ServerDeflate(level)
        return fatal(
            "E_IDENTIFY_FAILED",
            f"IDENTIFY failed flate: invalid compression level {level}: want value in range [-2, 9]",
        )

    def _identify_response(
        self, tls: bool, deflate: bool, level: int, snappy: bool
    ) -> dict[str, Any]:
        opts = self._node.options
        return {
            "max_rdy_count": opts.max_rdy_count,
            "version": opts.server_version,
            "max_msg_timeout": round(opts.max_msg_timeout * 1000),
            "msg_timeout": round(self.msg_timeout * 1000),
            "tls_v1": tls,
            "deflate": deflate,
            "deflate_level": level,
            "max_deflate_level": opts.max_deflate_level,
            "snappy": snappy,
            "sample_rate": self.sample_rate,
            "auth_required": opts.auth_enabled,
            "output_buffer_size": self.output_buffer_size,
            "output_buffer_timeout": round(self.output_buffer_timeout * 1000),
        }

    def _apply_identify(self, data: IdentifyData) -> str | None:
        """nsqd's ``clientV2.Identify``: returns the error text, or None."""
        opts = self._node.options
        self._apply_names(data)
        hb = data.heartbeat_interval
        if hb == -1:
            self.heartbeat_interval = 0.0
        elif hb == 0:
            pass
        elif 1000 <= hb <= int(opts.max_heartbeat_interval * 1000):
            self.heartbeat_interval = hb / 1000.0
        else:
            return f"heartbeat interval ({hb}) is invalid"
        problem = self._apply_output_buffer(data.output_buffer_size, data.output_buffer_timeout)
        if problem is not None:
            return problem
        if not 0 <= data.sample_rate <= 99:
            return f"sample rate ({data.sample_rate}) is invalid"
        self.sample_rate = data.sample_rate
        mt = data.msg_timeout
        if mt == 0:
            pass
        elif 1000 <= mt <= int(opts.max_msg_timeout * 1000):
            self.msg_timeout = mt / 1000.0
        else:
            return f"msg timeout ({mt}) is invalid"
        problem = self._apply_extensions(data)
        if problem is not None:
            return problem
        self._identify_event()
        return None

    def _apply_names(self, data: IdentifyData) -> None:
        self.client_id = data.client_id
        self.hostname = data.hostname
        self.user_agent = data.user_agent

    def _apply_extensions(self, data: IdentifyData) -> str | None:
        """IDENTIFY keys of the partitioned server (none on standard nsqd)."""
        return None

    def _apply_output_buffer(self, size: int, timeout: int) -> str | None:
        opts = self._node.options
        if timeout == -1:
            self.output_buffer_timeout = 0.0
        elif timeout == 0:
            pass
        elif (
            int(opts.min_output_buffer_timeout * 1000)
            <= timeout
            <= int(opts.max_output_buffer_timeout * 1000)
        ):
            self.output_buffer_timeout = timeout / 1000.0
        else:
            return f"output buffer timeout ({timeout}) is invalid"
        if size == -1:
            self.output_buffer_size = 1
            self.output_buffer_timeout = 0.0
        elif size == 0:
            pass
        elif 64 <= size <= opts.max_output_buffer_size:
            self.output_buffer_size = size
        else:
            return f"output buffer size ({size}) is invalid"
        if size != 0:
            self.flush()
            self._writer = GoBufWriter(self.output_buffer_size, self._sink)
        return None

    def _identify_event(self) -> None:
        """The message pump reads the first IDENTIFY only (heartbeat ticker, sampling,
        message timeout); later IDENTIFYs change the connection but not the pump."""
        if self._identified:
            return
        self._identified = True
        self._pump_heartbeat = self.heartbeat_interval
        self._hb_next = self._now + self.heartbeat_interval if self.heartbeat_interval > 0 else None
        if self.sample_rate > 0:
            self._pump_sample_rate = self.sample_rate
        self._pump_msg_timeout = self.msg_timeout

    # -- AUTH -----------------------------------------------------------------------------------

    def _auth(self, params: list[bytes]) -> Proto:
        opts = self._node.options
        if self.state != ClientState.INIT:
            raise fatal("E_INVALID", "cannot AUTH in current state")
        if len(params) != 1:
            raise fatal("E_INVALID", "AUTH invalid number of parameters")
        size = yield from self._read_len(fatal("E_BAD_BODY", "AUTH failed to read body size"))
        if size > opts.max_body_size:
            raise fatal("E_BAD_BODY", f"AUTH body too big {size} > {opts.max_body_size}")
        if size <= 0:
            raise fatal("E_BAD_BODY", f"AUTH invalid body size {size}")
        body = yield Read(size, fatal("E_BAD_BODY", "AUTH failed to read body"))
        if self.has_authorizations():
            raise fatal("E_INVALID", self._auth_text("AUTH already set"))
        if not opts.auth_enabled:
            raise fatal("E_AUTH_DISABLED", self._auth_text("AUTH disabled"))
        self._auth_secret = body.decode("utf-8", "surrogateescape")
        if not self._query_auth():
            raise fatal("E_AUTH_FAILED", "AUTH failed")
        if not self.has_authorizations():
            raise fatal("E_UNAUTHORIZED", self._auth_text("AUTH no authorizations found"))
        state = self.auth_state
        assert state is not None
        return go_json(
            {
                "identity": state.identity,
                "identity_url": state.identity_url,
                "permission_count": len(state.authorizations),
            }
        )
