"""Throughput of the ``nsq`` Spark data source on a local Spark (``local[2]``).

    python benchmarks/spark_throughput.py                      # against the in-memory emulator
    python benchmarks/spark_throughput.py --nsqd-tcp-address 127.0.0.1:4150 --nsqd-http-address 127.0.0.1:4151

``source``: ``--count`` messages are published first, then a streaming query reads them with
``readStream.format("nsq")`` into Spark's ``noop`` sink; the rate runs from the start of the
first non-empty micro-batch until the last message was read (and its batch committed).
``sink``: ``spark.range(count)`` rows of ``--size`` bytes go out with ``write.format("nsq")``
(after a small warm-up write that starts the Python workers).

The source reads on the executors, as by default (``--read-mode driver``: its driver-side
reader); against a real nsqd that needs ``--nsqd-http-address`` too.  ``--master
spark://HOST:PORT`` runs on a standalone cluster (its workers on this machine, or with
``PYSPARK_PYTHON`` and ``nsq_spark`` on theirs).  ``source: driver side ... CPU s per million rows`` is what the driver's
processes (this one, its JVM, their Python workers; with a ``local`` master the executors too,
and without ``--nsqd-tcp-address`` the emulator, which runs in this process) spent on the
source's query.

The last lines are ``spark_memory_source_rows_per_s=<float>``,
``spark_source_driver_cpu_s_per_million=<float>`` (the whole query),
``spark_source_driver_steady_cpu_s_per_million=<float>`` (after the warm-up batches),
``spark_source_driver_steady_cpu_s_per_million_without_jit=<float>`` (the same less what the
driver JVM's JIT compiler threads spent: a JVM compiles Spark's code for minutes after it
starts, a cost of its first minutes and not of each message),
``spark_source_msgs_per_s=<float>`` and
``spark_sink_msgs_per_s=<float>``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
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
        from nsq_emulator.loopback import serve_emulator

        with portal.wrap_async_context_manager(serve_emulator(lookupd=False)) as cluster:
            yield cluster.nsqd_tcp_addresses[0], portal, cluster


def publish(portal: BlockingPortal, addresses: str, topic: str, count: int, size: int) -> None:
    """``count`` messages of ``size`` bytes, spread evenly over the comma-separated nsqds."""
    body = b"x" * size
    nsqds = addresses.split(",")

    async def one(address: str, total: int) -> None:
        async with nsq_anyio.Producer(nsqd_tcp_addresses=[address], max_outstanding=16) as p:
            remaining = total

            async def worker() -> None:
                nonlocal remaining
                while remaining > 0:
                    # MPUB of 100, or fewer within nsqd's --max-body-size (5 MiB by default)
                    n = min(100, max(1, 4 * 1024 * 1024 // max(1, size)), remaining)
                    remaining -= n
                    await p.publish_many(topic, [body] * n)

            async with anyio.create_task_group() as tg:
                for _ in range(8):
                    tg.start_soon(worker)

    async def run() -> None:
        async with anyio.create_task_group() as tg:
            for i, address in enumerate(nsqds):
                tg.start_soon(one, address, count // len(nsqds) + (i < count % len(nsqds)))

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
    )
    if args.fs_checkpoint:
        spark = spark.config(
            "spark.sql.streaming.checkpointFileManagerClass",
            "org.apache.spark.sql.execution.streaming.checkpointing."
            "FileSystemBasedCheckpointFileManager",
        )
    spark = spark.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(NSQDataSource)
    return spark


class Progress:
    """The query's progress reports (``query.recentProgress``, polled: no listener calls back
    into this process while the query runs): rows and durations of each micro-batch."""

    def __init__(self) -> None:
        self.batches: list[dict[str, Any]] = []
        self.seen: set[int] = set()
        self.rows = 0

    def poll(self, query: Any) -> None:
        for p in self._new_reports(query):
            batch_id, rows = p["batchId"], p["numInputRows"]
            if batch_id in self.seen or not rows:
                continue
            self.seen.add(batch_id)
            start = datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp()
            durations = dict(p["durationMs"])
            self.batches.append(
                {
                    "rows": rows,
                    "start": start,
                    "end": start + durations.get("triggerExecution", 0) / 1000,
                    "durations": durations,
                }
            )
            self.rows += rows
        self.batches.sort(key=lambda b: b["start"])

    def _new_reports(self, query: Any) -> list[dict[str, Any]]:
        """The reports of the batches not seen yet, oldest first.  ``query.recentProgress``
        converts all (up to 100) reports on every call, JSON through py4j: about a tenth of a
        core at one poll a second, which the driver-side CPU figures would count as the
        source's.  With the JVM's query at hand, only the newest are converted."""
        jsq = getattr(query, "_jsq", None)
        if jsq is None:  # (Spark Connect)
            return [json.loads(p.json) for p in query.recentProgress]
        recent = jsq.recentProgress()
        new = []
        for i in range(len(recent) - 1, -1, -1):
            report = recent[i]
            if report.batchId() in self.seen:
                break
            new.append(json.loads(report.json()))
        return new[::-1]

    def rate(self, warmup: int) -> tuple[float, int, int]:
        """Rows per second over the batches after the first ``warmup`` (rows, batches)."""
        measured = self.batches[warmup:]
        if len(measured) < 2:
            raise SystemExit(f"only {len(self.batches)} batches: publish more (--count)")
        # from the end of the last warm-up batch (the next one's rows were already arriving)
        begin = self.batches[warmup - 1]["end"] if warmup else measured[0]["start"]
        rows = sum(b["rows"] for b in measured)
        return rows / (measured[-1]["end"] - begin), rows, len(measured)

    def profile(self, warmup: int) -> str:
        measured = self.batches[warmup:]
        keys = sorted({k for b in measured for k in b["durations"]})
        parts = []
        for key in keys:
            values = [b["durations"].get(key, 0) for b in measured]
            parts.append(f"{key} {sum(values) / len(values):.0f}")
        rows = sum(b["rows"] for b in measured) / len(measured)
        if os.environ.get("BENCH_TRACE"):
            for b in self.batches:
                print(f"  {b['start']:.3f} {b['end']:.3f} {b['rows']}", file=sys.stderr)
        return f"mean per batch ({rows:.0f} rows), ms: " + ", ".join(parts)


def cpu_seconds_of_this_process_tree() -> dict[str, float]:
    """CPU seconds (user + system) of this process and every process below it, those it
    reaped included (Linux ``/proc``; NaN elsewhere), by role: ``benchmark`` (this process),
    ``jvm`` (Spark's driver JVM; with a ``local`` master the executors too) and ``python``
    (the Python processes below the JVM: the source's runner, Spark's Python workers), and
    ``jit``: the JVM's live JIT compiler threads (``C1``/``C2 CompilerThread``), taken out of
    ``jvm``.  A process that ended counts in its parent's role from then on (the JVM reaps
    its Python workers), and a compiler thread that ended in ``jvm``, so a role's
    difference over a window can move a little to another."""
    import collections

    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    children: dict[int, list[int]] = collections.defaultdict(list)
    times: dict[int, int] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return {"benchmark": float("nan")}
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children[int(fields[1])].append(int(entry))
        # utime, stime, cutime, cstime (the reaped children's)
        times[int(entry)] = sum(int(x) for x in fields[11:15])
    roles: dict[str, float] = collections.defaultdict(float)
    me = os.getpid()
    todo = [(me, "benchmark")]
    while todo:
        pid, role = todo.pop()
        if pid != me:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    java = b"java" in f.read().split(b"\0")[0]
            except OSError:
                java = False
            role = "jvm" if java else "python"
        roles[role] += times.get(pid, 0) / tick
        if role == "jvm" and pid != me:
            jit = _jit_seconds(pid, tick)
            roles["jvm"] -= jit
            roles["jit"] += jit
        todo.extend((child, role) for child in children.get(pid, []))
    return dict(roles)


def _jit_seconds(pid: int, tick: int) -> float:
    """CPU seconds of the JIT compiler threads of the JVM ``pid`` that are alive."""
    total = 0
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0
    for thread in threads:
        try:
            with open(f"/proc/{pid}/task/{thread}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        name = stat[stat.find("(") + 1 : stat.rfind(")")]
        if name.startswith(("C1 CompilerThre", "C2 CompilerThre")):
            total += sum(int(x) for x in stat.rsplit(")", 1)[1].split()[11:13])
    return total / tick


def _total(cpu: dict[str, float]) -> float:
    return sum(cpu.values())


def run_query(
    args: argparse.Namespace, spark: Any, reader: Any, name: str, target: int
) -> tuple[float, float, float, float]:
    """Stream ``reader`` into the noop sink until ``target`` rows; the steady rate, and the
    CPU seconds of the driver side per million rows over the whole query and after the
    warm-up batches (the query's start, the JIT and Spark's planning workers left out)."""
    progress = Progress()
    checkpoint = tempfile.mkdtemp(prefix="nsq-spark-bench-")
    first = cpu_seconds_of_this_process_tree()
    warm: tuple[dict[str, float], int] | None = None
    query = reader.writeStream.format("noop").option("checkpointLocation", checkpoint).start()
    deadline = time.monotonic() + args.timeout
    try:
        while progress.rows < target:
            if query.exception() is not None:
                raise SystemExit(f"{name} query failed: {query.exception()}")
            if time.monotonic() > deadline:
                raise SystemExit(
                    f"{name}: only {progress.rows} of {target} rows in {args.timeout} s"
                )
            time.sleep(1.0)  # recentProgress keeps the last 100 batches
            progress.poll(query)
            if warm is None and len(progress.batches) >= args.warmup_batches:
                warm = (cpu_seconds_of_this_process_tree(), progress.rows)
        end = cpu_seconds_of_this_process_tree()
        steady = steady_without_jit = float("nan")
        by_role = ""
        if warm is not None and progress.rows > warm[1]:
            steady_rows = progress.rows - warm[1]
            steady = (_total(end) - _total(warm[0])) / steady_rows * 1e6
            jit = end.get("jit", 0.0) - warm[0].get("jit", 0.0)
            steady_without_jit = steady - jit / steady_rows * 1e6
            by_role = ", ".join(
                f"{role} {(end[role] - warm[0].get(role, 0.0)) / steady_rows * 1e6:.2f}"
                for role in sorted(end)
            )
        cpu = _total(end) - _total(first)
    finally:
        # stopping cancels the running batch, which Spark logs as errors: not news here
        spark.sparkContext.setLogLevel("OFF")
        query.stop()
        spark.sparkContext.setLogLevel("ERROR")
    rate, rows, batches = progress.rate(args.warmup_batches)
    print(
        f"{name}: {rows} rows in {batches} batches after {args.warmup_batches} warm-up "
        f"batches: {rate:.0f} rows/s",
        file=sys.stderr,
    )
    if args.profile:
        print(f"{name}: {progress.profile(args.warmup_batches)}", file=sys.stderr)
    per_million = cpu / progress.rows * 1e6
    print(
        f"{name}: driver side {cpu:.1f} CPU s, {per_million:.1f} per million rows "
        f"({steady:.1f} after the warm-up batches: {by_role}; "
        f"{steady_without_jit:.2f} without the JIT compilers)",
        file=sys.stderr,
    )
    return rate, per_million, steady, steady_without_jit


def bench_source(
    args: argparse.Namespace, spark: Any, address: str, portal: BlockingPortal, http: str | None
) -> tuple[float, float, float, float]:
    topic = f"spark-bench-{uuid.uuid4().hex[:8]}"
    publish(portal, address, topic, args.count, args.size)
    reader = spark.readStream.format("nsq")
    if args.columns != "all":
        reader = reader.schema(", ".join(f"{c} {_TYPES[c]}" for c in args.columns.split(",")))
    reader = reader.option("topic", topic).option("channel", "bench")
    reader = reader.option("read_mode", args.read_mode)
    if http and args.read_mode == "executors":  # the driver's reader asks no HTTP API
        reader = reader.option("nsqd_http_addresses", http)
    if args.num_partitions:  # an exact count on the driver, a minimum on the executors
        name = "num_partitions" if args.read_mode == "driver" else "min_partitions"
        reader = reader.option(name, str(args.num_partitions))
    if args.lookupd_http_address:
        reader = reader.option("lookupd_http_addresses", args.lookupd_http_address)
    else:
        reader = reader.option("nsqd_tcp_addresses", address)
    if args.max_in_flight:
        reader = reader.option("max_in_flight", str(args.max_in_flight))
    if args.max_messages_per_trigger:
        reader = reader.option("max_messages_per_trigger", str(args.max_messages_per_trigger))
    if args.max_messages_per_task:
        reader = reader.option("max_messages_per_task", str(args.max_messages_per_task))
    if args.max_bytes_per_trigger:
        reader = reader.option("max_bytes_per_trigger", str(args.max_bytes_per_trigger))
    return run_query(args, spark, reader.load(), "source", args.count)


_TYPES = {
    "body": "binary",
    "id": "string",
    "attempts": "int",
    "timestamp": "timestamp",
    "topic": "string",
    "nsqd": "string",
    "partition": "int",
    "trace_id": "bigint",
}


def bench_memory(args: argparse.Namespace, spark: Any) -> float:
    """The same rows from a trivial in-memory Python source: Spark's own limit here."""
    import pyarrow as pa
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

    size = args.size
    per_batch = args.memory_batch_rows
    partitions = args.num_partitions or 1

    class Part(InputPartition):
        def __init__(self, index: int, rows: int) -> None:
            super().__init__(index)
            self.rows = rows

    class Reader(DataSourceStreamReader):
        def initialOffset(self) -> dict[str, int]:
            return {"n": 0}

        def latestOffset(self) -> dict[str, int]:
            self.at = getattr(self, "at", 0) + per_batch
            return {"n": self.at}

        def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[Part]:
            rows = end["n"] - start["n"]
            step, extra = divmod(rows, partitions)
            return [Part(i, step + (i < extra)) for i in range(partitions)]

        def read(self, partition: Part) -> Any:
            body = b"x" * size
            yield pa.RecordBatch.from_arrays(
                [pa.array([body] * partition.rows, pa.binary())], names=["body"]
            )

        def commit(self, end: dict[str, int]) -> None:
            pass

    class Memory(DataSource):
        @classmethod
        def name(cls) -> str:
            return "memory_bench"

        def schema(self) -> str:
            return "body binary"

        def streamReader(self, schema: Any) -> Reader:
            return Reader()

    spark.dataSource.register(Memory)
    rate, *_ = run_query(
        args, spark, spark.readStream.format("memory_bench").load(), "memory", args.count
    )
    return rate


def bench_sink(
    args: argparse.Namespace, spark: Any, address: str, portal: BlockingPortal, cluster: Any
) -> float:
    topic = f"spark-bench-sink-{uuid.uuid4().hex[:8]}"

    def write(count: int) -> None:
        (
            spark.range(count, numPartitions=args.num_partitions or 2)
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
    parser.add_argument(
        "--lookupd-http-address",
        default=None,
        help="the source finds nsqd through this lookupd (publishing still goes to "
        "--nsqd-tcp-address, a comma-separated list: spread over them)",
    )
    parser.add_argument("--master", default="local[2]")
    parser.add_argument(
        "--read-mode",
        default="executors",
        choices=["driver", "executors"],
        help="the source's read_mode (default: the source's, executors: it needs "
        "--nsqd-http-address or --lookupd-http-address with --nsqd-tcp-address)",
    )
    parser.add_argument(
        "--nsqd-http-address", default=None, help="the HTTP address of --nsqd-tcp-address"
    )
    parser.add_argument("--count", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument(
        "--max-in-flight", type=int, default=0, help="default: the source's (read_mode driver)"
    )
    parser.add_argument(
        "--max-messages-per-trigger", type=int, default=0, help="default: the source's"
    )
    parser.add_argument(
        "--max-bytes-per-trigger",
        type=int,
        default=0,
        help="default: the source's (read_mode executors)",
    )
    parser.add_argument(
        "--max-messages-per-task",
        type=int,
        default=0,
        help="default: the source's (read_mode executors)",
    )
    parser.add_argument("--columns", default="all", help="all, or a comma-separated list")
    parser.add_argument(
        "--num-partitions",
        type=int,
        default=0,
        help="Spark partitions: the source's num_partitions (read_mode driver) or "
        "min_partitions (executors), the memory source's and the sink's (default: the source's)",
    )
    parser.add_argument("--warmup-batches", type=int, default=5)
    parser.add_argument(
        "--memory-batch-rows", type=int, default=50_000, help="rows per batch of the memory source"
    )
    parser.add_argument(
        "--fs-checkpoint",
        action="store_true",
        help="spark.sql.streaming.checkpointFileManagerClass: the file-system-based manager",
    )
    parser.add_argument("--profile", action="store_true", help="mean durations of each batch")
    parser.add_argument("--skip", default="", help="comma-separated: source, memory, sink")
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args()
    if (
        args.read_mode == "executors"
        and args.nsqd_tcp_address
        and not (args.nsqd_http_address or args.lookupd_http_address)
    ):
        parser.error(
            "--read-mode executors (the default) asks nsqd's HTTP API how many messages wait: "
            "give --nsqd-http-address (or --lookupd-http-address), or --read-mode driver"
        )
    skip = set(args.skip.split(","))
    source_rate = memory_rate = sink_rate = source_cpu = steady_cpu = float("nan")
    steady_without_jit = float("nan")
    with nsqd(args) as (address, portal, cluster):
        spark = spark_session(args)
        try:
            if "memory" not in skip:
                memory_rate = bench_memory(args, spark)
            if "source" not in skip:
                http = args.nsqd_http_address
                if http is None and cluster is not None:  # the emulator's
                    http = cluster.nsqd_http_addresses[0]
                source_rate, source_cpu, steady_cpu, steady_without_jit = bench_source(
                    args, spark, address, portal, http
                )
            if "sink" not in skip:
                sink_rate = bench_sink(args, spark, address.split(",")[0], portal, cluster)
        finally:
            spark.stop()
    print(f"spark_memory_source_rows_per_s={memory_rate:.1f}")
    print(f"spark_source_driver_cpu_s_per_million={source_cpu:.2f}")
    print(f"spark_source_driver_steady_cpu_s_per_million={steady_cpu:.2f}")
    print(f"spark_source_driver_steady_cpu_s_per_million_without_jit={steady_without_jit:.2f}")
    print(f"spark_source_msgs_per_s={source_rate:.1f}")
    print(f"spark_sink_msgs_per_s={sink_rate:.1f}")


if __name__ == "__main__":
    main()
