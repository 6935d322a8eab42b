"""The executor-side source without a JVM: its options, the staging location, and the reader
called the way Spark calls it (the driver's calls and the tasks' ``read``) against the
emulator.  How a batch is planned is ``test_planning``'s."""

from __future__ import annotations

import gc
import json
import pickle
import time
import urllib.request
from pathlib import Path
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]  # no type information (as in nsq_spark)
import pytest

from nsq_spark import SCHEMA, ConnectTimeout, NSQDataSource, NSQExecutorStreamReader, OptionError
from nsq_spark._executor_source import NSQStagedPartition
from nsq_spark._options import parse_source_options
from nsq_spark._planning import Part, plan_batch
from nsq_spark._staging import Staging, StagingNotShared

from .helpers import NSQD, Emulator

# -- options ---------------------------------------------------------------------------------


def test_executors_are_the_default_and_need_nsqds_http_addresses() -> None:
    base = {"topic": "t", "channel": "c"}
    o = parse_source_options(
        {**base, "nsqd_tcp_addresses": "a:1,b:1", "nsqdHttpAddresses": "a:2,b:2"}
    )
    assert (o.read_mode, o.nsqd_http_addresses) == ("executors", ("a:2", "b:2"))
    limits = (o.max_messages_per_trigger, o.max_bytes_per_trigger)
    assert limits == (1_000_000, 256 << 20)
    assert (o.max_messages_per_task, o.max_bytes_per_task) == (100_000, 32 << 20)
    assert parse_source_options({**base, "lookupd_http_addresses": "l:1"}).read_mode == "executors"
    reader = NSQDataSource({**base, "lookupd_http_addresses": "l:1"}).streamReader(SCHEMA)
    assert isinstance(reader, NSQExecutorStreamReader)
    for options, message in [
        ({"nsqd_tcp_addresses": "a:1"}, "needs nsqd_http_addresses"),
        ({"nsqd_tcp_addresses": "a:1,b:1", "nsqd_http_addresses": "a:2"}, "one for each"),
        ({"lookupd_http_addresses": "l:1", "channel": "c#ephemeral"}, "read_mode 'driver'"),
        ({"lookupd_http_addresses": "l:1", "ordered": "true"}, "'ordered' needs read_mode"),
        ({"lookupd_http_addresses": "l:1", "read_mode": "nowhere"}, "executors or driver"),
        ({"lookupd_http_addresses": "l:1", "max_bytes_per_trigger": "0"}, "at least 1"),
        ({"lookupd_http_addresses": "l:1", "max_bytes_per_task": "0"}, "at least 1"),
    ]:
        with pytest.raises(OptionError, match=message):
            parse_source_options({**base, **options})


# -- staging ---------------------------------------------------------------------------------


def test_staging_first_writer_wins_and_commit_deletes(tmp_path: Path) -> None:
    staging = Staging(str(tmp_path / "stage"))
    copy = pickle.loads(pickle.dumps(staging))
    with pytest.raises(StagingNotShared, match="staging_location"):
        copy.check_shared("run1")
    staging.mark("run1")
    copy.check_shared("run1")
    first = pa.table({"body": [b"a", b"b"]})
    second = pa.table({"body": [b"other"]})
    assert staging.read("run1", 1, 0) is None
    assert copy.publish("run1", 1, 0, first) is True
    assert staging.publish("run1", 1, 0, second) is False  # lost: the first rows stay
    assert staging.read("run1", 1, 0) == first
    assert copy.publish("run1", 2, 0, pa.table({"body": pa.array([], pa.binary())})) is True
    empty = staging.read("run1", 2, 0)
    assert empty is not None and empty.num_rows == 0  # staged empty: replays as empty
    assert sorted(p.name for p in (tmp_path / "stage" / "run1" / "1").iterdir()) == ["0.arrow"]
    assert staging.delete_through("run1", 1) == 1
    assert staging.read("run1", 1, 0) is None and staging.read("run1", 2, 0) is not None


# -- the reader against the emulator ---------------------------------------------------------


def reader(emulator: Emulator, topic: str, tmp_path: Path, **options: object) -> Any:
    values = {
        "topic": topic,
        "channel": "c",
        "nsqd_tcp_addresses": emulator.address,
        "nsqd_http_addresses": emulator.http_address,
        "staging_location": str(tmp_path / "stage"),
        "task_idle_timeout": "0.3",
        **{k: str(v) for k, v in options.items()},
    }
    source = NSQDataSource(values)
    made = source.streamReader(SCHEMA)
    assert isinstance(made, NSQExecutorStreamReader)
    return pickle.loads(pickle.dumps(made))  # as Spark ships it


def rows(r: Any, part: Any) -> list[dict[str, Any]]:
    # each task runs in a worker process of its own: a copy of the reader
    task = pickle.loads(pickle.dumps(r))
    return [row for batch in task.read(part) for row in batch.to_pylist()]


def plan_next(r: Any, start: dict[str, Any]) -> tuple[dict[str, Any], list[Any]]:
    end = r.latestOffset(start, r.getDefaultReadLimit())
    return end, list(r.partitions(start, end))


def test_tasks_consume_stage_and_replay(emulator: Emulator, tmp_path: Path) -> None:
    topic, n = "exec-replay", 90
    emulator.publish(topic, [f"m{i:03d}".encode() for i in range(n)])
    r = reader(emulator, topic, tmp_path, max_messages_per_trigger=40, min_partitions=2)
    start = r.initialOffset()
    seen: list[bytes] = []
    while True:
        end, parts = plan_next(r, start)
        if end == start:
            break
        assert len(parts) == 2 and all(isinstance(p, NSQStagedPartition) for p in parts)
        assert sum(p.part.messages for p in parts) <= 40
        first = [rows(r, p) for p in parts]
        # the batch run again (a task or the driver failed): the same rows, nothing consumed
        again = [rows(r, p) for p in reader(emulator, topic, tmp_path).partitions(start, end)]
        assert again == first
        seen.extend(row["body"] for part in first for row in part)
        r.commit(end)
        start = end
    assert sorted(seen) == [f"m{i:03d}".encode() for i in range(n)]
    stats = emulator.channel_stats(topic, "c")
    assert (stats.depth, stats.in_flight_count, stats.message_count) == (0, 0, n)
    assert (stats.requeue_count, stats.timeout_count) == (0, 0)
    # committed batches leave nothing staged behind (the last one committed is marked)
    run = start["run"]
    assert sorted(p.name for p in (tmp_path / "stage" / run).iterdir()) == [
        "_committed",
        "_source",
    ]
    assert r.staging.committed(run) == start["batch"]


def test_available_now_plans_again_what_tasks_left_of_their_plan(
    emulator: Emulator, tmp_path: Path
) -> None:
    """Bodies of 1,900 bytes, then of 100 (a mean of 1,000): tasks planned 10 messages of
    10,000 bytes stop after 5 of the large ones.  The run ends once every message that waited
    when it began was read, not once that many were planned."""
    topic = "exec-available-now-short"
    bodies = [f"L{i:02d}".encode().ljust(1900, b"x") for i in range(30)]
    bodies += [f"S{i:02d}".encode().ljust(100, b"x") for i in range(30)]
    emulator.publish(topic, bodies)
    r = reader(emulator, topic, tmp_path, max_bytes_per_task=10_000)
    start = r.initialOffset()
    r.prepareForTriggerAvailableNow()
    emulator.publish(topic, [b"after-the-start"] * 5)
    seen: list[bytes] = []
    batches = 0
    while True:
        end, parts = plan_next(r, start)
        if end == start:
            break
        batches += 1
        seen.extend(row["body"][:3] for p in parts for row in rows(r, p))
        r.commit(end)
        start = end
    assert sorted(seen) == sorted(b[:3] for b in bodies) and batches == 2
    assert emulator.channel_stats(topic, "c").depth == 5  # published after the run began


def test_available_now_ends_without_the_idle_pause(
    emulator: Emulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The empty plan that ends an ``availableNow`` run is answered at once: the pause
    between two looks at an idle topic (100 ms) is for a query that goes on."""
    import nsq_spark._executor_source as source

    pauses: list[float] = []

    class Clock:  # the module's time, its pauses noted and skipped
        def __getattr__(self, name: str) -> Any:
            return getattr(time, name)

        def sleep(self, seconds: float) -> None:
            pauses.append(seconds)

    monkeypatch.setattr(source, "time", Clock())
    topic = "exec-available-now-end"
    emulator.publish(topic, [b"a", b"b"])
    r = reader(emulator, topic, tmp_path)
    start = r.initialOffset()
    r.prepareForTriggerAvailableNow()
    end, parts = plan_next(r, start)
    assert sorted(row["body"] for p in parts for row in rows(r, p)) == [b"a", b"b"]
    r.commit(end)
    assert r.latestOffset(end, r.getDefaultReadLimit()) == end  # the run ends here
    assert pauses == []
    # a query that goes on pauses before it looks again
    other = reader(emulator, "exec-idle-pause", tmp_path)
    assert other.latestOffset(other.initialOffset(), other.getDefaultReadLimit()) == {"batch": 0}
    assert pauses == [source.IDLE_POLL_INTERVAL]


def test_an_idle_topic_makes_no_batch(emulator: Emulator, tmp_path: Path) -> None:
    r = reader(emulator, "exec-idle", tmp_path)
    start = r.initialOffset()
    assert r.latestOffset(start, r.getDefaultReadLimit()) == start
    assert list(r.partitions(start, start)) == []


def test_a_task_collects_rarely_and_leaves_the_workers_collector_as_it_was(
    emulator: Emulator, tmp_path: Path
) -> None:
    # a task holds its whole share before it answers any: with Python's default thresholds
    # the cyclic collector walked it hundreds of times a task
    # a first task imports what tasks import (alone, those imports' allocations made 113
    # collections): the count below is the task's own, whatever ran before in this process
    emulator.publish("exec-gc-warm", [b"warm"] * 10)
    warm = reader(emulator, "exec-gc-warm", tmp_path / "warm")
    assert len(rows(warm, plan_next(warm, warm.initialOffset())[1][0])) == 10
    topic, n = "exec-gc", 20_000
    emulator.publish(topic, [b"%05d" % i for i in range(n)])
    # the task must take its whole share (what the collector would walk): no idle end after
    # 0.3 s without a message, which a starved machine gives mid-task (7,501 of 20,000)
    r = reader(emulator, topic, tmp_path, task_idle_timeout=30)
    _end, parts = plan_next(r, r.initialOffset())
    assert [p.part.messages for p in parts] == [n]
    collections: list[int] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collections.append(info["generation"])

    before = gc.get_threshold()
    # the generations' counts start at zero: a full collection during the task is then the
    # task's own doing (ten collections of the middle generation), never the end of a count
    # that earlier tests of this process ran up
    gc.collect()
    gc.callbacks.append(count)
    try:
        got = rows(r, parts[0])
    finally:
        gc.callbacks.remove(count)
    assert len(got) == n
    # (the emulator, in this process, allocates too: 239 collections, 2 of them full, before)
    assert len(collections) < 80 and 2 not in collections, collections
    assert gc.get_threshold() == before


def test_bytes_bound_a_task_and_what_is_beyond_its_share_is_requeued(
    emulator: Emulator, tmp_path: Path
) -> None:
    topic, size = "exec-bytes", 10_000
    emulator.publish(topic, [bytes([i]) * size for i in range(20)])
    r = reader(emulator, topic, tmp_path, max_bytes_per_trigger=5 * size + 1)
    start = r.initialOffset()
    # the driver plans by the topic's mean body size (nsqd's stats)...
    _end, parts = plan_next(r, start)
    assert [(p.part.messages, p.part.bytes) for p in parts] == [(5, 5 * size + 1)]
    # ...and a task stops at its bytes whatever the plan's messages (the sizes vary)
    end = {"run": _end["run"], "batch": 1, "parts": [[emulator.address, 20, 5 * size + 1]]}
    parts = list(r.partitions(start, end))
    got = rows(r, parts[0])
    assert len(got) == 5 and sum(len(row["body"]) for row in got) == 5 * size
    stats = emulator.channel_stats(topic, "c")
    assert (stats.depth, stats.in_flight_count) == (15, 0)  # the rest went back at once


def test_a_share_above_nsqds_max_rdy_count_is_taken_over_more_connections(
    emulator: Emulator, tmp_path: Path
) -> None:
    # nsqd lets a connection hold max_rdy_count (2,500) unanswered messages, and a task answers
    # none before its rows are staged: a larger share opens more connections to the nsqd
    topic = "exec-max-rdy"
    emulator.publish(topic, [f"m{i:04d}".encode() for i in range(6000)])
    r = reader(emulator, topic, tmp_path, max_messages_per_task=6000, task_idle_timeout=20)
    start = r.initialOffset()
    _end, parts = plan_next(r, start)
    assert [p.part.messages for p in parts] == [6000]
    started = time.monotonic()
    got = rows(r, parts[0])
    assert time.monotonic() - started < 10  # not the 20 s idle wait
    assert sorted(row["body"] for row in got) == [f"m{i:04d}".encode() for i in range(6000)]
    stats = emulator.channel_stats(topic, "c")
    assert (stats.depth, stats.in_flight_count, stats.requeue_count) == (0, 0, 0)


def test_a_share_above_what_its_connections_may_hold_ends_there_without_waiting(
    emulator: Emulator, tmp_path: Path
) -> None:
    # with max_connections_per_nsqd connections each holding max_rdy_count, the task takes
    # those and ends, rather than waiting task_idle_timeout for messages nsqd will not send
    topic = "exec-max-conns"
    emulator.publish(topic, [f"m{i:04d}".encode() for i in range(6000)])
    r = reader(
        emulator,
        topic,
        tmp_path,
        max_messages_per_task=6000,
        max_connections_per_nsqd=2,
        task_idle_timeout=20,
    )
    start = r.initialOffset()
    _end, parts = plan_next(r, start)
    started = time.monotonic()
    got = rows(r, parts[0])
    assert time.monotonic() - started < 10
    assert len(got) == 5000 and len({row["id"] for row in got}) == 5000
    stats = emulator.channel_stats(topic, "c")
    assert (stats.depth, stats.in_flight_count) == (1000, 0)


def test_an_idle_topic_is_asked_for_its_depth_at_most_every_100_ms(
    emulator: Emulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import nsq_spark._planner as planner

    asked: list[str] = []
    real = planner._http

    def counted(address: str, path: str, **kwargs: Any) -> tuple[int, bytes]:
        asked.append(path)
        return real(address, path, **kwargs)

    monkeypatch.setattr(planner, "_http", counted)
    r = reader(emulator, "exec-idle", tmp_path)
    start = r.initialOffset()
    r.latestOffset(start, r.getDefaultReadLimit())  # creates the channel
    asked.clear()
    # Spark's loop with the default trigger: ask again 10 ms after an empty answer
    began = time.monotonic()
    while time.monotonic() - began < 1.0:
        assert r.latestOffset(start, r.getDefaultReadLimit()) == start
        time.sleep(0.01)
    stats = [p for p in asked if p.startswith("/stats")]
    assert 5 <= len(stats) <= 11, len(stats)
    # and a message is seen at the next look
    emulator.publish("exec-idle", [b"x"])
    end = r.latestOffset(start, r.getDefaultReadLimit())
    assert [m for _a, m, _b in end["parts"]] == [1]


def test_rows_whose_fin_nsqd_did_not_confirm_are_not_written_again_when_redelivered(
    emulator: Emulator, tmp_path: Path
) -> None:
    # a task stages its rows, then dies before nsqd has its FINs (here: it fails after the
    # staging write and its messages go back; a kill -9 brings them back after msg_timeout);
    # Spark runs it again and it returns the staged rows; nsqd delivers the messages again,
    # and the next batch must not write them a second time
    topic = "exec-unconfirmed"
    bodies = [f"m{i:02d}".encode() for i in range(10)]
    emulator.publish(topic, bodies)
    r = reader(emulator, topic, tmp_path)
    start = r.initialOffset()
    end, (part,) = plan_next(r, start)
    original = Staging.publish

    def staged_then_died(self: Staging, run: str, batch: int, index: int, table: Any) -> bool:
        assert original(self, run, batch, index, table)
        raise RuntimeError("the executor died")

    Staging.publish = staged_then_died  # type: ignore[method-assign]
    try:
        with pytest.raises(RuntimeError, match="died"):
            rows(r, part)
    finally:
        Staging.publish = original  # type: ignore[method-assign]
    written = [row["body"] for row in rows(r, part)]  # Spark's retry: the staged rows
    assert sorted(written) == bodies
    r.commit(end)
    deadline = time.monotonic() + 10
    while emulator.channel_stats(topic, "c").depth < 10 and time.monotonic() < deadline:
        time.sleep(0.05)
    start = end
    end, parts = plan_next(r, start)
    again = [row["body"] for p in parts for row in rows(r, p)]
    assert again == []  # each message once in all
    r.commit(end)
    stats = emulator.channel_stats(topic, "c")
    assert (stats.depth, stats.in_flight_count) == (0, 0)  # and the copies were FINished
    # a message published now is a row as usual
    emulator.publish(topic, [b"new"])
    end, parts = plan_next(r, end)
    assert [row["body"] for p in parts for row in rows(r, p)] == [b"new"]


def test_confirmed_rows_leave_no_suspects_and_suspects_expire(
    emulator: Emulator, tmp_path: Path
) -> None:
    topic = "exec-confirmed"
    emulator.publish(topic, [b"a", b"b"])
    r = reader(emulator, topic, tmp_path, redelivery_window=0)
    start = r.initialOffset()
    end, (part,) = plan_next(r, start)
    assert len(rows(r, part)) == 2
    run = end["run"]
    staged = tmp_path / "stage" / run / "1"
    assert sorted(p.name for p in staged.iterdir()) == ["0.arrow", "0.fin"]
    r.commit(end)
    assert not staged.exists() and not (tmp_path / "stage" / run / "_suspects").exists()
    # an unconfirmed task leaves suspects; with redelivery_window 0 the next commit drops them
    r.staging.publish(run, 7, 0, r.staging.read(run, 7, 0) or _staged_ids(b"x", part))
    r.staging.delete_through(run, 7, redelivery_window=3600)
    assert [p.name for p in (tmp_path / "stage" / run / "_suspects").iterdir()] == ["7-0.arrow"]
    assert r.staging.suspects(run, part.part.address) == {b"x"}
    assert r.staging.suspects(run, "elsewhere:4150") == frozenset()
    time.sleep(0.05)
    r.staging.delete_through(run, 7, redelivery_window=0)
    assert list((tmp_path / "stage" / run / "_suspects").iterdir()) == []


def _staged_ids(message_id: bytes, part: Any) -> Any:
    from nsq_spark._staging import ID_COLUMN, NSQD_KEY

    table = pa.table({"body": [b"x"], ID_COLUMN: pa.array([message_id], pa.binary())})
    return table.replace_schema_metadata({NSQD_KEY: part.part.address.encode()})


def test_an_attempt_that_loses_the_race_requeues_and_returns_the_winners_rows(
    emulator: Emulator, tmp_path: Path
) -> None:
    topic = "exec-race"
    emulator.publish(topic, [b"a", b"b", b"c"])
    r = reader(emulator, topic, tmp_path)
    start = r.initialOffset()
    _end, (part,) = plan_next(r, start)
    winner = _arrow_schema().empty_table()
    # another attempt of the same task staged first, while this one consumed
    original = Staging.publish

    def lose(self: Staging, run: str, batch: int, index: int, table: Any) -> bool:
        assert original(self, run, batch, index, winner)
        return original(self, run, batch, index, table)

    Staging.publish = lose  # type: ignore[method-assign]
    try:
        got = rows(r, part)
    finally:
        Staging.publish = original  # type: ignore[method-assign]
    assert got == []
    stats = emulator.channel_stats(topic, "c")
    assert (stats.depth, stats.in_flight_count, stats.requeue_count) == (3, 0, 3)


def test_an_attempt_of_a_committed_batch_consumes_nothing(
    emulator: Emulator, tmp_path: Path
) -> None:
    # a slow attempt (the one that speculation copied, or a task Spark is ending) starts
    # reading only once its copy's rows were committed and the driver deleted them: it must
    # not take the messages of the next batches (Spark keeps no row of it)
    topic = "exec-late-attempt"
    bodies = [f"m{i:02d}".encode() for i in range(10)]
    emulator.publish(topic, bodies)
    r = reader(emulator, topic, tmp_path, max_messages_per_trigger=4)
    start = r.initialOffset()
    end, (part,) = plan_next(r, start)
    written = [row["body"] for row in rows(r, part)]  # the copy
    assert len(written) == 4
    r.commit(end)
    with pytest.raises(RuntimeError, match="committed already"):
        rows(r, part)  # the slow attempt, late
    stats = emulator.channel_stats(topic, "c")
    assert (stats.depth, stats.in_flight_count) == (6, 0)
    written += _read_to_the_end(r, end)
    assert sorted(written) == bodies


def test_an_attempt_that_stages_after_its_batch_was_committed_gives_back_what_it_took(
    emulator: Emulator, tmp_path: Path
) -> None:
    # the slow attempt found nothing staged and consumed; meanwhile its copy consumed other
    # messages, staged and FINished them, and the batch was committed (the staged rows
    # deleted): the slow attempt's staging then finds the name free, but its rows are never
    # written, so its messages go back to nsqd
    topic = "exec-late-stage"
    bodies = [f"m{i:02d}".encode() for i in range(10)]
    emulator.publish(topic, bodies)
    r = reader(emulator, topic, tmp_path, max_messages_per_trigger=4)
    start = r.initialOffset()
    end, (part,) = plan_next(r, start)
    original = Staging.publish
    copy_wrote: list[bytes] = []

    def copy_first(self: Staging, run: str, batch: int, index: int, table: Any) -> bool:
        if not copy_wrote:
            Staging.publish = original  # type: ignore[method-assign]
            copy_wrote.extend(row["body"] for row in rows(r, part))
            r.commit(end)
        return original(self, run, batch, index, table)

    Staging.publish = copy_first  # type: ignore[method-assign]
    try:
        with pytest.raises(RuntimeError, match="committed already"):
            rows(r, part)
    finally:
        Staging.publish = original  # type: ignore[method-assign]
    assert len(copy_wrote) == 4
    stats = emulator.channel_stats(topic, "c")
    assert (stats.depth, stats.in_flight_count) == (6, 0)
    # nothing of the late attempt stays staged, nor counts as written
    run = end["run"]
    assert not (tmp_path / "stage" / run / "1" / "0.arrow").exists()
    assert r.staging.suspects(run, part.part.address) == frozenset()
    assert sorted(copy_wrote + _read_to_the_end(r, end)) == bodies
    assert sorted(p.name for p in (tmp_path / "stage" / run).iterdir()) == [
        "_committed",
        "_source",
    ]


def test_what_a_late_attempt_left_staged_is_deleted_and_not_taken_for_written(
    emulator: Emulator, tmp_path: Path
) -> None:
    # a late attempt killed between its staging and its giving back leaves its rows staged
    # under a committed batch: nsqd delivers its messages again after msg_timeout, and they
    # are rows then (not copies of rows written)
    topic = "exec-late-leftover"
    emulator.publish(topic, [b"a", b"b"])
    r = reader(emulator, topic, tmp_path, max_messages_per_trigger=1)
    start = r.initialOffset()
    end, (part,) = plan_next(r, start)
    assert [row["body"] for row in rows(r, part)] == [b"a"]
    r.commit(end)
    run = end["run"]
    r.staging.publish(run, 1, 0, _staged_ids(b"late-id", part))
    end2, parts = plan_next(r, end)
    assert [row["body"] for p in parts for row in rows(r, p)] == [b"b"]
    r.commit(end2)
    assert not (tmp_path / "stage" / run / "1").exists()
    assert r.staging.suspects(run, part.part.address) == frozenset()


def _read_to_the_end(r: Any, start: dict[str, Any]) -> list[bytes]:
    """The bodies of every batch planned from ``start`` on, each committed."""
    bodies: list[bytes] = []
    while True:
        end, parts = plan_next(r, start)
        if end == start:
            return bodies
        bodies.extend(row["body"] for p in parts for row in rows(r, p))
        r.commit(end)
        start = end


def _arrow_schema() -> Any:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(SCHEMA, timezone="UTC")


def test_a_staging_location_the_executor_does_not_share_fails_the_task(
    emulator: Emulator, tmp_path: Path
) -> None:
    topic = "exec-not-shared"
    emulator.publish(topic, [b"a"])
    r = reader(emulator, topic, tmp_path)
    start = r.initialOffset()
    _end, (part,) = plan_next(r, start)
    elsewhere = pickle.loads(pickle.dumps(r))
    elsewhere.staging = Staging(str(tmp_path / "another-machine"))
    with pytest.raises(StagingNotShared):
        list(elsewhere.read(part))
    assert emulator.channel_stats(topic, "c").depth == 1  # nothing consumed


# -- nsqd's HTTP API over HTTPS (a real nsqd) -------------------------------------------------


@pytest.mark.real_nsqd
@pytest.mark.skipif(not NSQD, reason="no real nsqd: set NSQD to the binary to run these")
def test_the_driver_asks_nsqd_over_https_with_the_tls_options(tmp_path: Path) -> None:
    import trustme

    from tests.support.net import free_port
    from tests.support.servers import Nsqd

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "cert.pem"))
    cert.private_key_pem.write_to_path(str(tmp_path / "key.pem"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    https = free_port()
    server = Nsqd(
        f"--tls-cert={tmp_path / 'cert.pem'}",
        f"--tls-key={tmp_path / 'key.pem'}",
        f"--https-address=127.0.0.1:{https}",
    )
    server.start()
    try:
        topic = "exec-https"
        body = "\n".join(f"m{i}" for i in range(5)).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{server.http}/mpub?topic={topic}", data=body, method="POST"
        )
        urllib.request.urlopen(request, timeout=5).read()
        base = {
            "topic": topic,
            "channel": "c",
            "nsqd_tcp_addresses": server.tcp_address,
            "nsqd_http_addresses": f"https://127.0.0.1:{https}",
            "staging_location": str(tmp_path / "stage"),
            "task_idle_timeout": "0.3",
            "connect_timeout": "2",
        }

        def reader(**options: str) -> Any:
            made = NSQDataSource({**base, **options}).streamReader(SCHEMA)
            return pickle.loads(pickle.dumps(made))

        # nsqd's certificate is not trusted without the CA: no answer, then the query fails
        untrusted = reader()
        with pytest.raises(ConnectTimeout, match="CERTIFICATE_VERIFY_FAILED"):
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                assert plan_next(untrusted, untrusted.initialOffset())[1] == []
                time.sleep(0.5)
        r = reader(tls_ca_file=str(tmp_path / "ca.pem"))  # TCP stays plain: tls is off
        _end, parts = plan_next(r, r.initialOffset())
        got = [rows(r, p) for p in parts]
        assert sorted(row["body"] for part in got for row in part) == [
            f"m{i}".encode() for i in range(5)
        ]
    finally:
        server.stop()
        server.cleanup()


def test_the_partitioned_servers_stats_plan_each_partition_it_leads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The partitioned server lists a topic once per partition; its channel's depth counts the
    messages in flight and deferred too, and ``depth_size`` their bytes (as a real one
    answers); a partition it holds as a replica is read from its leader."""
    from nsq_spark import _planner

    def channel(depth: int, in_flight: int, size: int, count: int) -> dict[str, Any]:
        return {
            "channel_name": "c",
            "depth": depth,
            "depth_size": size,
            "in_flight_count": in_flight,
            "deferred_count": 0,
            "message_count": count,
        }

    stats = {
        "topics": [
            {"topic_name": "t", "topic_partition": "0", "is_leader": True, "depth": 425,
             "message_count": 9, "channels": [channel(5, 2, 5_000, 9)]},
            {"topic_name": "t", "topic_partition": "1", "is_leader": True, "depth": 555,
             "message_count": 4, "channels": [channel(4, 0, 400, 4)]},
            {"topic_name": "t", "topic_partition": "2", "is_leader": False, "depth": 100,
             "message_count": 7, "channels": [channel(7, 0, 70, 7)]},
            {"topic_name": "other", "topic_partition": "0", "is_leader": True, "depth": 1,
             "message_count": 1, "channels": [channel(1, 0, 1, 1)]},
        ]
    }  # fmt: skip

    def answer(address: str, path: str, **_: Any) -> tuple[int, bytes]:
        assert path.startswith("/stats?")
        return 200, json.dumps({"status_code": 200, "data": stats}).encode()

    monkeypatch.setattr(_planner, "_http", answer)
    options = parse_source_options(
        {"topic": "t", "channel": "c", "nsqd_tcp_addresses": "n:4150",
         "nsqd_http_addresses": "n:4151"}
    )  # fmt: skip
    planner = _planner.Planner(options)
    depths = planner.depths()
    assert depths == {"n:4150 partition 0": 3, "n:4150 partition 1": 4}  # ready only
    assert planner.sources == {
        "n:4150 partition 0": ("n:4150", 0),
        "n:4150 partition 1": ("n:4150", 1),
    }
    assert planner.sizes == {"n:4150 partition 0": 1000.0, "n:4150 partition 1": 100.0}
    assert planner.counters == {"n:4150 partition 0": (9, 5), "n:4150 partition 1": (4, 4)}
    parts = plan_batch(
        depths,
        max_messages=100,
        max_bytes=1 << 20,
        max_messages_per_task=100,
        sources=planner.sources,
    )
    assert sorted((p.address, p.partition, p.messages) for p in parts) == [
        ("n:4150", 0, 3),
        ("n:4150", 1, 4),
    ]
    # the offset log keeps the partition; a part of a standard nsqd is written as before
    from nsq_spark._planning import decode_part, encode_part

    assert [decode_part(encode_part(p)) for p in parts] == parts
    assert encode_part(Part("n:4150", 5, 10)) == ["n:4150", 5, 10]
