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
    "HTTP_ANSWER",
]

#: the data of the response frame nsqd sends as a heartbeat (a client answers it with NOP)
HEARTBEAT: Final = b"_heartbeat_"
#: the data of the response frame that accepts a command: SUB, a publish, IDENTIFY without
#: feature negotiation, and a TLS or compression upgrade (sent through the new layer)
OK: Final = b"OK"
#: the data of the response frame that answers CLS: nsqd sends no more messages
CLOSE_WAIT: Final = b"CLOSE_WAIT"

#: Largest ``size`` field accepted by default: nsqd's default --max-body-size (5 MiB)
#: plus room for the message header, rounded up.  Configurable per connection.
DEFAULT_MAX_FRAME_SIZE: Final = 8 * 1024 * 1024

#: what the decoder raises when the peer answered with HTTP (an HTTP port, not nsqd's TCP port)
HTTP_ANSWER: Final = "answered with HTTP: is this nsqd's HTTP port rather than its TCP port?"
#: the size field b"HTTP" makes (an HTTP/1.x status line read as a frame header)
_HTTP_SIZE: Final = int.from_bytes(b"HTTP", "big")

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
        head, data, pos = self.resume(data)
        frames: list[tuple[int, bytes]] = []
        if head:
            frames.append((_unpack_header(head, 0)[1], head[8:]))
        append = frames.append
        n = len(data)
        max_size = self._max_size
        size: int  # declared: the compiled build then compares machine ints, not objects
        frame_type: int
        end: int
        while n - pos >= 8:
            if limit and len(frames) == limit:
                self.keep(data, pos, check=False)  # bytes past a limit may be another encoding
                return frames
            size, frame_type = _unpack_header(data, pos)
            if size < 4 or size > max_size or frame_type < 0 or frame_type > 2:
                self.reject(size, frame_type)
            end = pos + 4 + size
            if end > n:
                break
            append((frame_type, data[pos + 8 : end]))
            pos = end
        self.keep(data, pos, check=not (limit and len(frames) == limit))
        return frames

    def resume(self, data: bytes) -> tuple[bytes, bytes, int]:
        """Where to decode from: ``(head, data, pos)``.  ``head`` is the frame an earlier read
        began and ``data`` completes, whole (``b""`` if none); the frames that follow start at
        ``data[pos]``.  With :meth:`keep` and :meth:`reject`, the pieces of :meth:`feed` for a
        caller that walks the frames itself (the connection reads messages straight out of
        the bytes, with no copy of each frame nor of each read)."""
        if self._error is not None:
            raise self._error
        buf = self._buf
        if not buf:
            return b"", data, 0
        held = len(buf)
        pos = 0
        if held < 8:
            # the header itself was cut: complete it first
            pos = 8 - held
            buf += data[:pos]
            if len(buf) < 8:
                self._check_size(buf, 0)  # its frame type is not here yet
                return b"", b"", 0
            held = 8
        size, frame_type = _unpack_header(buf, 0)
        if size < 4 or size > self._max_size or frame_type < 0 or frame_type > 2:
            self.reject(size, frame_type)
        need = 4 + size - held
        if len(data) - pos < need:
            buf += data[pos:]  # the frame is still incomplete
            return b"", b"", 0
        buf += data[pos : pos + need]
        head = bytes(buf)
        buf.clear()
        return head, data, pos + need

    def _check_size(self, data: bytes | bytearray, pos: int) -> None:
        """A hostile size field at ``data[pos]`` fails as soon as it is there, not once the
        rest of its frame arrives."""
        if len(data) - pos >= 4:
            (size,) = _unpack_size(data, pos)
            if size < 4 or size > self._max_size:
                self.reject(size, 0)

    def keep(self, data: bytes, pos: int, *, check: bool = True) -> None:
        """Hold ``data[pos:]`` back until the rest of its frame arrives; with ``check``, a
        hostile size field in it fails now, not once the rest arrives."""
        if pos >= len(data):
            return
        if check:
            self._check_size(data, pos)
        self._buf += data[pos:] if pos else data

    def reject(self, size: int, frame_type: int) -> None:
        """Raise the error of a bad frame header (and stay broken)."""
        try:
            self._bad_size(size)
            raise RemoteProtocolError(f"unknown frame type {frame_type}")
        except RemoteProtocolError as exc:
            self._error = exc
            raise

    def _bad_size(self, size: int) -> None:
        if size == _HTTP_SIZE:
            error = RemoteProtocolError(HTTP_ANSWER)
            error.permanent = True  # the same port answers the same way next time
            raise error
        if 4 <= size <= self._max_size:
            return
        if size > self._max_size:
            raise FrameTooLarge(f"frame size {size} is above the maximum {self._max_size}")
        raise RemoteProtocolError(f"frame size {size} is below the minimum 4")
