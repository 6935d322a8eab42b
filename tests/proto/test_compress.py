"""The stream codecs of ``_compress.py``: deflate and snappy, and what a corrupt stream is."""

from __future__ import annotations

import zlib

import pytest

from nsq_proto import LocalProtocolError, RemoteProtocolError
from nsq_proto.wire import DeflateCodec, SnappyCodec


def test_corrupt_compressed_streams_are_remote_errors() -> None:
    with pytest.raises(RemoteProtocolError, match="corrupt deflate stream"):
        DeflateCodec().decompress(b"\xff\xff\xff\xff")
    with pytest.raises(LocalProtocolError, match=r"deflate level must be 1\.\.9, not 0"):
        DeflateCodec(0)
    final = zlib.compressobj(6, zlib.DEFLATED, -15)  # a sender that ends its stream
    stream = final.compress(b"hello") + final.flush(zlib.Z_FINISH)
    with pytest.raises(RemoteProtocolError, match="deflate stream ended"):
        DeflateCodec().decompress(stream)
    framed = SnappyCodec().compress(b"hello, " * 20)  # stream identifier, then a chunk
    assert SnappyCodec().decompress(framed) == b"hello, " * 20
    corrupt = framed[:-4] + bytes(b ^ 0xFF for b in framed[-4:])  # the chunk's data flipped
    with pytest.raises(RemoteProtocolError, match="corrupt snappy stream"):
        SnappyCodec().decompress(corrupt)
