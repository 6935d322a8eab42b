"""What the server told us: IDENTIFY response, AUTH response, traced-publish receipt."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import Any

from ._errors import RemoteProtocolError

__all__ = [
    "DEFAULT_MAX_RDY_COUNT",
    "NegotiatedFeatures",
    "AuthResult",
    "TraceReceipt",
    "parse_identify_response",
    "parse_auth_response",
    "parse_trace_receipt",
]

#: what a client assumes when nsqd does not negotiate (the client guide, "nsqd Max RDY Count")
DEFAULT_MAX_RDY_COUNT = 2500


@dataclass(frozen=True, slots=True)
class NegotiatedFeatures:
    """The server's side of IDENTIFY.  Durations are seconds; None means "not said"."""

    max_rdy_count: int = DEFAULT_MAX_RDY_COUNT
    version: str | None = None
    max_msg_timeout: float | None = None
    msg_timeout: float | None = None
    tls_v1: bool = False
    snappy: bool = False
    deflate: bool = False
    deflate_level: int = 0
    max_deflate_level: int | None = None
    auth_required: bool = False
    sample_rate: int = 0
    output_buffer_size: int | None = None
    output_buffer_timeout: float | None = None
    desired_tag: str | None = None
    #: False when nsqd answered a plain ``OK`` (no feature negotiation)
    negotiated: bool = False
    #: the whole JSON object as received
    raw: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def partitioned(self) -> bool:
        """True when the server is the partitioned NSQ extension (version ``x.y.z-HA.a.b.c``)."""
        return self.version is not None and "-HA." in self.version


_INT_KEYS = (
    "max_rdy_count",
    "max_msg_timeout",
    "msg_timeout",
    "deflate_level",
    "max_deflate_level",
    "sample_rate",
    "output_buffer_size",
    "output_buffer_timeout",
)
_BOOL_KEYS = ("tls_v1", "snappy", "deflate", "auth_required")


#: integers outside this range are refused (a server has no reason to send them, and the
#: conversions to seconds would overflow)
_INT_MIN, _INT_MAX = -(2**63), 2**63 - 1


def _decode_object(data: bytes, what: str) -> dict[str, Any]:
    try:
        obj = json.loads(data)
    except RecursionError as exc:
        raise RemoteProtocolError(f"{what} is JSON nested too deeply") from exc
    except (ValueError, UnicodeDecodeError) as exc:
        raise RemoteProtocolError(f"{what} is not JSON: {data[:80]!r}") from exc
    if not isinstance(obj, dict):
        raise RemoteProtocolError(f"{what} is not a JSON object: {data[:80]!r}")
    return obj


def parse_identify_response(data: bytes) -> NegotiatedFeatures:
    """Parse the response frame to IDENTIFY: ``OK`` or the JSON settings.

    A key that is absent or ``null`` takes its default; a value of the wrong type raises
    :class:`RemoteProtocolError` (and nothing else does)."""
    if data == b"OK":
        return NegotiatedFeatures()
    obj = _decode_object(data, "IDENTIFY response")
    for key in _INT_KEYS:
        value = obj.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise RemoteProtocolError(f"IDENTIFY response: {key} is not an integer: {value!r}")
        if not _INT_MIN <= value <= _INT_MAX:
            raise RemoteProtocolError(f"IDENTIFY response: {key} is out of range")
    for key in _BOOL_KEYS:
        value = obj.get(key)
        if value is not None and not isinstance(value, bool):
            raise RemoteProtocolError(f"IDENTIFY response: {key} is not a boolean: {value!r}")
    for key in ("version", "desired_tag"):
        value = obj.get(key)
        if value is not None and not isinstance(value, str):
            raise RemoteProtocolError(f"IDENTIFY response: {key} is not a string: {value!r}")

    def get(key: str, default: Any) -> Any:
        value = obj.get(key)
        return default if value is None else value

    max_rdy: int = get("max_rdy_count", DEFAULT_MAX_RDY_COUNT)
    if max_rdy < 0:
        raise RemoteProtocolError(f"IDENTIFY response: negative max_rdy_count {max_rdy}")

    def seconds(key: str) -> float | None:
        value = obj.get(key)
        return None if value is None else value / 1000.0

    return NegotiatedFeatures(
        max_rdy_count=max_rdy,
        version=obj.get("version"),
        max_msg_timeout=seconds("max_msg_timeout"),
        msg_timeout=seconds("msg_timeout"),
        tls_v1=get("tls_v1", False),
        snappy=get("snappy", False),
        deflate=get("deflate", False),
        deflate_level=get("deflate_level", 0),
        max_deflate_level=obj.get("max_deflate_level"),
        auth_required=get("auth_required", False),
        sample_rate=get("sample_rate", 0),
        output_buffer_size=obj.get("output_buffer_size"),
        output_buffer_timeout=seconds("output_buffer_timeout"),
        desired_tag=obj.get("desired_tag"),
        negotiated=True,
        raw=obj,
    )


@dataclass(frozen=True, slots=True)
class AuthResult:
    """nsqd's answer to AUTH (what its auth server said of the secret), on :class:`Ready`'s
    ``auth``; an absent or ``null`` field is empty (``""``, 0)."""

    #: who the secret belongs to
    identity: str
    #: a URL about that identity, for people
    identity_url: str
    #: how many topic/channel permissions the secret grants
    permission_count: int


def parse_auth_response(data: bytes) -> AuthResult:
    """Parse the response frame to AUTH: a JSON object with ``identity``, ``identity_url``
    and ``permission_count``.

    An absent or ``null`` field is empty; anything else of the wrong type (or a body that is
    not a JSON object) raises :class:`RemoteProtocolError`."""
    obj = _decode_object(data, "AUTH response")
    identity = obj.get("identity")
    url = obj.get("identity_url")
    count = obj.get("permission_count")
    identity = "" if identity is None else identity
    url = "" if url is None else url
    count = 0 if count is None else count
    if not isinstance(identity, str) or not isinstance(url, str):
        raise RemoteProtocolError("AUTH response: identity and identity_url must be strings")
    if isinstance(count, bool) or not isinstance(count, int):
        raise RemoteProtocolError(f"AUTH response: permission_count is not an integer: {count!r}")
    return AuthResult(identity, url, count)


@dataclass(frozen=True, slots=True)
class TraceReceipt:
    """The 30-byte answer to PUB_TRACE / MPUB_TRACE (partitioned server)."""

    internal_id: int
    trace_id: int
    queue_offset: int
    raw_size: int


_RECEIPT = struct.Struct(">2sQQQI")


def parse_trace_receipt(data: bytes) -> TraceReceipt:
    """Parse the response frame to PUB_TRACE / MPUB_TRACE: ``OK`` and 28 bytes; anything else
    raises :class:`RemoteProtocolError`."""
    if len(data) != _RECEIPT.size or data[:2] != b"OK":
        raise RemoteProtocolError(f"traced publish response is not OK+28 bytes: {data[:40]!r}")
    _, internal_id, trace_id, offset, raw_size = _RECEIPT.unpack(data)
    return TraceReceipt(internal_id, trace_id, offset, raw_size)
