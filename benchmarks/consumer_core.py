"""The consumer core alone: receive -> MessageReceived -> finish -> bytes out, per second.

    python benchmarks/consumer_core.py [--count N]

Feeds pre-built message frames (200-byte messages, 64 KiB reads) to 1 and to 8 subscribed
connections of one ``nsq_proto.Consumer``, finishes every message and drains the FIN (and
RDY) bytes, as an adapter would.  Prints ``consumer_core_msgs_per_s_<n>conn=<float>``.
"""

from __future__ import annotations

import argparse
import random
import time

from nsq_emulator.frames import encode_message_data
from nsq_proto import Connect, Consumer, ConsumerConfig, MessageReceived, Send
from nsq_proto.wire import encode_frame


def identify_ok() -> bytes:
    return encode_frame(0, b'{"max_rdy_count":2500,"version":"1.3.0"}')


def run(connections: int, count: int) -> float:
    core = Consumer(
        "t",
        "c",
        ConsumerConfig(max_in_flight=2500 * connections),
        nsqd_tcp_addresses=[f"10.0.0.{i}:4150" for i in range(connections)],
        rng=random.Random(0),
    )
    core.start(0.0)
    conn_ids = [o.conn_id for o in core.outputs() if isinstance(o, Connect)]
    for c in conn_ids:
        core.connection_made(c, 0.0)
        core.receive_data(c, identify_ok(), 0.0)
        core.receive_data(c, encode_frame(0, b"OK"), 0.0)
    core.outputs()
    per_conn = count // connections
    body = b"x" * (200 - 26)
    chunks: dict[int, list[bytes]] = {}
    for n, c in enumerate(conn_ids):
        stream = b"".join(
            encode_frame(2, encode_message_data(f"{n:04x}{i:012x}".encode(), i, 1, body))
            for i in range(per_conn)
        )
        chunks[c] = [stream[i : i + 65536] for i in range(0, len(stream), 65536)]
    finished = 0
    sent = 0
    start = time.perf_counter()
    rounds = max(len(v) for v in chunks.values())
    for r in range(rounds):
        for c in conn_ids:
            if r < len(chunks[c]):
                core.receive_data(c, chunks[c][r], 1.0)
        for out in core.outputs():
            if type(out) is MessageReceived:
                core.finish(out.conn_id, out.message.id, 1.0)
                finished += 1
            elif type(out) is Send:
                sent += len(out.data)
        for out in core.outputs():
            if type(out) is Send:
                sent += len(out.data)
    elapsed = time.perf_counter() - start
    assert finished == per_conn * connections, finished
    assert sent >= finished * 21  # every FIN went out
    return finished / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--count", type=int, default=400_000)
    args = parser.parse_args()
    for connections in (1, 8):
        rate = max(run(connections, args.count) for _ in range(3))
        print(f"consumer_core_msgs_per_s_{connections}conn={rate:.0f}")


if __name__ == "__main__":
    main()
