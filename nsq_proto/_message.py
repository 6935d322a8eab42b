"""Decoding of message frames (standard and partitioned layouts)."""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, TypeVar, overload

from ._errors import RemoteProtocolError

try:
    from mypy_extensions import mypyc_attr
except ImportError:  # pure Python without mypy's extensions: the attribute only tells mypyc

    def mypyc_attr(*attrs: str, **kwattrs: object) -> object:  # type: ignore[misc]
        return lambda cls: cls


__all__ = [
    "Message",
    "MessageLayout",
    "decode_message",
    "MESSAGE_HEADER_SIZE",
]

#: timestamp:i64 | attempts:u16 | id:16
MESSAGE_HEADER_SIZE: Final = 26
_TS_ATTEMPTS: Final = struct.Struct(">qH")
_unpack_ts_attempts: Final = _TS_ATTEMPTS.unpack_from
_U16: Final = struct.Struct(">H")
_POSITION: Final = struct.Struct(">QI")
_U64: Final = struct.Struct(">Q")


@dataclass(frozen=True, slots=True)
class MessageLayout:
    """Which optional parts a message frame carries on a given connection.

    Standard nsqd never sends any of them.  The partitioned server sends the extension header
    when the client identified ``extend_support`` on an extended topic, and the 12-byte queue
    position after ``SUB_ORDERED``/``SUB_ADVANCED``.
    """

    #: the 16-byte id is ``internal_id:u64 | trace_id:u64`` (partitioned server)
    binary_id: bool = False
    #: ``ext_ver:u8 [ext_len:u16 ext]`` follows the 26-byte header
    ext_header: bool = False
    #: ``queue_offset:u64 | raw_size:u32`` follows (the extension header, if any)
    queue_position: bool = False


STANDARD_LAYOUT: Final = MessageLayout()


# Not frozen on purpose: a frozen dataclass's __init__ costs ~6x more, and a message is built
# for every frame on the hot path.  Treat it as read-only.  Its __init__ is written out (the
# one @dataclass would generate): mypyc compiles it, where a generated one stays Python.  A
# client may subclass it (``nsq_client.Message`` does, adding its answers) and have the
# connections build its class directly: ``message_class`` of ``Consumer`` and ``Connection``.
@mypyc_attr(allow_interpreted_subclasses=True)
@dataclass(slots=True, init=False)
class Message:
    """A message as nsqd delivered it.  ``id`` is opaque: echo it in FIN/REQ/TOUCH."""

    id: bytes
    timestamp: int
    attempts: int
    body: bytes
    #: second half of the id, when the connection speaks the partitioned protocol
    trace_id: int | None = None
    #: first half of the id, when the connection speaks the partitioned protocol
    internal_id: int | None = None
    ext_version: int | None = None
    ext_data: bytes | None = None
    queue_offset: int | None = None
    raw_size: int | None = None

    def __init__(
        self,
        id: bytes,
        timestamp: int,
        attempts: int,
        body: bytes,
        trace_id: int | None = None,
        internal_id: int | None = None,
        ext_version: int | None = None,
        ext_data: bytes | None = None,
        queue_offset: int | None = None,
        raw_size: int | None = None,
    ) -> None:
        self.id = id
        self.timestamp = timestamp
        self.attempts = attempts
        self.body = body
        self.trace_id = trace_id
        self.internal_id = internal_id
        self.ext_version = ext_version
        self.ext_data = ext_data
        self.queue_offset = queue_offset
        self.raw_size = raw_size


M = TypeVar("M", bound=Message)


def builds_by_fields(cls: type[Message]) -> bool:
    """Whether :func:`standard_message` may build a ``cls``: a subclass that keeps
    :class:`Message`'s ``__new__`` and ``__init__`` (``nsq_client.Message`` does)."""
    return cls.__init__ is Message.__init__ and cls.__new__ is Message.__new__


def standard_message(
    new: Callable[[type[M]], M], cls: type[M], id: bytes, timestamp: int, attempts: int, body: bytes
) -> M:
    """``cls(id, timestamp, attempts, body)`` for a ``cls`` that :func:`builds_by_fields`,
    built field by field (``new`` is ``cls.__new__``, looked up once by the caller):
    compiled, this skips the generic parsing of the arguments of a call to a Python
    subclass (a client's message class)."""
    message = new(cls)
    message.id = id
    message.timestamp = timestamp
    message.attempts = attempts
    message.body = body
    message.trace_id = None
    message.internal_id = None
    message.ext_version = None
    message.ext_data = None
    message.queue_offset = None
    message.raw_size = None
    return message


@overload
def decode_message(data: bytes, layout: MessageLayout = STANDARD_LAYOUT) -> Message: ...


@overload
def decode_message(data: bytes, layout: MessageLayout, cls: type[M]) -> M: ...


@overload
def decode_message(data: bytes, layout: MessageLayout = STANDARD_LAYOUT, *, cls: type[M]) -> M: ...


def decode_message(
    data: bytes, layout: MessageLayout = STANDARD_LAYOUT, cls: type[Message] = Message
) -> Message:
    """Decode the data of a message frame into a ``cls`` (a :class:`Message` or a subclass
    of it); a truncated frame is a :class:`RemoteProtocolError`."""
    if len(data) < MESSAGE_HEADER_SIZE:
        raise RemoteProtocolError(
            f"message frame of {len(data)} bytes is shorter than the {MESSAGE_HEADER_SIZE}-byte header"
        )
    timestamp: int
    attempts: int
    timestamp, attempts = _unpack_ts_attempts(data)
    msg_id = data[10:26]
    if layout is STANDARD_LAYOUT:
        return cls(msg_id, timestamp, attempts, data[26:])
    pos = 26
    ext_version: int | None = None
    ext_data: bytes | None = None
    queue_offset: int | None = None
    raw_size: int | None = None
    if layout.ext_header:
        if len(data) < pos + 1:
            raise RemoteProtocolError("message frame ends inside its extension header")
        ext_version = data[pos]
        pos += 1
        if ext_version != 0:
            if len(data) < pos + 2:
                raise RemoteProtocolError("message frame ends inside its extension length")
            (ext_len,) = _U16.unpack_from(data, pos)
            pos += 2
            if len(data) < pos + ext_len:
                raise RemoteProtocolError("message frame ends inside its extension data")
            ext_data = data[pos : pos + ext_len]
            pos += ext_len
    if layout.queue_position:
        if len(data) < pos + 12:
            raise RemoteProtocolError("message frame ends inside its queue position")
        queue_offset, raw_size = _POSITION.unpack_from(data, pos)
        pos += 12
    trace_id: int | None = None
    internal_id: int | None = None
    if layout.binary_id:
        (internal_id,) = _U64.unpack_from(msg_id, 0)
        (trace_id,) = _U64.unpack_from(msg_id, 8)
    return cls(
        msg_id,
        timestamp,
        attempts,
        data[pos:],
        trace_id,
        internal_id,
        ext_version,
        ext_data,
        queue_offset,
        raw_size,
    )
