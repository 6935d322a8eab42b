"""Bare asyncio socket loops against nsqd: the yardstick the client is measured beside.

No client code: raw frames over ``asyncio`` streams, as lean as a hand-written loop gets.
``pub`` pipelines MPUB batches of 100 (``outstanding`` at once); ``pub_singles`` pipelines
single PUBs (``outstanding`` at once, as go-nsq with that many concurrent publishes); ``sub`` sets RDY, parses
frames, answers heartbeats and writes the FINs of one read together; ``round_trip`` times
single PUBs (each waits for its OK) and ``end_to_end`` times PUB -> message frame on a second
connection.  Imported by ``throughput.py`` and ``latency.py``; runnable alone:

    python benchmarks/bare.py sub --nsqd-tcp-address 127.0.0.1:4150 --topic t --count 200000
"""

from __future__ import annotations

import argparse
import asyncio
import struct
import time

_FRAME = struct.Struct(">ii")
_HEARTBEAT = b"_heartbeat_"


def _mpub(topic: str, bodies: list[bytes]) -> bytes:
    payload = b"".join(struct.pack(">i", len(b)) + b for b in bodies)
    return (
        b"MPUB %s\n" % topic.encode() + struct.pack(">ii", 4 + len(payload), len(bodies)) + payload
    )


def _pub(topic: str, body: bytes) -> bytes:
    return b"PUB %s\n" % topic.encode() + struct.pack(">i", len(body)) + body


async def _open(address: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, _, port = address.rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port), limit=1 << 22)
    writer.write(b"  V2")
    return reader, writer


async def _frame(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    size, kind = _FRAME.unpack(await reader.readexactly(8))
    return kind, await reader.readexactly(size - 4)


async def pub(address: str, topic: str, count: int, size: int, outstanding: int = 8) -> float:
    reader, writer = await _open(address)
    body = b"x" * size
    batch = _mpub(topic, [body] * 100)
    writer.write(_pub(topic, body))
    await _frame(reader)
    batches = count // 100
    start = time.perf_counter()
    sent = answered = 0
    while answered < batches:
        while sent < batches and sent - answered < outstanding:
            writer.write(batch)
            sent += 1
        await writer.drain()
        _kind, data = await _frame(reader)
        if data != _HEARTBEAT:
            answered += 1
        else:
            writer.write(b"NOP\n")
    elapsed = time.perf_counter() - start
    writer.close()
    return batches * 100 / elapsed


async def pub_singles(
    address: str, topic: str, count: int, size: int, outstanding: int = 200
) -> float:
    """``count`` single PUBs on one connection, ``outstanding`` of them unanswered at a time:
    what go-nsq's producer does with that many concurrent publishes."""
    reader, writer = await _open(address)
    command = _pub(topic, b"x" * size)
    writer.write(command)
    await _frame(reader)  # the topic exists
    start = time.perf_counter()
    sent = answered = 0
    while answered < count:
        more = min(count - sent, outstanding - (sent - answered))
        if more > 0:
            writer.write(command * more)
            sent += more
        await writer.drain()
        _kind, data = await _frame(reader)
        if data != _HEARTBEAT:
            answered += 1
        else:
            writer.write(b"NOP\n")
    elapsed = time.perf_counter() - start
    writer.close()
    return count / elapsed


async def sub(address: str, topic: str, channel: str, count: int, rdy: int = 2500) -> float:
    reader, writer = await _open(address)
    writer.write(b"SUB %s %s\nRDY %d\n" % (topic.encode(), channel.encode(), rdy))
    await _frame(reader)  # OK to SUB
    buf = bytearray()
    seen = 0
    start = 0.0
    while seen < count:
        chunk = await reader.read(1 << 20)
        if not chunk:
            raise ConnectionError("nsqd closed the connection")
        buf += chunk
        out = []
        pos = 0
        while len(buf) - pos >= 8:
            size, kind = _FRAME.unpack_from(buf, pos)
            if len(buf) - pos - 4 < size:
                break
            if kind == 2:
                if not seen:
                    start = time.perf_counter()
                seen += 1
                out.append(b"FIN " + bytes(buf[pos + 18 : pos + 34]) + b"\n")
            elif bytes(buf[pos + 8 : pos + 4 + size]) == _HEARTBEAT:
                out.append(b"NOP\n")
            pos += 4 + size
        del buf[:pos]
        if out:
            writer.write(b"".join(out))
    elapsed = time.perf_counter() - start
    writer.close()
    return (seen - 1) / elapsed if elapsed > 0 else 0.0


async def round_trip(
    address: str, topic: str, count: int, size: int, spin: float = 0.0
) -> list[float]:
    """Seconds each of ``count`` single PUBs took to be acknowledged; with ``spin``, the loop
    first keeps the CPU busy that many seconds before each PUB (untimed), as a client's own
    work between two round trips would."""
    reader, writer = await _open(address)
    command = _pub(topic, b"x" * size)
    times = []
    clock = time.perf_counter
    for _ in range(count):
        if spin:
            until = clock() + spin
            while clock() < until:
                pass
        start = time.perf_counter()
        writer.write(command)
        await _frame(reader)
        times.append(time.perf_counter() - start)
    writer.close()
    return times


async def end_to_end(address: str, topic: str, count: int, size: int) -> list[float]:
    """Seconds from writing a PUB to reading its message frame on a subscribed connection
    (RDY 1, one message in flight at a time)."""
    p_reader, p_writer = await _open(address)
    p_writer.write(_pub(topic, b"warm"))
    await _frame(p_reader)
    s_reader, s_writer = await _open(address)
    s_writer.write(b"SUB %s bare\nRDY 1\n" % topic.encode())
    await _frame(s_reader)
    while True:  # the warm-up message first: each PUB timed is then the next one delivered
        kind, data = await _frame(s_reader)
        if kind == 2:
            s_writer.write(b"FIN " + data[10:26] + b"\n")
            break
    command = _pub(topic, b"x" * size)
    times = []
    for _ in range(count):
        start = time.perf_counter()
        p_writer.write(command)
        while True:
            kind, data = await _frame(s_reader)
            if kind == 2:
                break
            if data == _HEARTBEAT:
                s_writer.write(b"NOP\n")
        times.append(time.perf_counter() - start)
        s_writer.write(b"FIN " + data[10:26] + b"\n")
        await _frame(p_reader)  # the OK to the PUB
    p_writer.close()
    s_writer.close()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("mode", choices=["pub", "sub"])
    parser.add_argument("--nsqd-tcp-address", default="127.0.0.1:4150")
    parser.add_argument("--topic", default="bare")
    parser.add_argument("--channel", default="bare")
    parser.add_argument("--count", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=200)
    args = parser.parse_args()
    if args.mode == "pub":
        rate = asyncio.run(pub(args.nsqd_tcp_address, args.topic, args.count, args.size))
    else:
        rate = asyncio.run(sub(args.nsqd_tcp_address, args.topic, args.channel, args.count))
    print(f"bare_{args.mode}_msgs_per_s={rate:.1f}")


if __name__ == "__main__":
    main()
