from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsq_proto import FrameTooLarge, RemoteProtocolError
from nsq_proto.wire import FrameDecoder, encode_frame

frames_st = st.lists(
    st.tuples(st.sampled_from([0, 1, 2]), st.binary(max_size=300)), min_size=0, max_size=20
)


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    out, last = [], 0
    for p in points:
        out.append(data[last:p])
        last = p
    out.append(data[last:])
    return out


def test_single_frame_whole_and_byte_by_byte() -> None:
    data = encode_frame(0, b"OK")
    assert data == b"\x00\x00\x00\x06\x00\x00\x00\x00OK"
    assert FrameDecoder().feed(data) == [(0, b"OK")]
    dec = FrameDecoder()
    got = []
    for i in range(len(data)):
        got += dec.feed(data[i : i + 1])
    assert got == [(0, b"OK")]
    assert dec.buffered == 0


def test_partial_frame_is_kept() -> None:
    dec = FrameDecoder()
    data = encode_frame(2, b"x" * 40)
    assert dec.feed(data[:10]) == []
    assert dec.buffered == 10
    assert dec.feed(data[10:]) == [(2, b"x" * 40)]


@pytest.mark.parametrize("size", [0, 1, 3, -1, -(2**31)])
def test_size_below_four_is_rejected_at_once(size: int) -> None:
    with pytest.raises(RemoteProtocolError, match="below the minimum"):
        FrameDecoder().feed(struct.pack(">i", size))


def test_size_above_maximum_is_rejected_before_the_body() -> None:
    dec = FrameDecoder(max_size=1024)
    with pytest.raises(FrameTooLarge):
        dec.feed(struct.pack(">i", 1025))
    # the decoder stays broken
    with pytest.raises(FrameTooLarge):
        dec.feed(encode_frame(0, b"OK"))


def test_unknown_frame_type() -> None:
    with pytest.raises(RemoteProtocolError, match="unknown frame type 3"):
        FrameDecoder().feed(struct.pack(">ii", 4, 3))


def test_limit_keeps_rest_buffered() -> None:
    dec = FrameDecoder()
    data = encode_frame(0, b"A") + encode_frame(0, b"B") + b"rest"
    assert dec.feed(data, limit=1) == [(0, b"A")]
    assert dec.take_buffered() == encode_frame(0, b"B") + b"rest"
    assert dec.buffered == 0


@settings(max_examples=500)
@given(frames=frames_st, cuts=st.lists(st.integers(min_value=0), max_size=30))
def test_any_chunking_gives_the_same_frames(
    frames: list[tuple[int, bytes]], cuts: list[int]
) -> None:
    data = b"".join(encode_frame(t, d) for t, d in frames)
    dec = FrameDecoder()
    got = []
    for chunk in split(data, cuts):
        got += dec.feed(chunk)
    assert got == frames
    assert dec.buffered == 0


@settings(max_examples=3000)
@given(data=st.binary(max_size=200), cuts=st.lists(st.integers(min_value=0), max_size=8))
def test_arbitrary_bytes_only_raise_protocol_errors(data: bytes, cuts: list[int]) -> None:
    dec = FrameDecoder(max_size=4096)
    try:
        for chunk in split(data, cuts):
            for frame_type, payload in dec.feed(chunk):
                assert frame_type in (0, 1, 2)
                assert isinstance(payload, bytes)
    except RemoteProtocolError:
        pass


def test_bytes_past_the_limit_are_not_checked_as_a_frame() -> None:
    # after an upgrade point the following bytes are compressed: "\xff\x06\x00\x00" starts a
    # snappy stream and is no frame size
    dec = FrameDecoder()
    assert dec.feed(encode_frame(0, b"{}") + b"\xff\x06\x00\x00", limit=1) == [(0, b"{}")]
    assert dec.take_buffered() == b"\xff\x06\x00\x00"


def test_a_frame_type_that_arrives_after_its_size_is_checked_at_once() -> None:
    dec = FrameDecoder()
    header = struct.pack(">ii", 100, 7)
    assert dec.feed(header[:5]) == []
    with pytest.raises(RemoteProtocolError, match="unknown frame type 7"):
        dec.feed(header[5:] + b"xx")  # the frame is still incomplete


def test_a_large_frame_in_many_small_reads() -> None:
    body = bytes(range(256)) * 4096
    data = encode_frame(2, body) + encode_frame(0, b"OK") + encode_frame(1, b"E_X")[:5]
    dec = FrameDecoder()
    got = []
    for i in range(0, len(data), 1000):
        got += dec.feed(data[i : i + 1000])
    assert got == [(2, body), (0, b"OK")]
    assert dec.buffered == 5
