"""``format("nsq")`` in a real local Spark (local[2]) against the emulator on loopback.

Every test uses its own topic, so they share the session's emulator and Spark."""

from __future__ import annotations

import collections
import json
import os
import re
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F

from nsq_spark._rows import message_id

from .helpers import Emulator, run_available_now, wait_for

pytestmark = pytest.mark.spark


def source(spark: Any, emulator: Emulator, topic: str, **options: object) -> Any:
    reader = (
        spark.readStream.format("nsq")
        .option("nsqd_tcp_addresses", emulator.address)
        .option("topic", topic)
        .option("channel", "spark")
    )
    if options.get("read_mode") != "driver":  # the executors ask nsqd's HTTP API
        reader = reader.option("nsqd_http_addresses", emulator.http_address)
    for name, value in options.items():
        reader = reader.option(name, str(value))
    return reader.load()


def parquet_rows(spark: Any, path: Path) -> list[Any]:
    if not (path / "_spark_metadata").exists():
        return []
    try:
        return list(spark.read.parquet(str(path)).collect())
    except Exception as exc:  # nothing committed yet
        if "UNABLE_TO_INFER_SCHEMA" in str(exc) or "PATH_NOT_FOUND" in str(exc):
            return []
        raise


def settled(emulator: Emulator, topic: str, channel: str = "spark") -> Any:
    """The channel once nothing is queued or in flight (every message FINished)."""

    def check() -> Any:
        try:
            stats = emulator.channel_stats(topic, channel)
        except KeyError:  # not subscribed yet
            return None
        return stats if stats.depth == 0 and stats.in_flight_count == 0 else None

    return wait_for(check, timeout=30)


def bodies(n: int, prefix: str = "m") -> list[bytes]:
    return [f"{prefix}{i:05d}".encode() for i in range(n)]


def test_stream_into_parquet_delivers_every_message(
    spark: Any, emulator: Emulator, tmp_path: Path
) -> None:
    topic, n = "into-parquet", 300
    sent = bodies(n)
    emulator.publish(topic, sent)
    df = source(spark, emulator, topic, maxMessagesPerTrigger=40, minPartitions=2)
    out = tmp_path / "out"
    query = (
        df.writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(processingTime="100 milliseconds")
        .start()
    )
    try:
        rows = wait_for(lambda: (r := parquet_rows(spark, out)) and len(r) >= n and r)
        settled(emulator, topic)
        # batches respect maxMessagesPerTrigger
        progress = [p for p in query.recentProgress if p["numInputRows"]]
        assert progress and max(p["numInputRows"] for p in progress) <= 40
    finally:
        query.stop()
    assert sorted(r.body for r in rows) == sent  # each exactly once
    assert {r.attempts for r in rows} == {1}
    assert len({r.id for r in rows}) == n
    assert {(r.topic, r.nsqd, r.partition, r.trace_id) for r in rows} == {
        (topic, emulator.address, None, None)
    }
    assert all(r.timestamp is not None for r in rows)
    stats = emulator.channel_stats(topic, "spark")
    assert (stats.message_count, stats.requeue_count, stats.timeout_count) == (n, 0, 0)


def test_stop_and_restart_from_the_checkpoint_loses_nothing(
    spark: Any, emulator: Emulator, tmp_path: Path
) -> None:
    topic, n = "restart", 300
    sent = bodies(n)
    emulator.publish(topic, sent)
    out, checkpoint = tmp_path / "out", tmp_path / "cp"

    def start() -> Any:
        # msg_timeout 30 s: if the stopped reader did not requeue, nothing would come back
        # for 30 s
        df = source(
            spark,
            emulator,
            topic,
            max_in_flight=60,
            maxMessagesPerTrigger=20,
            msg_timeout=30,
            read_mode="driver",  # the reader that holds messages between batches
        )
        return (
            df.writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(checkpoint))
            .trigger(processingTime="100 milliseconds")
            .start()
        )

    query = start()
    try:
        wait_for(lambda: len(parquet_rows(spark, out)) >= 60)
    finally:
        query.stop()
    first_run = len(parquet_rows(spark, out))
    assert first_run < n, "the query should have been stopped in the middle"
    # the stopped reader requeued what it held (else nsqd would wait for msg_timeout)
    stopped = wait_for(
        lambda: (s := emulator.channel_stats(topic, "spark")).in_flight_count == 0 and s, 10
    )
    assert stopped.requeue_count > 0 and stopped.timeout_count == 0
    assert stopped.depth > 0

    query = start()
    try:
        rows = wait_for(
            lambda: (r := parquet_rows(spark, out)) and {x.body for x in r} == set(sent) and r
        )
        settled(emulator, topic)
    finally:
        query.stop()
    counts = collections.Counter(r.body for r in rows)
    duplicates = len(rows) - n
    print(f"restart: {first_run} rows before the stop, {duplicates} duplicates")
    assert set(counts) == set(sent)
    # a duplicate is a redelivery: same id, more attempts
    for body, count in counts.items():
        if count > 1:
            copies = [r for r in rows if r.body == body]
            assert len({r.id for r in copies}) == 1
            assert max(r.attempts for r in copies) >= 2
    assert duplicates <= 60  # at most what was held when the query stopped


def test_messages_are_finished_only_after_their_batch_committed(
    spark: Any, emulator: Emulator, tmp_path: Path
) -> None:
    topic, n = "fin-after-commit", 120
    emulator.publish(topic, bodies(n))
    seen: list[tuple[int, list[str], dict[str, str], bool]] = []
    previous: list[str] = []
    lock = threading.Lock()

    def on_batch(batch: Any, batch_id: int) -> None:
        ids = [r.id for r in batch.select("id").collect()]
        if not ids:
            return
        states = {message_id(m.id): m.state for m in emulator.channel_messages(topic, "spark")}
        # the batch before this one was committed: FINished by the time this one was planned
        deadline = time.monotonic() + 5
        while True:
            held = {message_id(m.id) for m in emulator.channel_messages(topic, "spark")}
            gone = not held.intersection(previous)
            if gone or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        with lock:
            seen.append((batch_id, ids, states, gone))
        previous[:] = ids

    # the driver-side reader FINishes once the batch is committed (on the executors, a task
    # FINishes once it has staged its rows)
    df = source(
        spark, emulator, topic, max_in_flight=40, maxMessagesPerTrigger=20, read_mode="driver"
    )
    query = (
        df.writeStream.foreachBatch(on_batch)
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(processingTime="100 milliseconds")
        .start()
    )
    try:
        wait_for(lambda: sum(len(s[1]) for s in seen) >= n)
        settled(emulator, topic)  # and the last batch is FINished once committed
    finally:
        query.stop()
    assert len(seen) >= n // 20
    for _batch_id, ids, states, gone in seen:
        # while the sink runs a batch, every message of it is still in flight at nsqd
        assert all(states.get(i) == "in_flight" for i in ids), states
        assert gone
    assert sorted(i for s in seen for i in s[1]) == sorted({i for s in seen for i in s[1]})


def test_held_messages_are_touched_while_a_batch_runs(
    spark: Any, emulator: Emulator, tmp_path: Path
) -> None:
    topic, n = "touch", 30
    sent = bodies(n)
    emulator.publish(topic, sent)
    got: list[bytes] = []

    def slow(batch: Any, batch_id: int) -> None:
        rows = batch.collect()
        if rows and not got:
            time.sleep(3.5)  # over three times msg_timeout
        got.extend(r.body for r in rows)

    df = source(spark, emulator, topic, max_in_flight=n, msg_timeout=1, read_mode="driver")
    query = (
        df.writeStream.foreachBatch(slow)
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(processingTime="100 milliseconds")
        .start()
    )
    try:
        wait_for(lambda: len(got) >= n)
        stats = settled(emulator, topic)
    finally:
        query.stop()
    assert sorted(got) == sent
    assert stats.timeout_count == 0 and stats.requeue_count == 0


def test_available_now_ends_and_loses_nothing(
    spark: Any, emulator: Emulator, tmp_path: Path
) -> None:
    topic, n = "available-now", 150
    first = bodies(n, "a")
    emulator.publish(topic, first)
    out, checkpoint = tmp_path / "out", tmp_path / "cp"

    def run() -> Any:
        df = source(spark, emulator, topic, maxMessagesPerTrigger=40)
        return run_available_now(df, out, checkpoint, timeout=120)

    query = run()
    batches = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert len(batches) >= 4 and max(batches) <= 40
    assert sorted(r.body for r in parquet_rows(spark, out)) == first
    # the last batch is FINished too, although Spark never commits it to the source
    settled(emulator, topic)

    later = bodies(50, "b")
    emulator.publish(topic, later)
    run()
    assert sorted(r.body for r in parquet_rows(spark, out)) == sorted(first + later)
    stats = settled(emulator, topic)
    assert stats.message_count == n + 50 and stats.requeue_count == 0


def test_batch_write_publishes_exactly_the_rows(spark: Any, emulator: Emulator) -> None:
    n = 500
    df = (
        spark.range(n)
        .selectExpr(
            "cast(id as string) as body",
            "case when id % 5 = 0 then 'batch-write-b' end as topic",
            "case when id < 3 then 0.2 end as delay",
        )
        .repartition(3)
    )
    (
        df.write.format("nsq")
        .mode("append")
        .option("nsqd_tcp_addresses", emulator.address)
        .option("topic", "batch-write-a")
        .option("batch_size", "64")
        .save()
    )
    to_b = [i for i in range(n) if i % 5 == 0]
    assert emulator.topic_stats("batch-write-a").message_count == n - len(to_b)
    assert emulator.topic_stats("batch-write-b").message_count == len(to_b)
    got_a = emulator.consume("batch-write-a", "check", n - len(to_b))
    got_b = emulator.consume("batch-write-b", "check", len(to_b))
    assert sorted(int(m.body) for m in got_a) == [i for i in range(n) if i % 5]
    assert sorted(int(m.body) for m in got_b) == to_b
    assert emulator.channel_stats("batch-write-a", "check").depth == 0


def test_batch_write_of_binary_bodies(spark: Any, emulator: Emulator) -> None:
    rows = [(bytes([i % 256]) * (i + 1),) for i in range(40)]
    df = spark.createDataFrame(rows, "body binary")
    (
        df.write.format("nsq")
        .mode("append")
        .option("nsqd_tcp_addresses", emulator.address)
        .option("topic", "binary-write")
        .save()
    )
    assert emulator.topic_stats("binary-write").message_count == 40
    got = emulator.consume("binary-write", "check", 40)
    assert sorted(m.body for m in got) == sorted(r[0] for r in rows)


def test_write_refuses_what_it_cannot_publish(spark: Any, emulator: Emulator) -> None:
    base = spark.range(3).selectExpr("cast(id as string) as body")
    writer = base.write.format("nsq").option("nsqd_tcp_addresses", emulator.address)
    with pytest.raises(Exception, match="topic"):
        writer.mode("append").save()  # no topic option, no topic column
    with pytest.raises(Exception, match="overwritten"):
        writer.option("topic", "t").mode("overwrite").save()
    with pytest.raises(Exception, match="body"):
        spark.range(3).write.format("nsq").option("nsqd_tcp_addresses", emulator.address).option(
            "topic", "t"
        ).mode("append").save()


def last_line(error: BaseException) -> str:
    """The last line of what Spark shows for an error (its SQLSTATE suffix and a streaming
    query's description aside), without Spark's words before ours (``[ERROR_CLASS] ...: ``)."""
    text = str(error).split("=== Streaming Query ===")[0]
    lines = [line.strip() for line in text.splitlines()]
    lines = [line for line in lines if line and not line.startswith("SQLSTATE")]
    return re.sub(r"^\[[A-Z_.]+\][^:]*: ", "", lines[-1])


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"maxInFlght": "3"}, "unknown option(s) of the nsq source: maxinflght"),
        ({"channel": None}, "the nsq data source needs the option 'channel'"),
        ({"topic": None}, "the nsq data source needs the option 'topic'"),
        ({"nsqd_tcp_addresses": "nohost"}, "'nohost' is not host:port"),
        ({"nsqd_tcp_addresses": "http://127.0.0.1:4150"}, "is not host:port (no scheme"),
        ({"max_in_flight": "0"}, "option 'max_in_flight' must be at least 1, not 0"),
        ({"max_in_flight": "-5"}, "option 'max_in_flight' must be at least 1, not -5"),
        ({"max_in_flight": "abc"}, "option 'max_in_flight' must be an integer, not 'abc'"),
        ({"topic": "a b"}, "option 'topic': 'a b' is not a topic name"),
        ({"channel": "a b"}, "option 'channel': 'a b' is not a channel name"),
    ],
)
def test_bad_source_options_fail_at_load(
    spark: Any, tmp_path: Path, options: dict[str, str | None], error: str
) -> None:
    values: dict[str, str | None] = {
        "nsqd_tcp_addresses": "127.0.0.1:4150",
        "topic": "t",
        "channel": "c",
        **options,
    }
    reader = spark.readStream.format("nsq")
    for name, value in values.items():
        if value is not None:
            reader = reader.option(name, value)
    with pytest.raises(Exception) as info:
        reader.load()
    assert last_line(info.value).startswith("nsq_spark.OptionError: ")
    assert error in last_line(info.value)

    # given a schema, Spark asks nothing of the source before the query starts: the query
    # then fails at once, and with the option error as its last line
    query = (
        reader.schema("body binary")
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "cp"))
        .start()
    )
    try:
        with pytest.raises(Exception) as info:
            query.awaitTermination(60)
    finally:
        query.stop()
    assert last_line(info.value).startswith("nsq_spark.OptionError: ")
    assert error in last_line(info.value)


def test_a_batch_read_says_to_read_a_stream_with_available_now(spark: Any) -> None:
    df = (
        spark.read.format("nsq")
        .option("nsqd_tcp_addresses", "127.0.0.1:4150")
        .option("nsqd_http_addresses", "127.0.0.1:4151")
        .option("topic", "t")
        .option("channel", "c")
        .load()
    )
    with pytest.raises(Exception) as info:
        df.collect()
    assert last_line(info.value) == (
        "nsq_spark.BatchReadNotSupported: the nsq source reads streams only (reading a queue consumes it, so"
        " a batch DataFrame would take messages away each time it is computed): read the"
        ' messages waiting now with spark.readStream.format("nsq") and'
        " .trigger(availableNow=True), which ends once it has read them, into a sink such as"
        " parquet or foreachBatch"
    )


def test_an_unreachable_nsqd_fails_the_query_after_connect_timeout(
    spark: Any, tmp_path: Path
) -> None:
    with socket.socket() as s, socket.socket() as h:
        s.bind(("127.0.0.1", 0))
        h.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"  # nothing listens there now
        http = f"127.0.0.1:{h.getsockname()[1]}"
    started = time.monotonic()
    query = (
        spark.readStream.format("nsq")
        .option("nsqd_tcp_addresses", address)
        .option("nsqd_http_addresses", http)
        .option("topic", "t")
        .option("channel", "c")
        .option("connect_timeout", "2")
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "cp"))
        .start()
    )
    try:
        with pytest.raises(Exception) as info:
            query.awaitTermination(60)
    finally:
        query.stop()
    assert time.monotonic() - started < 20
    assert last_line(info.value).startswith(
        "nsq_spark.ConnectTimeout: the nsq source of t/c has no nsqd to consume from after"
        f" connect_timeout (2 s) (nsqd {address} (HTTP {http})); last error: nsqd: {http}: "
    )


def test_a_failed_publish_fails_the_write_after_one_try_on_local(
    spark: Any, tmp_path: Path
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"  # nothing listens there now
    rows = spark.range(3, numPartitions=1).selectExpr("cast(id as string) as body")
    context = spark.sparkContext
    context.setJobGroup("failed-publish", "a publish to nowhere")
    try:
        with pytest.raises(Exception) as info:
            (
                rows.write.format("nsq")
                .option("nsqd_tcp_addresses", address)
                .option("topic", "t")
                .option("publish_timeout", "2")
                .mode("append")
                .save()
            )
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)
    # every nsqd refused: the write fails at once, naming the refusal (not after the timeout)
    line = last_line(info.value)
    assert f"could not connect to any nsqd: connecting to {address} failed" in line, line
    assert "connection refused" in line, line
    # local[N] tries a task once (local[N,M]: M times; a cluster: spark.task.maxFailures)
    assert context.master == "local[2]"
    tracker = context.statusTracker()
    (job,) = tracker.getJobIdsForGroup("failed-publish")
    job_info = tracker.getJobInfo(job)
    assert job_info is not None and job_info.status == "FAILED"
    stages = [tracker.getStageInfo(stage) for stage in job_info.stageIds]
    assert [(s.numTasks, s.numFailedTasks) for s in stages if s is not None] == [(1, 1)]


def test_bad_sink_options_fail_before_any_task(spark: Any, tmp_path: Path) -> None:
    rows = spark.range(3).selectExpr("cast(id as string) as body")
    writer = rows.write.format("nsq").option("nsqd_tcp_addresses", "127.0.0.1:4150")
    with pytest.raises(Exception) as info:
        writer.option("topic", "a b").mode("append").save()
    assert last_line(info.value) == (
        "nsq_spark.OptionError: option 'topic': 'a b' is not a topic name (1 to 64 of"
        " a-z A-Z 0-9 . _ -, optionally ending in #ephemeral)"
    )
    with pytest.raises(Exception) as info:
        writer.option("topic", "t").option("batch_size", "0").mode("append").save()
    assert last_line(info.value).startswith("nsq_spark.OptionError: option 'batch_size'")
    stream = (
        spark.readStream.format("rate")
        .load()
        .selectExpr("cast(value as string) as body")
        .writeStream.format("nsq")
        .option("nsqd_tcp_addresses", "127.0.0.1:4150")
        .option("topic", "a b")
        .option("checkpointLocation", str(tmp_path / "cp"))
    )
    with pytest.raises(Exception) as info:
        stream.start().awaitTermination(60)
    assert "nsq_spark.OptionError: option 'topic': 'a b' is not a topic name" in last_line(
        info.value
    )


def test_stream_from_topic_to_topic(spark: Any, emulator: Emulator, tmp_path: Path) -> None:
    n = 200
    sent = bodies(n)
    emulator.publish("pipe-in", sent)
    df = source(spark, emulator, "pipe-in")
    query = (
        df.selectExpr("upper(cast(body as string)) as body")
        .writeStream.format("nsq")
        .option("nsqd_tcp_addresses", emulator.address)
        .option("topic", "pipe-out")
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(processingTime="100 milliseconds")
        .start()
    )
    try:
        wait_for(lambda: _count(emulator, "pipe-out") >= n)
        settled(emulator, "pipe-in")
        time.sleep(0.5)
    finally:
        query.stop()
    assert emulator.topic_stats("pipe-out").message_count == n
    got = emulator.consume("pipe-out", "check", n)
    assert sorted(m.body for m in got) == [b.upper() for b in sent]


def test_read_aggregate_write(spark: Any, emulator: Emulator, tmp_path: Path) -> None:
    """The README's pipeline: count events per user and window, publish each closed window."""
    events = [f'{{"user": "u{i % 3}"}}'.encode() for i in range(30)]
    emulator.publish("agg-in", events)
    df = source(spark, emulator, "agg-in")
    counts = (
        df.withWatermark("timestamp", "1 second")
        .groupBy(
            F.window("timestamp", "2 seconds"),
            F.get_json_object(F.col("body").cast("string"), "$.user").alias("user"),
        )
        .count()
        .select(F.to_json(F.struct("window.start", "user", "count")).alias("body"))
    )
    query = (
        counts.writeStream.format("nsq")
        .option("nsqd_tcp_addresses", emulator.address)
        .option("topic", "agg-out")
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        settled(emulator, "agg-in")
        time.sleep(3.5)  # a later event moves the watermark past the events' windows
        emulator.publish("agg-in", [b'{"user": "tick"}'])
        rows = wait_for(lambda: _results(emulator, "agg-out"), timeout=60)
    finally:
        query.stop()
    totals: collections.Counter[str] = collections.Counter()
    for row in rows:
        totals[row["user"]] += row["count"]
    assert totals == {"u0": 10, "u1": 10, "u2": 10}
    assert len({(r["start"], r["user"]) for r in rows}) == len(rows)  # each window once


_consumed: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)


def _results(emulator: Emulator, topic: str) -> list[dict[str, Any]] | None:
    """What ``topic`` received so far, once 30 events are counted."""
    got = _consumed[topic]
    new = _count(emulator, topic) - len(got)
    if new > 0:
        got.extend(json.loads(m.body) for m in emulator.consume(topic, "check", new))
    return got if sum(r["count"] for r in got if r["user"] != "tick") >= 30 else None


def _count(emulator: Emulator, topic: str) -> int:
    try:
        return emulator.topic_stats(topic).message_count
    except KeyError:
        return 0


def test_a_narrower_schema_selects_columns(spark: Any, emulator: Emulator, tmp_path: Path) -> None:
    topic = "narrow"
    emulator.publish(topic, [b"one", b"two"])
    got: list[Any] = []
    df = (
        spark.readStream.format("nsq")
        .schema("body string, attempts int")
        .option("nsqd_tcp_addresses", emulator.address)
        .option("nsqd_http_addresses", emulator.http_address)
        .option("topic", topic)
        .option("channel", "spark")
        .load()
    )
    query = (
        df.writeStream.foreachBatch(lambda batch, _: got.extend(batch.collect()))
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(processingTime="100 milliseconds")
        .start()
    )
    try:
        wait_for(lambda: len(got) >= 2)
    finally:
        query.stop()
    assert sorted((r.body, r.attempts) for r in got) == [("one", 1), ("two", 1)]
    assert got[0].__fields__ == ["body", "attempts"]


def _python_cpu_seconds_below(pid: int) -> float:
    """CPU seconds used so far by the Python processes started below ``pid`` (Spark's workers
    and the source's runner; not the JVM)."""
    tick = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[int]] = collections.defaultdict(list)
    stats: dict[int, list[str]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                exe = os.readlink(entry / "exe")
            except OSError:
                continue
            stats[int(entry.name)] = [*fields, exe]
            children[int(fields[1])].append(int(entry.name))
    total, todo = 0.0, list(children[pid])
    while todo:
        p = todo.pop()
        todo.extend(children[p])
        fields = stats[p]
        if "python" in Path(fields[-1]).name:
            total += (int(fields[11]) + int(fields[12])) / tick  # utime + stime
    return total


def test_an_idle_topic_makes_no_batch_and_a_new_message_comes_within_a_trigger(
    spark: Any, emulator: Emulator, tmp_path: Path
) -> None:
    topic, trigger = "freshness", 1.0
    emulator.publish(topic, [b"first"])
    arrived: dict[bytes, float] = {}
    batch_ids: list[int] = []

    def on_batch(batch: Any, batch_id: int) -> None:
        now = time.monotonic()
        batch_ids.append(batch_id)
        for row in batch.select("body").collect():
            arrived.setdefault(row.body, now)

    df = source(spark, emulator, topic)  # the defaults: batches of up to 1,000,000
    query = (
        df.writeStream.foreachBatch(on_batch)
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(processingTime=f"{trigger} seconds")
        .start()
    )
    try:
        wait_for(lambda: b"first" in arrived)
        time.sleep(2 * trigger)  # the batch after "first" ran; the reader is settled
        # idle: no batch, and (almost) no CPU in the source's process
        batches, cpu = len(batch_ids), _python_cpu_seconds_below(os.getpid())
        idle = 5.0
        time.sleep(idle)
        idle_batches = len(batch_ids) - batches
        idle_cpu = _python_cpu_seconds_below(os.getpid()) - cpu
        # a message published now waits at most about one trigger interval plus one batch
        waits = []
        for i in range(4):
            body = f"late{i}".encode()
            published = time.monotonic()
            emulator.publish(topic, [body])

            def has_arrived(b: bytes = body) -> bool:
                return b in arrived

            wait_for(has_arrived, timeout=20, interval=0.02)
            waits.append(arrived[body] - published)
            time.sleep(0.37 * (i + 1))  # at a different point of the trigger each time
        durations = [
            p["durationMs"]["triggerExecution"] / 1000
            for p in query.recentProgress
            if p["numInputRows"]
        ]
    finally:
        query.stop()
    print(
        f"idle {idle} s: {idle_batches} batches, {idle_cpu:.3f} CPU s in Python; "
        f"waits {[round(w, 3) for w in waits]}, batches took {durations}"
    )
    assert idle_batches == 0
    assert idle_cpu < 0.05 * idle
    assert max(waits) < trigger + max(durations) + 0.5


def test_an_idle_query_with_the_default_trigger_does_not_spin(
    spark: Any, emulator: Emulator, tmp_path: Path
) -> None:
    # with the default trigger Spark asks the source for new data every 10 ms while there is
    # none; the source looks at nsqd's depth no more often than every 100 ms
    topic = "idle-default-trigger"
    emulator.publish(topic, [b"first"])
    arrived: dict[bytes, float] = {}

    def on_batch(batch: Any, batch_id: int) -> None:
        now = time.monotonic()
        for row in batch.select("body").collect():
            arrived.setdefault(row.body, now)

    query = (
        source(spark, emulator, topic)
        .writeStream.foreachBatch(on_batch)
        .option("checkpointLocation", str(tmp_path / "cp"))
        .start()
    )
    try:
        wait_for(lambda: b"first" in arrived)
        time.sleep(1.0)
        cpu = _python_cpu_seconds_below(os.getpid())
        idle = 5.0
        time.sleep(idle)
        idle_cpu = _python_cpu_seconds_below(os.getpid()) - cpu
        published = time.monotonic()
        emulator.publish(topic, [b"late"])
        wait_for(lambda: b"late" in arrived, timeout=20, interval=0.02)
        wait = arrived[b"late"] - published
    finally:
        query.stop()
    print(f"idle {idle} s: {idle_cpu:.3f} CPU s in Python; a new message after {wait:.3f} s")
    assert idle_cpu < 0.03 * idle
    assert wait < 1.5  # the 100 ms between looks, then a batch
