"""Stream compression negotiated by IDENTIFY: snappy (framing format) and raw DEFLATE.

Both are pure byte transforms with state per direction.  nsqd switches them on right after the
IDENTIFY response (or after the ``OK`` that follows a TLS handshake); the connection calls
:func:`make_codec` at exactly that point and passes everything after it through the codec.
"""

from __future__ import annotations

import zlib
from typing import Protocol

from ._errors import LocalProtocolError, RemoteProtocolError

__all__ = ["Codec", "SnappyCodec", "DeflateCodec", "make_codec", "snappy_available"]

_STREAM_ID = b"\xff\x06\x00\x00sNaPpY"
#: the framing format caps uncompressed chunk data at 65536 bytes (+4 for the checksum);
#: a compressed chunk is never larger than that either
_MAX_CHUNK = 65536 + 4 + 32
#: the most one read may inflate to; far above real traffic (nsqd's frames are at most a few
#: MiB and a read is at most a few hundred KiB), far below what a hostile stream could ask for
MAX_INFLATE = 64 * 1024 * 1024


class Codec(Protocol):
    def compress(self, data: bytes) -> bytes: ...

    def decompress(self, data: bytes) -> bytes: ...


def snappy_available() -> bool:
    try:
        import snappy  # noqa: F401
    except ImportError:
        return False
    return True


class SnappyCodec:
    """Snappy framing format, as nsqd and go-nsq speak it (stream identifier first)."""

    def __init__(self) -> None:
        try:
            import snappy
        except ImportError as exc:  # pragma: no cover - exercised only without the extra
            raise LocalProtocolError(
                "snappy compression needs python-snappy (install the 'snappy' extra)"
            ) from exc
        self._snappy = snappy
        self._compressor = snappy.StreamCompressor()
        self._pending = bytearray()
        self._seen_stream_id = False

    def compress(self, data: bytes) -> bytes:
        out: bytes = self._compressor.add_chunk(data)
        return out

    def decompress(self, data: bytes) -> bytes:
        buf = self._pending
        buf += data
        pos = 0
        n = len(buf)
        while n - pos >= 4:
            chunk_type = buf[pos]
            length = buf[pos + 1] | (buf[pos + 2] << 8) | (buf[pos + 3] << 16)
            if chunk_type == 0xFF:
                if length != 6:
                    raise RemoteProtocolError("snappy stream identifier of a wrong length")
            elif chunk_type in (0x00, 0x01):
                if not self._seen_stream_id:
                    raise RemoteProtocolError("snappy stream does not start with its identifier")
                if length < 4 or length > _MAX_CHUNK:
                    raise RemoteProtocolError(f"snappy chunk of invalid length {length}")
            elif 0x02 <= chunk_type <= 0x7F:
                raise RemoteProtocolError(f"reserved unskippable snappy chunk type {chunk_type:#x}")
            elif length > _MAX_CHUNK:
                raise RemoteProtocolError(f"skippable snappy chunk of invalid length {length}")
            if n - pos < 4 + length:
                break
            if chunk_type == 0xFF:
                if bytes(buf[pos : pos + 10]) != _STREAM_ID:
                    raise RemoteProtocolError("bad snappy stream identifier")
                self._seen_stream_id = True
            pos += 4 + length
        if pos == 0:
            return b""
        whole = bytes(buf[:pos])
        del buf[:pos]
        try:
            plain: bytes = self._snappy.StreamDecompressor().decompress(whole)
        except Exception as exc:  # python-snappy raises OSError/UncompressError/cramjam errors
            raise RemoteProtocolError(f"corrupt snappy stream: {exc}") from exc
        return plain


class DeflateCodec:
    """Raw DEFLATE (RFC 1951, no zlib header) with a sync flush after every write."""

    def __init__(self, level: int = 6) -> None:
        if not 1 <= level <= 9:
            raise LocalProtocolError(f"deflate level must be 1..9, not {level}")
        self._compressor = zlib.compressobj(level, zlib.DEFLATED, -15)
        self._decompressor = zlib.decompressobj(-15)

    def compress(self, data: bytes) -> bytes:
        c = self._compressor
        return c.compress(data) + c.flush(zlib.Z_SYNC_FLUSH)

    def decompress(self, data: bytes) -> bytes:
        try:
            out = self._decompressor.decompress(data, MAX_INFLATE)
        except zlib.error as exc:
            raise RemoteProtocolError(f"corrupt deflate stream: {exc}") from exc
        if self._decompressor.unconsumed_tail:
            raise RemoteProtocolError(
                f"one read inflates to more than {MAX_INFLATE} bytes (a compression bomb?)"
            )
        if self._decompressor.eof:
            raise RemoteProtocolError(
                "deflate stream ended (final block) while the connection is open"
            )
        return out


def make_codec(snappy: bool, deflate: bool, deflate_level: int) -> Codec | None:
    if snappy and deflate:
        raise RemoteProtocolError("server enabled both snappy and deflate")
    if snappy:
        return SnappyCodec()
    if deflate:
        return DeflateCodec(deflate_level)
    return None
