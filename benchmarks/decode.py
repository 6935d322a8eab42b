"""Hot-path benchmark of the protocol core: frame decoding, message dispatch, FIN/RDY encoding.

Run: python benchmarks/decode.py [--count N]
Prints one ``name=value`` line per figure (higher is better).
"""

from __future__ import annotations

import argparse
import os
import time

from nsq_emulator.frames import encode_message_data
from nsq_proto import Connection, ConnectionConfig, MessageReceived
from nsq_proto import commands as cmd
from nsq_proto._message import decode_message
from nsq_proto.wire import FrameDecoder, encode_frame


def message_buffer(count: int, size: int = 200) -> bytes:
    body_len = size - 26
    frames = []
    for i in range(count):
        msg_id = f"{i:016x}".encode()
        frames.append(
            encode_frame(2, encode_message_data(msg_id, 1_700_000_000 + i, 1, b"x" * body_len))
        )
    return b"".join(frames)


def best_of(fn: object, repeat: int = 5) -> float:
    assert callable(fn)
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--count", type=int, default=200_000)
    parser.add_argument("--chunk", type=int, default=65536, help="read size fed to the decoder")
    args = parser.parse_args()
    n = args.count
    buf = message_buffer(n)
    chunk = args.chunk
    chunks = [buf[i : i + chunk] for i in range(0, len(buf), chunk)]

    def decode_frames() -> None:
        dec = FrameDecoder()
        total = 0
        for c in chunks:
            total += len(dec.feed(c))
        assert total == n, total

    def decode_messages() -> None:
        dec = FrameDecoder()
        total = 0
        for c in chunks:
            for _, data in dec.feed(c):
                decode_message(data)
                total += 1
        assert total == n

    ids = [f"{i:016x}".encode() for i in range(n)]

    def encode_fin() -> None:
        fin = cmd.fin
        for i in ids:
            fin(i)

    def encode_rdy() -> None:
        rdy = cmd.rdy
        for i in range(n):
            rdy(i & 1023)

    def connection_dispatch() -> None:
        conn = Connection(ConnectionConfig())
        conn.connection_made(0.0)
        conn.receive_data(encode_frame(0, b"OK"), 0.0)
        conn.subscribe("t", "c")
        conn.receive_data(encode_frame(0, b"OK"), 0.0)
        conn.outputs()
        total = 0
        for c in chunks:
            conn.receive_data(c, 1.0)
            for ev in conn.outputs():
                if type(ev) is MessageReceived:
                    conn.finish(ev.message.id)
                    total += 1
        assert total == n

    print(f"cpu_count={os.cpu_count()} messages={n} message_size=200 chunk={chunk}")
    print(f"frames_decoded_per_s={n / best_of(decode_frames):.0f}")
    print(f"messages_decoded_per_s={n / best_of(decode_messages):.0f}")
    print(f"fin_encoded_per_s={n / best_of(encode_fin):.0f}")
    print(f"rdy_encoded_per_s={n / best_of(encode_rdy):.0f}")
    print(f"connection_receive_fin_per_s={n / best_of(connection_dispatch, 3):.0f}")


if __name__ == "__main__":
    main()
