"""End-to-end throughput through the public nsq_anyio (or nsq_trio) API.

    python benchmarks/throughput.py pub --nsqd-tcp-address 127.0.0.1:4150 --topic bench --count 200000
    python benchmarks/throughput.py pub --publishers 200 --rtt 50 --bare --count 20000
    python benchmarks/throughput.py sub --nsqd-tcp-address 127.0.0.1:4150 --topic bench --channel c --count 200000

``pub`` publishes with MPUB batches of 100 (``--outstanding`` batches in flight); with
``--publishers N``, N tasks each publish one message at a time, ``await
producer.publish(topic, body)`` in a loop, as a service's request handlers do (the bare loop
beside it keeps N single PUBs unanswered on one connection, as go-nsq's producer does with N
concurrent publishes).  ``sub`` fills a fresh topic (``--topic`` and a random suffix) with
``--count`` messages, then consumes and FINishes them: through ``async for`` and ``await
message.finish()`` with ``--style iterate``, else through a handler per message
(``--concurrency`` of them at once, each awaiting ``--handler-sleep`` seconds, as a handler
doing I/O would: with 100 handlers and 10 ms, the ideal is 100 / 0.01 s = 10,000 msgs/s).
``--rtt MS`` measures across a round trip: the client and the bare loop both go through a
loopback proxy delaying every chunk MS / 2 ms each way (``rtt.py``; the topic of ``sub`` is
filled straight).  ``--rounds N`` runs it all N times, each client run beside its bare run
(the bare loop first in every other round), and prints each round, then the medians (the
ratio's is the median of the rounds' ratios): on a 2-core machine nsqd and the client share
the cores, and the pace of such a machine moves between runs of a few seconds.  The last line
is ``pub_msgs_per_s=<float>`` or ``sub_msgs_per_s=<float>`` (the median of the rounds).
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


async def pub(args: argparse.Namespace, lib: Any) -> float:
    if args.publishers:
        return await pub_singles(args, lib)
    body = b"x" * args.size
    batch = [body] * 100
    batches: int = args.count // 100
    async with lib.Producer(
        nsqd_tcp_addresses=[args.nsqd_tcp_address], max_outstanding=args.outstanding
    ) as producer:
        await producer.publish(args.topic, body)  # connect and create the topic
        remaining = batches
        start = time.perf_counter()

        async def worker() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                await producer.publish_many(args.topic, batch)

        async with anyio.create_task_group() as tg:
            for _ in range(args.outstanding):
                tg.start_soon(worker)
        elapsed = time.perf_counter() - start
    return batches * 100 / elapsed


async def pub_singles(args: argparse.Namespace, lib: Any) -> float:
    """``--publishers`` tasks, each awaiting one ``publish()`` at a time, ``--count`` in all."""
    body = b"x" * args.size
    options = {} if args.outstanding is None else {"max_outstanding": args.outstanding}
    async with lib.Producer(nsqd_tcp_addresses=[args.nsqd_tcp_address], **options) as producer:
        await producer.publish(args.topic, body)  # connect and create the topic
        remaining = args.count
        start = time.perf_counter()

        async def publisher() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                await producer.publish(args.topic, body)

        async with anyio.create_task_group() as tg:
            for _ in range(args.publishers):
                tg.start_soon(publisher)
        elapsed = time.perf_counter() - start
    return float(args.count / elapsed)


async def sub(args: argparse.Namespace, lib: Any) -> float:
    done = anyio.Event()
    count = 0
    start = 0.0
    sleep = args.handler_sleep

    async def handler(message: Any) -> None:
        nonlocal count, start
        if count == 0:
            start = time.perf_counter()
        if sleep:
            await anyio.sleep(sleep)
        count += 1
        if count >= args.count:
            done.set()

    async with lib.Consumer(
        args.topic,
        args.channel,
        nsqd_tcp_addresses=[args.nsqd_tcp_address],
        max_in_flight=args.max_in_flight,
    ) as consumer:
        if args.style == "iterate":
            async for message in consumer:
                if count == 0:
                    start = time.perf_counter()
                if sleep:
                    await anyio.sleep(sleep)
                await message.finish()
                count += 1
                if count >= args.count:
                    break
            elapsed = time.perf_counter() - start
            return (count - 1) / elapsed if elapsed > 0 else 0.0
        async with anyio.create_task_group() as tg:
            tg.start_soon(consumer.run, handler, args.concurrency)
            await done.wait()
            elapsed = time.perf_counter() - start
            tg.cancel_scope.cancel()
    return (count - 1) / elapsed if elapsed > 0 else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("mode", choices=["pub", "sub"])
    parser.add_argument("--nsqd-tcp-address", default="127.0.0.1:4150")
    parser.add_argument("--topic", default="bench")
    parser.add_argument("--channel", default="bench")
    parser.add_argument("--count", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--max-in-flight", type=int, default=2500)
    parser.add_argument(
        "--style",
        choices=["handler", "iterate"],
        default="handler",
        help="consume through run(handler) or through `async for` and `await message.finish()`",
    )
    parser.add_argument("--concurrency", type=int, default=1, help="handlers running at once")
    parser.add_argument(
        "--handler-sleep", type=float, default=0.0, help="seconds each handler awaits"
    )
    parser.add_argument(
        "--bare",
        action="store_true",
        help="also run the bare asyncio socket loop (benchmarks/bare.py) in the same run",
    )
    parser.add_argument(
        "--outstanding",
        type=int,
        default=None,
        help="MPUBs in flight (8); with --publishers, the producer's max_outstanding "
        "(default: its own)",
    )
    parser.add_argument(
        "--publishers",
        type=int,
        default=0,
        metavar="N",
        help="pub: N tasks each publishing one message at a time instead of MPUB batches",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run N times (each client run beside its bare run) and "
        "print the medians: the rates', and the ratio's of the rounds",
    )
    rtt.add_option(parser)
    parser.add_argument("--backend", choices=["asyncio", "trio", "nsq_trio"], default="asyncio")
    parser.add_argument(
        "--loop",
        choices=["asyncio", "uvloop"],
        default="asyncio",
        help="with --backend asyncio: asyncio's own loop, or uvloop's (the uvloop extra); "
        "the bare loop runs on the same",
    )
    args = parser.parse_args()
    if args.loop == "uvloop" and args.backend != "asyncio":
        parser.error("--loop uvloop is a loop of --backend asyncio")
    backend_options = {"use_uvloop": True} if args.loop == "uvloop" else {}

    def run_bare(coro: Any) -> float:
        if args.loop == "uvloop":
            import uvloop

            return float(uvloop.run(coro))
        return float(asyncio.run(coro))

    if args.backend == "nsq_trio":
        lib = importlib.import_module("nsq_trio")
        backend = "trio"
    else:
        lib = importlib.import_module("nsq_anyio")
        backend = args.backend
    if args.publishers and args.mode != "pub":
        parser.error("--publishers is a mode of pub")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if not args.publishers and args.outstanding is None:
        args.outstanding = 8
    direct = args.nsqd_tcp_address
    topic = args.topic

    def one_round(bare_first: bool) -> tuple[float, float | None]:
        """The client's rate (``pub``: to ``--topic``; ``sub``: from a fresh topic), and the
        bare loop's beside it on a fresh topic (None without --bare); ``bare_first``: the
        bare loop runs first."""
        args.nsqd_tcp_address = direct
        args.topic = topic
        runner = pub if args.mode == "pub" else sub
        with rtt.through(direct, args.rtt) as address:

            def client() -> float:
                if args.mode == "sub":
                    # a fresh topic, filled beforehand (straight, not through --rtt's delay):
                    # the run measures consuming alone
                    args.topic = f"{topic}_{uuid.uuid4().hex[:8]}"
                    run_bare(bare.pub(direct, args.topic, args.count + 1000, args.size))
                args.nsqd_tcp_address = address
                return float(
                    anyio.run(runner, args, lib, backend=backend, backend_options=backend_options)
                )

            def bare_loop() -> float:
                # the same work, through raw frames on asyncio streams
                bare_topic = f"{topic}_bare_{uuid.uuid4().hex[:8]}"
                if args.mode == "pub" and args.publishers:
                    return run_bare(
                        bare.pub_singles(
                            address, bare_topic, args.count, args.size, args.publishers
                        )
                    )
                if args.mode == "pub":
                    return run_bare(
                        bare.pub(address, bare_topic, args.count, args.size, args.outstanding)
                    )
                run_bare(bare.pub(direct, bare_topic, args.count + 1000, args.size))
                return run_bare(bare.sub(address, bare_topic, "bench", args.count))

            if not args.bare:
                return client(), None
            if bare_first:
                bare_rate = bare_loop()
                return client(), bare_rate
            rate = client()
            return rate, bare_loop()

    rates: list[float] = []
    ratios: list[float] = []
    bare_rates: list[float] = []
    for i in range(args.rounds):
        # every other round the bare loop goes first: neither side always meets the nsqd
        # the other one left
        bare_first = args.bare and i % 2 == 1
        rate, bare_rate = one_round(bare_first)
        rates.append(rate)
        if args.rounds > 1:
            first = " (bare first)" if bare_first else ""
            print(f"round {i + 1}{first}: {args.mode}_msgs_per_s={rate:.1f}", end="")
        if bare_rate is not None:
            bare_rates.append(bare_rate)
            ratios.append(rate / bare_rate)
            if args.rounds > 1:
                print(f" bare_{args.mode}_msgs_per_s={bare_rate:.1f} ratio={rate / bare_rate:.2f}")
        elif args.rounds > 1:
            print()
    rate = statistics.median(rates)
    if ratios:
        # the median of each round's ratio: the client and the bare loop a few seconds apart
        # in each, so that a change of the machine's pace between rounds weighs less
        print(
            f"bare_{args.mode}_msgs_per_s={statistics.median(bare_rates):.1f} "
            f"ratio={statistics.median(ratios):.2f}"
        )
    print(
        f"backend={args.backend} loop={args.loop} count={args.count} size={args.size} "
        f"style={args.style} concurrency={args.concurrency} handler_sleep={args.handler_sleep} "
        f"publishers={args.publishers} rtt_ms={args.rtt} rounds={args.rounds}"
    )
    print(f"{args.mode}_msgs_per_s={rate:.1f}")


if __name__ == "__main__":
    main()
