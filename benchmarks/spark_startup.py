"""Start-up of the ``nsq`` Spark source: where a first ``availableNow`` read of a few small
messages into parquet spends its time, in a fresh process.

    python benchmarks/spark_startup.py --nsqd-tcp-address 127.0.0.1:4150 --nsqd-http-address 127.0.0.1:4151

``--count`` messages of ``--size`` bytes are published to nsqd (a real one; without
``--nsqd-tcp-address`` the emulator, in this process), then, timed from the start: the Spark
session (``local[2]`` by default), ``load()`` (Spark asks the source's schema in a Python
worker), and the query, from ``start()`` to its end (an ``availableNow`` run of one batch:
its first output is its end).  The source is ``nsq_spark``'s, wrapped so that each Python
process that runs it notes when it started and when Spark first called it (the difference is
the process's start: the interpreter, its imports, unpickling), and a task notes its phases:
the staging location's checks, consuming its share, staging its rows, answering nsqd.  Spark's
own figures come from the query's progress report (``durationMs``) and its event log (each
task's launch, deserialization and run).

``--repeat N`` runs the query N times in the same session (new topics): the runs after the
first show what is left once the Python processes are up.

The last lines are ``spark_startup_session_s=<float>``, ``spark_startup_load_s=<float>``,
``spark_startup_query_s=<float>`` (the first query's start to its end) and
``spark_startup_first_output_s=<float>`` (the process's start to the first query's end).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

PROCESS_START = time.time()
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, ROOT)

#: where the wrapped source's processes append their notes (one JSON object a line)
NOTES = "NSQ_SPARK_STARTUP_NOTES"


def _process_started() -> float:
    """When this process started (the wall clock), from ``/proc`` (Linux; else now)."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime"))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, StopIteration):
        return time.time()


def note(what: str, **values: Any) -> None:
    """Append a note of this process (its pid and start) to the notes file."""
    path = os.environ.get(NOTES)
    if not path:
        return
    entry = {"what": what, "pid": os.getpid(), "started": _process_started(), "at": time.time()}
    entry.update(values)
    with open(path, "a") as f:
        f.write(json.dumps(entry) + "\n")


def timed_source() -> Any:
    """``NSQDataSource`` with notes (defined here, so Spark ships it to its Python processes
    by value: the notes need no change to the source)."""
    from nsq_spark import NSQDataSource
    from nsq_spark import _executor_source as executor_source
    from nsq_spark._staging import Staging

    class TimedReader(executor_source.NSQExecutorStreamReader):
        def prepareForTriggerAvailableNow(self) -> None:
            note("first call in the source runner (prepareForTriggerAvailableNow)")
            start = time.time()
            super().prepareForTriggerAvailableNow()
            note("availableNow's backlog asked of nsqd", seconds=time.time() - start)

        def latestOffset(self, start: dict[str, Any], limit: Any) -> dict[str, Any]:
            began = time.time()
            end = super().latestOffset(start, limit)
            parts = len(end.get("parts", []))
            note("latestOffset", seconds=time.time() - began, parts=parts)
            return end

        def read(self, partition: Any) -> Iterator[Any]:
            note("task: read called")
            phases = _timed_phases(executor_source, Staging)
            began = time.time()
            rows = 0
            for batch in super().read(partition):
                rows += batch.num_rows
                yield batch
            note(
                "task: read done",
                seconds=time.time() - began,
                rows=rows,
                phases=phases,
                pandas_imported="pandas" in sys.modules,
            )

        def commit(self, end: dict[str, Any]) -> None:
            began = time.time()
            super().commit(end)
            note("commit", seconds=time.time() - began)

    class TimedSource(NSQDataSource):
        def schema(self) -> Any:
            note("schema")
            return super().schema()

        def streamReader(self, schema: Any) -> Any:
            note("streamReader")
            reader = super().streamReader(schema)
            if isinstance(reader, executor_source.NSQExecutorStreamReader):
                timed = TimedReader.__new__(TimedReader)
                timed.__dict__.update(reader.__dict__)
                return timed
            return reader

    return TimedSource


def _timed_phases(executor_source: Any, staging: Any) -> dict[str, float]:
    """Wrap the task's phases in this process (once) with timers; the seconds of each."""
    phases: dict[str, float] = executor_source.__dict__.setdefault("_startup_phases", {})
    phases.clear()
    if getattr(executor_source, "_startup_timed", False):
        return phases
    executor_source._startup_timed = True

    def timed(owner: Any, name: str, label: str) -> None:
        inner = getattr(owner, name)
        if _is_coroutine(inner):

            async def wrapper_async(*args: Any, **kwargs: Any) -> Any:
                start = time.perf_counter()
                try:
                    return await inner(*args, **kwargs)
                finally:
                    phases[label] = phases.get(label, 0.0) + time.perf_counter() - start

            setattr(owner, name, wrapper_async)
        else:

            def wrapper(*args: Any, **kwargs: Any) -> Any:
                start = time.perf_counter()
                try:
                    return inner(*args, **kwargs)
                finally:
                    phases[label] = phases.get(label, 0.0) + time.perf_counter() - start

            setattr(owner, name, wrapper)

    timed(staging, "read", "staged rows looked up")
    timed(staging, "check_shared", "staging location checked")
    timed(staging, "suspects", "redelivered ids read")
    timed(executor_source._Share, "consume", "consume (connect, take the share)")
    timed(staging, "publish", "stage the rows")
    timed(executor_source._Share, "answer", "FIN")
    timed(executor_source, "_consume_and_stage", "the whole of consume and stage")
    return phases


def _is_coroutine(func: Any) -> bool:
    import inspect

    return inspect.iscoroutinefunction(func)


def publish(args: argparse.Namespace, topic: str) -> tuple[str, str, Any]:
    """Publish the messages; nsqd's TCP and HTTP addresses (and the emulator to keep open)."""
    import anyio
    from anyio.from_thread import start_blocking_portal

    import nsq_anyio

    body = b"x" * args.size
    portal_cm = start_blocking_portal()
    portal = portal_cm.__enter__()
    emulator = None
    tcp, http = args.nsqd_tcp_address, args.nsqd_http_address
    if tcp is None:
        from nsq_emulator.loopback import serve_emulator

        emulator = portal.wrap_async_context_manager(serve_emulator(lookupd=False))
        cluster = emulator.__enter__()
        tcp, http = cluster.nsqd_tcp_addresses[0], cluster.nsqd_http_addresses[0]

    async def run() -> None:
        async with nsq_anyio.Producer(nsqd_tcp_addresses=[tcp]) as producer:
            for i in range(0, args.count, 100):
                await producer.publish_many(topic, [body] * min(100, args.count - i))
        await anyio.sleep(0)

    portal.call(run)
    return tcp, http, (portal_cm, emulator)


def task_events(events: Path) -> list[dict[str, Any]]:
    found = []
    for log in events.rglob("*"):
        if not log.is_file() or log.name.startswith("."):
            continue
        for line in log.read_text().splitlines():
            event = json.loads(line)
            if event.get("Event") == "SparkListenerTaskEnd":
                found.append(event)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--nsqd-tcp-address", default=None, help="a real nsqd (default: emulator)")
    parser.add_argument("--nsqd-http-address", default=None, help="its HTTP address")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=1, help="queries in the same session")
    args = parser.parse_args()
    if args.nsqd_tcp_address and not args.nsqd_http_address:
        parser.error("--nsqd-http-address: the source asks nsqd's HTTP API what waits")
    work = Path(tempfile.mkdtemp(prefix="nsq-spark-startup-"))
    os.environ[NOTES] = str(work / "notes.jsonl")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p
    )
    topics = [f"spark-startup-{uuid.uuid4().hex[:8]}" for _ in range(args.repeat)]
    held = []
    for topic in topics:
        tcp, http, keep = publish(args, topic)
        held.append(keep)
        args.nsqd_tcp_address, args.nsqd_http_address = tcp, http
    events = work / "events"
    events.mkdir()

    t0 = time.time()
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master(args.master)
        .appName("nsq_spark start-up")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.eventLog.enabled", "true")
        .config("spark.eventLog.dir", events.as_uri())
        .config("spark.eventLog.compress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    session_s = time.time() - t0
    spark.dataSource.register(timed_source())
    queries = []
    load_s = 0.0
    for i, topic in enumerate(topics):
        began = time.time()
        df = (
            spark.readStream.format("nsq")
            .option("nsqd_tcp_addresses", args.nsqd_tcp_address)
            .option("nsqd_http_addresses", args.nsqd_http_address)
            .option("topic", topic)
            .option("channel", "startup")
            .option("staging_location", str(work / "staging"))
            .load()
        )
        if i == 0:
            load_s = time.time() - began
        started = time.time()
        query = (
            df.writeStream.format("parquet")
            .option("path", str(work / f"out{i}"))
            .option("checkpointLocation", str(work / f"cp{i}"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        ended = time.time()
        if query.exception() is not None:
            raise SystemExit(f"the query failed: {query.exception()}")
        rows = spark.read.parquet(str(work / f"out{i}")).count()
        progress = [json.loads(p.json) for p in query.recentProgress]
        queries.append((started, ended, rows, progress))
    spark.stop()
    for portal_cm, emulator in held:
        if emulator is not None:
            emulator.__exit__(None, None, None)
        portal_cm.__exit__(None, None, None)

    notes = [json.loads(line) for line in (work / "notes.jsonl").read_text().splitlines()]
    tasks = task_events(events)
    print(f"session: {session_s:.2f} s; load(): {load_s:.2f} s", file=sys.stderr)
    for i, (started, ended, rows, progress) in enumerate(queries):
        print(
            f"query {i}: {rows} rows, start() to its end {ended - started:.2f} s "
            f"({ended - PROCESS_START:.2f} s after the process started)",
            file=sys.stderr,
        )
        for p in progress:
            if p.get("numInputRows"):
                d = p["durationMs"]
                shown = ", ".join(f"{k} {v}" for k, v in sorted(d.items(), key=lambda x: -x[1]))
                print(
                    f"  batch {p['batchId']}: {p['numInputRows']} rows, ms: {shown}",
                    file=sys.stderr,
                )
        window = [n for n in notes if started - 30 <= n["at"] <= ended]
        for n in window if i == 0 else [n for n in window if n["at"] >= started]:
            extra = {k: v for k, v in n.items() if k not in ("what", "pid", "started", "at")}
            print(
                f"  {n['at'] - started:+7.2f} s  pid {n['pid']} (started "
                f"{n['started'] - started:+.2f} s): {n['what']}"
                + (f" {json.dumps(extra)}" if extra else ""),
                file=sys.stderr,
            )
        for t in tasks:
            info, metrics = t["Task Info"], t.get("Task Metrics") or {}
            launched = info["Launch Time"] / 1000
            if not started <= launched <= ended:
                continue
            print(
                f"  task {info['Task ID']}: launched {launched - started:+.2f} s, "
                f"{(info['Finish Time'] - info['Launch Time']) / 1000:.2f} s "
                f"(deserialize {metrics.get('Executor Deserialize Time', 0) / 1000:.2f}, run "
                f"{metrics.get('Executor Run Time', 0) / 1000:.2f})",
                file=sys.stderr,
            )
    first_started, first_ended, _, _ = queries[0]
    print(f"spark_startup_session_s={session_s:.2f}")
    print(f"spark_startup_load_s={load_s:.2f}")
    print(f"spark_startup_query_s={first_ended - first_started:.2f}")
    print(f"spark_startup_first_output_s={first_ended - PROCESS_START:.2f}")


if __name__ == "__main__":
    main()
