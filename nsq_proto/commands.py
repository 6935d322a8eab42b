"""Encoders for every client command of the TCP protocol, standard and partitioned.

Each function returns the exact bytes to write.  Arguments are validated here, so that a bad
name or size becomes a :class:`LocalProtocolError` at the call site instead of a fatal error
frame and a dropped connection later.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from ._errors import LocalProtocolError
from ._names import check_channel, check_topic

__all__ = [
    "MAGIC_V2",
    "identify",
    "auth",
    "sub",
    "sub_ordered",
    "sub_advanced",
    "pub",
    "mpub",
    "dpub",
    "pub_trace",
    "mpub_trace",
    "pub_ext",
    "mpub_ext",
    "encode_ext_header",
    "rdy",
    "fin",
    "fin_many",
    "req",
    "touch",
    "touch_many",
    "cls",
    "nop",
    "NOP",
    "CLS",
]

#: the four bytes a client sends first: protocol V2
MAGIC_V2: Final = b"  V2"
#: the bytes of :func:`nop` and :func:`cls`
NOP: Final = b"NOP\n"
CLS: Final = b"CLS\n"

_U32: Final = struct.Struct(">I")
_pack_u32: Final = _U32.pack
_U64: Final = struct.Struct(">Q")
_U32_MAX: Final = 0xFFFFFFFF
_U64_MAX: Final = 0xFFFFFFFFFFFFFFFF


def _body(data: bytes) -> bytes:
    """A command's body: its size (u32, big-endian), then ``data``."""
    return _pack_u32(len(data)) + data


def _check_body(body: bytes, what: str = "message body") -> bytes:
    """``body`` as ``bytes``: LocalProtocolError unless it is non-empty bytes-like data."""
    if not isinstance(body, bytes | bytearray | memoryview):
        raise LocalProtocolError(f"{what} must be bytes, not {type(body).__name__}")
    body = bytes(body)
    if not body:
        raise LocalProtocolError(f"{what} must not be empty (nsqd refuses empty messages)")
    return body


def _partition_suffix(partition: int | None) -> bytes:
    """`` <partition>`` after a topic (the partitioned server's form), or nothing."""
    if partition is None:
        return b""
    if isinstance(partition, bool) or not isinstance(partition, int) or partition < 0:
        raise LocalProtocolError(f"partition must be a non-negative int, not {partition!r}")
    return b" %d" % partition


def _check_id(msg_id: bytes) -> bytes:
    """``msg_id``, if it is the 16 bytes of a message id."""
    if not isinstance(msg_id, bytes) or len(msg_id) != 16:
        raise LocalProtocolError(f"a message id is 16 bytes, got {msg_id!r}")
    return msg_id


def _check_trace_id(trace_id: int) -> int:
    """``trace_id``, if it is an unsigned 64-bit int (not a bool)."""
    if isinstance(trace_id, bool) or not isinstance(trace_id, int) or not 0 <= trace_id <= _U64_MAX:
        raise LocalProtocolError(f"trace id must be an unsigned 64-bit int, not {trace_id!r}")
    return trace_id


def identify(body: Mapping[str, Any]) -> bytes:
    """``IDENTIFY\\n`` + size + compact JSON (keys in the given order)."""
    data = json.dumps(dict(body), separators=(",", ":")).encode()
    return b"IDENTIFY\n" + _body(data)


def auth(secret: bytes | str) -> bytes:
    """AUTH with ``secret`` (a str is sent as UTF-8), after IDENTIFY said auth_required."""
    if isinstance(secret, str):
        secret = secret.encode()
    if not secret:
        raise LocalProtocolError("AUTH secret must not be empty")
    return b"AUTH\n" + _body(bytes(secret))


def _sub(name: bytes, topic: str, channel: str, partition: int | None) -> bytes:
    """``name topic channel [partition]\\n``: the line of every form of SUB."""
    check_topic(topic)
    check_channel(channel)
    return b"%s %s %s%s\n" % (name, topic.encode(), channel.encode(), _partition_suffix(partition))


def sub(topic: str, channel: str, partition: int | None = None) -> bytes:
    """SUB to ``topic``/``channel`` (the partitioned server: of one ``partition``)."""
    return _sub(b"SUB", topic, channel, partition)


def sub_ordered(topic: str, channel: str, partition: int | None = None) -> bytes:
    """Ordered subscription of the partitioned server (the command is ``SUB_ORDERED``)."""
    return _sub(b"SUB_ORDERED", topic, channel, partition)


def sub_advanced(topic: str, channel: str, partition: int | None = None) -> bytes:
    """``SUB_ADVANCED`` without a start position: normal delivery with queue positions."""
    return _sub(b"SUB_ADVANCED", topic, channel, partition)


def pub(topic: str, body: bytes, partition: int | None = None) -> bytes:
    """PUB one ``body`` to ``topic`` (the partitioned server: to one ``partition``)."""
    check_topic(topic)
    body = _check_body(body)
    return b"PUB %s%s\n" % (topic.encode(), _partition_suffix(partition)) + _body(body)


def _mpub_payload(items: Sequence[bytes]) -> bytes:
    """The body of an MPUB-like command: the count (u32), then each item's size (u32) and
    bytes."""
    first = len(items[0])
    for item in items:
        if len(item) != first:
            break
    else:
        # every message has the same size: one shared size prefix (a common batch shape)
        prefix = _pack_u32(first)
        return _pack_u32(len(items)) + prefix + prefix.join(items)
    parts = [_pack_u32(len(items))]
    for item in items:
        parts.append(_pack_u32(len(item)))
        parts.append(item)
    return b"".join(parts)


def mpub(topic: str, bodies: Iterable[bytes], partition: int | None = None) -> bytes:
    """MPUB several ``bodies`` to ``topic`` at once (at least one)."""
    check_topic(topic)
    items = [_check_body(b) for b in bodies]
    if not items:
        raise LocalProtocolError("MPUB needs at least one message")
    return b"MPUB %s%s\n" % (topic.encode(), _partition_suffix(partition)) + _body(
        _mpub_payload(items)
    )


def pub_unchecked(topic: str, body: bytes, partition: int | None = None) -> bytes:
    """PUB for a topic and a non-empty ``bytes`` body the caller has already validated."""
    return b"PUB %s%s\n" % (topic.encode(), _partition_suffix(partition)) + _body(body)


def mpub_unchecked(topic: str, bodies: Sequence[bytes], partition: int | None = None) -> bytes:
    """MPUB for a topic and non-empty ``bytes`` bodies the caller has already validated."""
    return b"MPUB %s%s\n" % (topic.encode(), _partition_suffix(partition)) + _body(
        _mpub_payload(bodies)
    )


def dpub(topic: str, delay_ms: int, body: bytes) -> bytes:
    """DPUB: ``body`` to ``topic``, delivered after ``delay_ms`` milliseconds."""
    check_topic(topic)
    body = _check_body(body)
    if isinstance(delay_ms, bool) or not isinstance(delay_ms, int) or delay_ms < 0:
        raise LocalProtocolError(f"DPUB delay must be a non-negative int of ms, not {delay_ms!r}")
    return b"DPUB %s %d\n" % (topic.encode(), delay_ms) + _body(body)


def pub_trace(topic: str, trace_id: int, body: bytes, partition: int | None = None) -> bytes:
    """``PUB_TRACE``: the body is prefixed with the 8-byte trace id (counted in the size)."""
    check_topic(topic)
    body = _check_body(body)
    payload = _U64.pack(_check_trace_id(trace_id)) + body
    return b"PUB_TRACE %s%s\n" % (topic.encode(), _partition_suffix(partition)) + _body(payload)


def mpub_trace(
    topic: str, items: Iterable[tuple[int, bytes]], partition: int | None = None
) -> bytes:
    """MPUB_TRACE (partitioned server): ``(trace_id, body)`` pairs to ``topic``."""
    check_topic(topic)
    parts = [_U64.pack(_check_trace_id(t)) + _check_body(b) for t, b in items]
    if not parts:
        raise LocalProtocolError("MPUB_TRACE needs at least one message")
    return b"MPUB_TRACE %s%s\n" % (topic.encode(), _partition_suffix(partition)) + _body(
        _mpub_payload(parts)
    )


_U16: Final = struct.Struct(">H")
_EXT_MAX: Final = 65534


def encode_ext_header(header: Mapping[str, Any] | bytes) -> bytes:
    """The JSON header of PUB_EXT: a mapping (compact JSON) or ready JSON bytes."""
    if isinstance(header, bytes):
        data = header
    else:
        data = json.dumps(dict(header), separators=(",", ":")).encode()
    if not data or len(data) > _EXT_MAX:
        raise LocalProtocolError(f"an extension header is 1..{_EXT_MAX} bytes of JSON")
    return data


def pub_ext(
    topic: str, body: bytes, header: Mapping[str, Any] | bytes, partition: int | None = None
) -> bytes:
    """``PUB_EXT`` (partitioned server): ``size | json_len:u16 | json | body``.  nsqd answers
    with the traced receipt when the header has ``##trace_id``, else ``OK``."""
    check_topic(topic)
    body = _check_body(body)
    ext = encode_ext_header(header)
    payload = _U16.pack(len(ext)) + ext + body
    return b"PUB_EXT %s%s\n" % (topic.encode(), _partition_suffix(partition)) + _body(payload)


def mpub_ext(
    topic: str,
    items: Iterable[tuple[Mapping[str, Any] | bytes, bytes]],
    partition: int | None = None,
) -> bytes:
    """``MPUB_EXT``: each message ``json_len:u16 | json | body``; always answered ``OK``."""
    check_topic(topic)
    parts = []
    for header, body in items:
        ext = encode_ext_header(header)
        parts.append(_U16.pack(len(ext)) + ext + _check_body(body))
    if not parts:
        raise LocalProtocolError("MPUB_EXT needs at least one message")
    return b"MPUB_EXT %s%s\n" % (topic.encode(), _partition_suffix(partition)) + _body(
        _mpub_payload(parts)
    )


def rdy(count: int) -> bytes:
    """RDY: nsqd may have ``count`` messages in flight on this connection."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise LocalProtocolError(f"RDY count must be a non-negative int, not {count!r}")
    return b"RDY %d\n" % count


def fin(msg_id: bytes) -> bytes:
    """FIN: the message ``msg_id`` is done."""
    return b"FIN " + _check_id(msg_id) + b"\n"


def fin_many(msg_ids: Sequence[bytes]) -> bytes:
    """``FIN`` of each id, one command after the other."""
    for msg_id in msg_ids:
        if not isinstance(msg_id, bytes) or len(msg_id) != 16:  # (the check, inline)
            _check_id(msg_id)
    return b"FIN " + b"\nFIN ".join(msg_ids) + b"\n" if msg_ids else b""


def req(msg_id: bytes, delay_ms: int = 0) -> bytes:
    """REQ: deliver ``msg_id`` again, after ``delay_ms`` milliseconds."""
    if isinstance(delay_ms, bool) or not isinstance(delay_ms, int) or delay_ms < 0:
        raise LocalProtocolError(f"REQ delay must be a non-negative int of ms, not {delay_ms!r}")
    return b"REQ " + _check_id(msg_id) + b" %d\n" % delay_ms


def touch(msg_id: bytes) -> bytes:
    """TOUCH: restart nsqd's timeout of ``msg_id``."""
    return b"TOUCH " + _check_id(msg_id) + b"\n"


def touch_many(msg_ids: Sequence[bytes]) -> bytes:
    """``TOUCH`` of each id, one command after the other."""
    for msg_id in msg_ids:
        _check_id(msg_id)
    return b"TOUCH " + b"\nTOUCH ".join(msg_ids) + b"\n" if msg_ids else b""


def cls() -> bytes:
    """CLS: send no more messages (nsqd answers CLOSE_WAIT)."""
    return CLS


def nop() -> bytes:
    """NOP: the answer to a heartbeat."""
    return NOP
