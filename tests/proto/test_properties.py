"""Properties of the connection core under any chunking of the server's byte stream."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from nsq_proto import (
    Connection,
    ConnectionConfig,
    Event,
    HeartbeatReceived,
    MessageReceived,
    Output,
    RemoteProtocolError,
)
from nsq_proto.wire import DeflateCodec, SnappyCodec

from .helpers import error, identify_response, message, mid, response

frame_st = st.one_of(
    st.builds(
        lambda i, b, a: message(mid(i), b, a),
        st.integers(0, 2**32),
        st.binary(max_size=120),
        st.integers(1, 100),
    ),
    st.just(response(b"_heartbeat_")),
    st.builds(
        lambda i: error(b"E_FIN_FAILED FIN " + mid(i) + b" failed ID not in flight"),
        st.integers(0, 99),
    ),
)

compression_st = st.sampled_from(["plain", "snappy", "deflate"])


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    out, last = [], 0
    for p in points:
        out.append(data[last:p])
        last = p
    out.append(data[last:])
    return out


def server_stream(compression: str, frames: list[bytes], writes: list[int]) -> tuple[bytes, bytes]:
    """What nsqd writes: the handshake (plain IDENTIFY response, then maybe a compressed OK), and
    after SUB its OK and the traffic, grouped into writes at arbitrary points."""
    head = identify_response(snappy=compression == "snappy", deflate=compression == "deflate")
    codec = {"plain": None, "snappy": SnappyCodec(), "deflate": DeflateCodec(6)}[compression]
    if codec is not None:
        head += codec.compress(response(b"OK"))
    after = [response(b"OK"), *frames]
    groups: list[list[bytes]] = [[]]
    for i, f in enumerate(after):
        groups[-1].append(f)
        if i in writes:
            groups.append([])
    tail = b"".join(
        (codec.compress(b"".join(g)) if codec is not None else b"".join(g)) for g in groups if g
    )
    return head, tail


def run(compression: str, head: list[bytes], tail: list[bytes]) -> list[Output]:
    conn = Connection(
        ConnectionConfig(snappy=compression == "snappy", deflate=compression == "deflate")
    )
    conn.connection_made(0.0)
    conn.outputs()
    out: list[Output] = []
    for chunk in head:
        conn.receive_data(chunk, 1.0)
    conn.subscribe("t", "c")
    for chunk in tail:
        conn.receive_data(chunk, 1.0)
    out += conn.outputs()
    return out


@settings(max_examples=300, deadline=None)
@given(
    compression=compression_st,
    frames=st.lists(frame_st, max_size=12),
    writes=st.lists(st.integers(0, 14), max_size=5),
    cuts=st.lists(st.integers(min_value=0), max_size=12),
)
def test_any_chunking_gives_the_same_events(
    compression: str, frames: list[bytes], writes: list[int], cuts: list[int]
) -> None:
    head, tail = server_stream(compression, frames, writes)
    whole = [o for o in run(compression, [head], [tail]) if isinstance(o, Event)]
    assert sum(isinstance(e, MessageReceived) for e in whole) == sum(f[7] == 2 for f in frames)
    assert sum(isinstance(e, HeartbeatReceived) for e in whole) == frames.count(
        response(b"_heartbeat_")
    )
    chunked = run(compression, split(head, cuts), split(tail, cuts[::-1]))
    assert [o for o in chunked if isinstance(o, Event)] == whole
    one = [head[i : i + 1] for i in range(len(head))]
    byte_by_byte = run(compression, one, [tail[i : i + 1] for i in range(len(tail))])
    assert [o for o in byte_by_byte if isinstance(o, Event)] == whole


@settings(max_examples=3000, deadline=None)
@given(
    compression=compression_st,
    garbage=st.binary(max_size=120),
    cuts=st.lists(st.integers(min_value=0), max_size=6),
)
def test_arbitrary_bytes_raise_only_remote_protocol_errors(
    compression: str, garbage: bytes, cuts: list[int]
) -> None:
    conn = Connection(
        ConnectionConfig(snappy=compression == "snappy", deflate=compression == "deflate")
    )
    conn.connection_made(0.0)
    head = identify_response(snappy=compression == "snappy", deflate=compression == "deflate")
    try:
        for chunk in split(head + garbage, cuts):
            conn.receive_data(chunk, 0.0)
            if conn.state.name == "READY":
                conn.subscribe("t", "c")
    except RemoteProtocolError:
        assert conn.state.name == "CLOSED"
        # the failure is reported as outputs too
        assert type(conn.outputs()[-1]).__name__ == "ConnectionClosed"
