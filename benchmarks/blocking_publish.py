"""Blocking publishes from many threads through one ``nsq_anyio.blocking.Producer``, beside
the async producer with as many tasks, in the same run.

    python benchmarks/blocking_publish.py --nsqd-tcp-address 127.0.0.1:4150 --threads 8
    python benchmarks/blocking_publish.py --threads 200 --rtt 50 --count 20000

Each thread (task) publishes one message at a time and waits for nsqd's OK, as a web server's
worker threads do.  ``--rtt MS`` puts the loopback delay proxy of ``rtt.py`` between both
producers and nsqd.  The last lines are ``blocking_msgs_per_s=`` and ``async_msgs_per_s=``.
"""

from __future__ import annotations

import argparse
import threading
import time

import anyio
import rtt

import nsq_anyio
from nsq_anyio.blocking import Producer


def blocking(args: argparse.Namespace) -> float:
    body = b"x" * args.size
    per_thread = args.count // args.threads
    with Producer(nsqd_tcp_addresses=[args.nsqd_tcp_address], backend=args.backend) as producer:
        producer.publish(args.topic, body)  # connect and create the topic

        def work() -> None:
            for _ in range(per_thread):
                producer.publish(args.topic, body)

        threads = [threading.Thread(target=work) for _ in range(args.threads)]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - start
    return per_thread * args.threads / elapsed


async def asynchronous(args: argparse.Namespace) -> float:
    body = b"x" * args.size
    per_task = args.count // args.threads
    async with nsq_anyio.Producer(nsqd_tcp_addresses=[args.nsqd_tcp_address]) as producer:
        await producer.publish(args.topic, body)

        async def work() -> None:
            for _ in range(per_task):
                await producer.publish(args.topic, body)

        start = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(args.threads):
                tg.start_soon(work)
        elapsed = time.perf_counter() - start
    return per_task * args.threads / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nsqd-tcp-address", default="127.0.0.1:4150")
    parser.add_argument("--topic", default="bench_blocking")
    parser.add_argument("--count", type=int, default=40_000)
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--rtt", type=float, default=None, metavar="MS")
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    args = parser.parse_args()
    with rtt.through(args.nsqd_tcp_address, args.rtt) as address:
        args.nsqd_tcp_address = address
        rate = blocking(args)
        arate = anyio.run(asynchronous, args, backend=args.backend)
    delay = "" if args.rtt is None else f" rtt_ms={args.rtt:g}"
    print(f"threads={args.threads} count={args.count} size={args.size}{delay} {args.backend}")
    print(f"blocking_msgs_per_s={rate:.1f}")
    print(f"async_msgs_per_s={arate:.1f}")


if __name__ == "__main__":
    main()
