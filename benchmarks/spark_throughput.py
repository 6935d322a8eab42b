"""Throughput of the ``nsq`` Spark data source on a local Spark (``local[2]``).

    python benchmarks/spark_throughput.py                      # against the in-memory emulator
    python benchmarks/spark_throughput.py --nsqd-tcp-address 127.0.0.1:4150 --count 200000

``source``: ``--count`` messages are published first, then a streaming query reads them with
``readStream.format("nsq")`` into Spark's ``noop`` sink; the rate runs from the start of the
first non-empty micro-batch until the last message was read (and its batch committed).
``sink``: ``spark.range(count)`` rows of ``--size`` bytes go out with ``write.format("nsq")``
(after a small warm-up write that starts the Python workers).

The last two lines are ``spark_source_msgs_per_s=<float>`` and ``spark_sink_msgs_per_s=<float>``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import anyio
from anyio.from_thread import BlockingPortal, start_blocking_portal

import nsq_anyio


@contextlib.contextmanager
def nsqd(args: argparse.Namespace) -> Iterator[tuple[str, BlockingPortal, Any]]:
    """The nsqd to use (the emulator unless ``--nsqd-tcp-address``), with a loop to talk to it."""
    with start_blocking_portal() as portal:
        if args.nsqd_tcp_address:
            yield args.nsqd_tcp_address, portal, None
            return
        from nsq_anyio._server import serve_emulator

        with portal.wrap_async_context_manager(serve_emulator(lookupd=False)) as cluster:
            yield cluster.nsqd_tcp_addresses[0], portal, cluster


def publish(portal: BlockingPortal, address: str, topic: str, count: int, size: int) -> None:
    body = b"x" * size

    async def run() -> None:
        async with nsq_anyio.Producer(nsqd_tcp_addresses=[address], max_outstanding=16) as p:
            remaining = count

            async def worker() -> None:
                nonlocal remaining
                while remaining > 0:
                    n = min(100, remaining)
                    remaining -= n
                    await p.publish_many(topic, [body] * n)

            async with anyio.create_task_group() as tg:
                for _ in range(8):
                    tg.start_soon(worker)

    portal.call(run)


def spark_session(args: argparse.Namespace) -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (root, os.environ.get("PYTHONPATH", "")) if p
    )
    from pyspark.sql import SparkSession

    from nsq_spark import NSQDataSource

    spark = (
        SparkSession.builder.master(args.master)
        .appName("nsq_spark throughput")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.streaming.pollingDelay", "10ms")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(NSQDataSource)
    return spark


def bench_source(
    args: argparse.Namespace, spark: Any, address: str, portal: BlockingPortal
) -> float:
    from pyspark.sql.streaming import StreamingQueryListener

    topic = f"spark-bench-{uuid.uuid4().hex[:8]}"
    publish(portal, address, topic, args.count, args.size)

    done = threading.Event()
    state: dict[str, Any] = {"rows": 0, "first": None, "end": None}

    class Progress(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            progress = event.progress
            if progress.numInputRows and state["first"] is None:
                state["first"] = datetime.fromisoformat(
                    progress.timestamp.replace("Z", "+00:00")
                ).timestamp()
            state["rows"] += progress.numInputRows
            if state["rows"] >= args.count and not done.is_set():
                state["end"] = time.time()
                done.set()

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            done.set()

    listener = Progress()
    spark.streams.addListener(listener)
    checkpoint = tempfile.mkdtemp(prefix="nsq-spark-bench-")
    query = (
        spark.readStream.format("nsq")
        .option("nsqd_tcp_addresses", address)
        .option("topic", topic)
        .option("channel", "bench")
        .option("max_in_flight", str(args.max_in_flight))
        .option("num_partitions", str(args.num_partitions))
        .option(
            "max_messages_per_trigger",
            str(args.max_messages_per_trigger or args.max_in_flight // 2),
        )
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", checkpoint)
        .start()
    )
    try:
        if not done.wait(args.timeout):
            raise SystemExit(
                f"source: only {state['rows']} of {args.count} rows in {args.timeout} s"
            )
        if query.exception() is not None:
            raise SystemExit(f"source query failed: {query.exception()}")
    finally:
        query.stop()
        spark.streams.removeListener(listener)
    elapsed = state["end"] - state["first"]
    print(f"source: {state['rows']} rows in {elapsed:.2f} s", file=sys.stderr)
    return float(state["rows"] / elapsed)


def bench_sink(
    args: argparse.Namespace, spark: Any, address: str, portal: BlockingPortal, cluster: Any
) -> float:
    topic = f"spark-bench-sink-{uuid.uuid4().hex[:8]}"

    def write(count: int) -> None:
        (
            spark.range(count, numPartitions=args.num_partitions)
            .selectExpr(f"repeat('x', {args.size}) as body")
            .write.format("nsq")
            .mode("append")
            .option("nsqd_tcp_addresses", address)
            .option("topic", topic)
            .save()
        )

    write(1000)  # warm-up: workers and their connections
    start = time.perf_counter()
    write(args.count)
    elapsed = time.perf_counter() - start
    if cluster is not None:
        nsqd = cluster.nsqds[0]

        async def count() -> int:
            return int(nsqd.topic_stats(topic).message_count)

        published = portal.call(count)
        if published != args.count + 1000:
            raise SystemExit(f"sink: nsqd has {published} messages, expected {args.count + 1000}")
    print(f"sink: {args.count} rows in {elapsed:.2f} s", file=sys.stderr)
    return args.count / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--nsqd-tcp-address", default=None, help="a real nsqd (default: emulator)")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--count", type=int, default=50_000)
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--max-in-flight", type=int, default=2500)
    parser.add_argument(
        "--max-messages-per-trigger", type=int, default=0, help="default: half of --max-in-flight"
    )
    parser.add_argument("--num-partitions", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args()
    with nsqd(args) as (address, portal, cluster):
        spark = spark_session(args)
        try:
            source_rate = bench_source(args, spark, address, portal)
            sink_rate = bench_sink(args, spark, address, portal, cluster)
        finally:
            spark.stop()
    print(f"spark_source_msgs_per_s={source_rate:.1f}")
    print(f"spark_sink_msgs_per_s={sink_rate:.1f}")


if __name__ == "__main__":
    main()
