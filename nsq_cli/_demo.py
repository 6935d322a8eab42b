"""``demo``: serve the emulator, publish ``--count`` messages, tail them back, check each."""

from __future__ import annotations

import argparse
import sys
import time

import anyio

from nsq_anyio import Consumer, Producer

from ._args import add_backend
from ._values import count, topic_name

__all__ = ["EPILOG", "HELP", "NAME", "add_arguments", "check_usage", "run"]

NAME = "demo"
HELP = "publish/tail round trip against the embedded emulator"
EPILOG: str | None = None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--count",
        type=count,
        default=10000,
        help="messages to publish and consume back (default: %(default)s)",
    )
    parser.add_argument(
        "--topic", type=topic_name, default="demo", help="the topic (default: %(default)s)"
    )
    add_backend(parser)


def check_usage(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Nothing beyond what argparse checks."""


async def run(args: argparse.Namespace) -> int:
    """Serve the emulator, publish ``--count`` messages, tail them back, check every one."""
    from nsq_emulator.loopback import serve_emulator

    async with serve_emulator(nsqd_count=2) as cluster:
        print(f"emulated nsqd at {', '.join(cluster.nsqd_tcp_addresses)}", file=sys.stderr)
        print(f"emulated lookupd at {cluster.lookupd_http_addresses[0]}", file=sys.stderr)
        total = args.count
        start = time.perf_counter()
        async with Producer(nsqd_tcp_addresses=cluster.nsqd_tcp_addresses) as producer:
            for first in range(0, total, 100):
                batch = [b"message %d" % i for i in range(first, min(first + 100, total))]
                await producer.publish_many(args.topic, batch)
        published = time.perf_counter() - start
        seen: set[bytes] = set()
        start = time.perf_counter()
        async with Consumer(
            args.topic,
            "demo",
            lookupd_http_addresses=cluster.lookupd_http_addresses,
            max_in_flight=200,
        ) as consumer:
            with anyio.fail_after(60):
                async for message in consumer:
                    seen.add(message.body)
                    await message.finish()
                    if len(seen) == total:
                        break
        consumed = time.perf_counter() - start
    missing = total - len(seen)  # the emulator is this command's own: no other bodies
    print(f"published {total} messages in {published:.2f} s")
    print(f"consumed {len(seen)} distinct messages in {consumed:.2f} s (via lookupd, 2 nsqd)")
    print("round trip OK" if not missing else f"round trip FAILED: {missing} missing")
    return 0 if not missing else 1
