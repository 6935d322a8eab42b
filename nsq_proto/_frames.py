"""Size-prefixed frames: ``size:i32 | frame_type:i32 | data`` (size counts type + data)."""

from __future__ import annotations

import struct
from enum import IntEnum
from typing import Final

from ._errors import FrameTooLarge, RemoteProtocolError

__all__ = [
    "FrameType",
    "FrameDecoder",
    "encode_frame",
    "DEFAULT_MAX_FRAME_SIZE",
    "HEARTBEAT",
    "OK",
    "CLOSE_WAIT",
]

HEARTBEAT: Final = b"_heartbeat_"
OK: Final = b"OK"
CLOSE_WAIT: Final = b"CLOSE_WAIT"

#: Largest ``size`` field accepted by default: nsqd's default --max-body-size (5 MiB)
#: plus room for the message header, rounded up.  Configurable per connection.
DEFAULT_MAX_FRAME_SIZE: Final = 8 * 1024 * 1024

_HEADER: Final = struct.Struct(">ii")
_SIZE: Final = struct.Struct(">i")
_unpack_header: Final = _HEADER.unpack_from
_unpack_size: Final = _SIZE.unpack_from


class FrameType(IntEnum):
    #: a response to a command (``OK``, JSON, ``_heartbeat_``, ``CLOSE_WAIT``)
    RESPONSE = 0
    #: an error frame ``E_CODE description``
    ERROR = 1
    #: a message pushed to a subscriber
    MESSAGE = 2


def encode_frame(frame_type: int, data: bytes) -> bytes:
    """Encode one frame as nsqd writes it."""
    return _HEADER.pack(len(data) + 4, frame_type) + data


class FrameDecoder:
    """Incremental decoder: feed it bytes in any chunking, get whole frames back.

    ``feed`` returns ``(frame_type, data)`` pairs in order.  A size field below 4 or above
    ``max_size``, or an unknown frame type, raises :class:`RemoteProtocolError` as soon as the
    offending header bytes have arrived; after that the decoder stays broken.
    """

    __slots__ = ("_buf", "_error", "_max_size")

    def __init__(self, max_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        if max_size < 4:
            raise ValueError("max_size must be at least 4")
        self._buf = bytearray()
        self._max_size = max_size
        self._error: RemoteProtocolError | None = None

    @property
    def buffered(self) -> int:
        """Bytes held back because they do not yet form a whole frame."""
        return len(self._buf)

    def take_buffered(self) -> bytes:
        """Remove and return the bytes not yet decoded (for an upgrade point)."""
        data = bytes(self._buf)
        self._buf.clear()
        return data

    def feed(self, data: bytes, limit: int = 0) -> list[tuple[int, bytes]]:
        """Decode what ``data`` completes.  With ``limit`` > 0, stop after that many frames and
        keep the rest buffered (used at upgrade points, where later bytes change meaning)."""
        if self._error is not None:
            raise self._error
        if self._buf:
            self._buf += data
            buf: bytes | bytearray = self._buf
            from_buffer = True
        else:
            buf = data
            from_buffer = False
        frames: list[tuple[int, bytes]] = []
        append = frames.append
        pos = 0
        n = len(buf)
        max_size = self._max_size
        size: int  # declared: the compiled build then compares machine ints, not objects
        frame_type: int
        try:
            while n - pos >= 8:
                if limit and len(frames) == limit:
                    break
                size, frame_type = _unpack_header(buf, pos)
                if size < 4 or size > max_size:
                    self._bad_size(size)
                if frame_type < 0 or frame_type > 2:
                    raise RemoteProtocolError(f"unknown frame type {frame_type}")
                end = pos + 4 + size
                if end > n:
                    break
                append((frame_type, bytes(buf[pos + 8 : end])))
                pos = end
            else:
                # a hostile size field fails at once, not when the rest arrives (but bytes past
                # a limit may be in another encoding: leave them alone)
                if n - pos >= 4 and not (limit and len(frames) == limit):
                    (size,) = _unpack_size(buf, pos)
                    if size < 4 or size > max_size:
                        self._bad_size(size)
        except RemoteProtocolError as exc:
            self._error = exc
            raise
        if from_buffer:
            del self._buf[:pos]
        elif pos < n:
            self._buf += buf[pos:]
        return frames

    def _bad_size(self, size: int) -> None:
        if size > self._max_size:
            raise FrameTooLarge(f"frame size {size} is above the maximum {self._max_size}")
        raise RemoteProtocolError(f"frame size {size} is below the minimum 4")
