"""Consuming from threads through one ``nsq_anyio.blocking.Consumer``, beside the async
consumer, in the same run.

    python benchmarks/blocking_consume.py --nsqd-tcp-address 127.0.0.1:4150 --threads 4

Publishes ``--count`` 200-byte messages, consumes them with ``Consumer.run(handler,
threads=N)`` (a handler that does nothing, each message FINished by its return), publishes
as many again on a topic of their own (``--topic`` and ``_async``) and consumes them with
the async consumer's ``run(handler)``.  The last lines
are ``blocking_msgs_per_s=`` and ``async_msgs_per_s=``.
"""

from __future__ import annotations

import argparse
import threading
import time

import anyio

import nsq_anyio
from nsq_anyio.blocking import Consumer, Message


async def fill(args: argparse.Namespace, topic: str) -> None:
    """``--count`` messages on ``topic``, new (no channel yet: the first one gets them all)."""
    body = b"x" * args.size
    async with nsq_anyio.Producer(nsqd_tcp_addresses=[args.nsqd_tcp_address]) as producer:
        for start in range(0, args.count, 100):
            await producer.publish_many(topic, [body] * min(100, args.count - start))


def blocking(args: argparse.Namespace) -> float:
    anyio.run(fill, args, args.topic)
    lock = threading.Lock()
    done = threading.Event()
    seen = 0

    def handler(message: Message) -> None:
        nonlocal seen
        with lock:
            seen += 1
            if seen == args.count:
                done.set()

    options = {"nsqd_tcp_addresses": [args.nsqd_tcp_address], "max_in_flight": args.max_in_flight}
    with Consumer(args.topic, "blocking", backend=args.backend, **options) as consumer:
        start = time.perf_counter()
        runner = threading.Thread(target=consumer.run, args=(handler, args.threads))
        runner.start()
        if not done.wait(600):
            raise SystemExit(f"only {seen} of {args.count} messages in 600 s")
        elapsed = time.perf_counter() - start
        consumer.stop()
        runner.join()
    return float(args.count) / elapsed


async def asynchronous(args: argparse.Namespace) -> float:
    await fill(args, args.topic + "_async")
    seen = 0
    async with nsq_anyio.Consumer(
        args.topic + "_async",
        "async",
        nsqd_tcp_addresses=[args.nsqd_tcp_address],
        max_in_flight=args.max_in_flight,
    ) as consumer:

        async def handler(message: nsq_anyio.Message) -> None:
            nonlocal seen
            seen += 1
            if seen == args.count:
                await consumer.stop()

        start = time.perf_counter()
        await consumer.run(handler)
        elapsed = time.perf_counter() - start
    return float(args.count) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nsqd-tcp-address", default="127.0.0.1:4150")
    parser.add_argument("--topic", default="bench_blocking_consume")
    parser.add_argument("--count", type=int, default=20_000)
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--max-in-flight", type=int, default=200)
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    args = parser.parse_args()
    rate = blocking(args)
    arate = anyio.run(asynchronous, args, backend=args.backend)
    print(f"threads={args.threads} count={args.count} size={args.size} {args.backend}")
    print(f"blocking_msgs_per_s={rate:.1f}")
    print(f"async_msgs_per_s={arate:.1f}")


if __name__ == "__main__":
    main()
