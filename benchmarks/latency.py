"""Latency through the public API beside a bare socket loop, in the same run.

    python benchmarks/latency.py --nsqd-tcp-address 127.0.0.1:4150 --count 10000 [--backend trio]

``round trip``: single ``publish()`` calls, each waiting for nsqd's OK.  ``end to end``: a
publish until the consumer's handler has the message (one in flight at a time).  Prints p50
and p99 in microseconds for the client and the bare loop (``benchmarks/bare.py``), and the
ratio of the p50s.  ``--bare-spin 0.00002`` runs the bare round trip once more, busy for that
many seconds before each PUB (untimed): how its figure moves when the process does some work
between trips, as any client does.  ``--rtt MS`` measures both through a loopback proxy
delaying every chunk MS / 2 ms each way (``rtt.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import statistics
import time
import uuid
from typing import Any

import anyio
import bare
import rtt


def percentiles(times: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(times, n=100)
    return q[49] * 1e6, q[98] * 1e6


async def client_round_trip(
    lib: Any, address: str, topic: str, count: int, size: int
) -> list[float]:
    body = b"x" * size
    times = []
    async with lib.Producer(nsqd_tcp_addresses=[address]) as producer:
        await producer.publish(topic, body)
        for _ in range(count):
            start = time.perf_counter()
            await producer.publish(topic, body)
            times.append(time.perf_counter() - start)
    return times


async def client_end_to_end(
    lib: Any, address: str, topic: str, count: int, size: int
) -> list[float]:
    body = b"x" * size
    times: list[float] = []
    arrived = anyio.Event()
    arrived_at = 0.0

    async def handler(message: Any) -> None:
        nonlocal arrived_at
        arrived_at = time.perf_counter()  # the handler has it: the time the bare loop reads
        arrived.set()

    async with (
        lib.Producer(nsqd_tcp_addresses=[address]) as producer,
        lib.Consumer(topic, "latency", nsqd_tcp_addresses=[address], max_in_flight=1) as consumer,
    ):
        async with anyio.create_task_group() as tg:
            tg.start_soon(consumer.run, handler, 1)
            await producer.publish(topic, b"warm")
            await arrived.wait()
            for _ in range(count):
                arrived = anyio.Event()
                start = time.perf_counter()
                await producer.publish(topic, body)  # its OK may come after the delivery
                await arrived.wait()
                times.append(arrived_at - start)
            tg.cancel_scope.cancel()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nsqd-tcp-address", default="127.0.0.1:4150")
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--backend", choices=["asyncio", "trio", "nsq_trio"], default="asyncio")
    parser.add_argument(
        "--bare-spin", type=float, default=0.0, help="seconds of work before each bare PUB"
    )
    rtt.add_option(parser)
    args = parser.parse_args()
    with rtt.through(args.nsqd_tcp_address, args.rtt) as address:
        rows = measure(args, address)
    print(f"backend={args.backend} count={args.count} size={args.size} rtt_ms={args.rtt}")
    for row in rows:
        print(row)


def measure(args: argparse.Namespace, address: str) -> list[str]:
    """The rows of the report: each measure of the client beside the bare loop's."""
    lib = importlib.import_module("nsq_trio" if args.backend == "nsq_trio" else "nsq_anyio")
    loop = "trio" if args.backend == "nsq_trio" else args.backend
    tag = uuid.uuid4().hex[:8]
    rows = []
    for name, bare_run, client_run in (
        ("round_trip", bare.round_trip, client_round_trip),
        ("end_to_end", bare.end_to_end, client_end_to_end),
    ):
        bare_times = asyncio.run(bare_run(address, f"lat_bare_{tag}_{name}", args.count, args.size))
        client_times = anyio.run(
            client_run, lib, address, f"lat_{tag}_{name}", args.count, args.size, backend=loop
        )
        b50, b99 = percentiles(bare_times)
        c50, c99 = percentiles(client_times)
        rows.append(
            f"{name}: client p50={c50:.0f}us p99={c99:.0f}us  bare p50={b50:.0f}us "
            f"p99={b99:.0f}us  p50 ratio={c50 / b50:.2f}"
        )
    if args.bare_spin:
        spun = asyncio.run(
            bare.round_trip(address, f"lat_spin_{tag}", args.count, args.size, args.bare_spin)
        )
        s50, s99 = percentiles(spun)
        rows.append(
            f"round_trip, bare busy {args.bare_spin * 1e6:.0f}us before each PUB: "
            f"p50={s50:.0f}us p99={s99:.0f}us"
        )
    return rows


if __name__ == "__main__":
    main()
