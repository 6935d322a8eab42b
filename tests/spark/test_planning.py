"""The source's planning (``nsq_spark._planning``) on its own: pure functions over plain
values, imported without pyspark or pyarrow."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from nsq_spark._options import parse_source_options
from nsq_spark._planning import (
    SOURCE_COLUMNS,
    AvailableNow,
    ConnectTimeout,
    Part,
    check_columns,
    connect_timeout,
    connections_for,
    decode_part,
    encode_part,
    executor_limits,
    max_rdy_counts,
    mean_body_size,
    offers,
    plan_batch,
    plan_of,
    read_limit,
    seq_of,
    seq_offset,
    shares,
    split_evenly,
    topic_channel,
    topic_entries,
    waiting,
)

ROOT = Path(__file__).resolve().parents[2]


def test_the_planning_module_imports_neither_pyspark_nor_pyarrow() -> None:
    """In a fresh interpreter: the module (and the package's pure names) import, and plan,
    with neither pyspark nor pyarrow loaded."""
    script = textwrap.dedent(
        """
        import sys
        from nsq_spark import ConnectTimeout, OptionError
        from nsq_spark._planning import plan_batch, plan_of
        parts = plan_batch({"a": 5}, max_messages=10, max_bytes=100, max_messages_per_task=10)
        assert plan_of({"run": "r", "batch": 1, "parts": [["a", 5, 100]]})[2] == parts
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("pyspark", "pyarrow"))
        print(loaded)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


# -- columns and the connect timeout ----------------------------------------------------------


def test_the_columns_are_checked_by_name() -> None:
    check_columns(SOURCE_COLUMNS)
    check_columns(["body"])
    with pytest.raises(ValueError, match="the nsq source has no column 'value' \\(it has body,"):
        check_columns(["body", "value"])


def test_the_connect_timeout_names_where_it_tried_and_the_last_errors() -> None:
    o = parse_source_options(
        {"topic": "t", "channel": "c", "read_mode": "driver", "nsqd_tcp_addresses": "n:1"}
    )
    error = connect_timeout(o, ["nsqd n:1", "lookupd l:2"], ["nsqd: refused", "lookupd: 500"])
    assert isinstance(error, ConnectTimeout)
    assert str(error) == (
        "the nsq source of t/c has no nsqd to consume from after connect_timeout (30 s) "
        "(nsqd n:1, lookupd l:2); last error: nsqd: refused; lookupd: 500"
    )
    assert str(connect_timeout(o, ["nsqd n:1"], [])).endswith("(30 s) (nsqd n:1)")
    assert ConnectTimeout.__module__ == "nsq_spark"


# -- Spark's read limits ---------------------------------------------------------------------


# stand-ins of pyspark.sql.streaming.datasource's classes: told apart by their names
@dataclass
class ReadMaxRows:
    max_rows: int


@dataclass
class ReadMaxBytes:
    max_bytes: int


@dataclass
class ReadMinRows:
    min_rows: int
    max_trigger_delay: int = 0


class ReadAllAvailable:
    pass


class FewerRows(ReadMaxRows):
    pass


def test_a_read_limit_is_one_kind_and_amount() -> None:
    assert read_limit(ReadMaxRows(50)) == ("rows", 50)
    assert read_limit(ReadMaxRows(0)) == ("rows", 1)  # at least one
    assert read_limit(FewerRows(7)) == ("rows", 7)  # a subclass is its base
    assert read_limit(ReadMaxBytes(1000)) == ("bytes", 1000)
    assert read_limit(ReadMaxBytes(-5)) == ("bytes", 1)
    assert read_limit(ReadMinRows(20)) == ("min_rows", 20)
    assert read_limit(ReadAllAvailable()) == ("all", 0)
    assert read_limit(object()) == ("all", 0)  # a limit that does not apply to messages


def test_the_executor_reader_bounds_a_batch_by_the_limit_and_its_options() -> None:
    o = parse_source_options(
        {
            "topic": "t",
            "channel": "c",
            "lookupd_http_addresses": "l:1",
            "max_bytes_per_trigger": "500",
        }
    )
    assert executor_limits(("rows", 10), o) == (10, 500)
    assert executor_limits(("bytes", 100), o) == (1_000_000, 100)
    assert executor_limits(("bytes", 1000), o) == (1_000_000, 500)  # never above the option
    # only the driver reader waits for a minimum
    assert executor_limits(("min_rows", 10), o) == (1_000_000, 500)
    assert executor_limits(("all", 0), o) == (1_000_000, 500)


# -- offsets ---------------------------------------------------------------------------------


def test_the_driver_readers_offset_is_a_sequence_number() -> None:
    assert seq_offset(12) == {"seq": 12}
    assert seq_of({"seq": 12}) == 12 and seq_of({"seq": "12"}) == 12
    for wrong in ({}, {"seq": "x"}, {"seq": None}, {"batch": 1}):
        with pytest.raises(ValueError, match="not an offset of the nsq source"):
            seq_of(wrong)


def test_a_plan_goes_through_the_offset_log_unchanged() -> None:
    parts = [Part("a:1", 5, 100), Part("b:1", 6, 200, 3)]
    encoded = [encode_part(p) for p in parts]
    assert encoded == [["a:1", 5, 100], ["b:1", 6, 200, 3]]
    assert [decode_part(e) for e in encoded] == parts
    assert plan_of({"run": "r", "batch": 4, "parts": encoded}) == ("r", 4, parts)
    assert plan_of({"batch": 0}) == (None, 0, [])  # the initial offset
    assert Part("b:1", 6, 200, 3).source == "b:1 partition 3" and parts[0].source == "a:1"
    for wrong in (
        {"run": "r", "batch": "x"},
        {"run": "r", "batch": 1, "parts": [["a", 1]]},
        {"run": "r", "batch": 1, "parts": [["a", 1, 2, 3, 4]]},
        {"run": "r", "batch": 1, "parts": [["a", "many", 2]]},
        ["not", "a", "dict"],
    ):
        with pytest.raises(ValueError, match="not an offset of the nsq source"):
            plan_of(wrong)  # type: ignore[arg-type]


# -- plans -----------------------------------------------------------------------------------


def test_a_batch_is_split_fairly_and_bounded_in_messages_and_bytes() -> None:
    def plan(depths: dict[str, int], **limits: int) -> list[tuple[str, int, int]]:
        o = {"max_messages": 100, "max_bytes": 1000, "max_messages_per_task": 2500, **limits}
        parts = plan_batch(
            depths,
            max_messages=o["max_messages"],
            max_bytes=o["max_bytes"],
            max_messages_per_task=o["max_messages_per_task"],
            min_partitions=o.get("min_partitions", 1),
        )
        return [(p.address, p.messages, p.bytes) for p in parts]

    assert plan({}) == [] and plan({"a": 0, "b": 0}) == []
    assert plan({"a": 10}) == [("a", 10, 1000)]
    # what one nsqd does not need goes to the other
    assert plan({"a": 10, "b": 500}) == [("a", 10, 100), ("b", 90, 900)]
    assert plan({"a": 500, "b": 500}) == [("a", 50, 500), ("b", 50, 500)]
    # a task holds at most max_messages_per_task messages (nsqd's --max-rdy-count)
    assert plan({"a": 500}, max_messages_per_task=40) == [
        ("a", 34, 340),
        ("a", 33, 330),
        ("a", 33, 330),
    ]
    # at least min_partitions tasks, if there are messages enough
    assert plan({"a": 3}, min_partitions=4) == [("a", 1, 333), ("a", 1, 333), ("a", 1, 333)]
    # every nsqd with messages gets at least one, even over a tiny limit
    assert sum(p[1] for p in plan({"a": 5, "b": 5, "c": 5}, max_messages=2)) == 2
    # the bytes of a batch never add up to more than its limit
    parts = plan({"a": 7, "b": 9, "c": 1000}, max_messages=1000, max_bytes=12345)
    assert sum(p[2] for p in parts) <= 12345 and sum(p[1] for p in parts) == 1000


def test_the_mean_body_size_bounds_a_batchs_messages_and_splits_it_into_tasks_by_bytes() -> None:
    def plan(depths: dict[str, int], sizes: dict[str, float], **limits: int) -> list[Part]:
        o = {"max_messages": 1000, "max_bytes": 100_000, "max_messages_per_task": 500, **limits}
        return plan_batch(
            depths,
            max_messages=o["max_messages"],
            max_bytes=o["max_bytes"],
            max_messages_per_task=o["max_messages_per_task"],
            sizes=sizes,
            max_bytes_per_task=o.get("max_bytes_per_task"),
        )

    # 1,000 messages of 1,000 bytes do not fit 100,000 bytes: 100 of them do
    parts = plan({"a": 5000}, {"a": 1000.0})
    assert [(p.messages, p.bytes) for p in parts] == [(100, 100_000)]
    # over two nsqd, each with its own size: the batch still fits, both get some
    parts = plan({"a": 5000, "b": 5000}, {"a": 100.0, "b": 1000.0})
    assert {p.address for p in parts} == {"a", "b"}
    assert sum(p.messages * (100 if p.address == "a" else 1000) for p in parts) <= 100_000
    # tasks of at most max_bytes_per_task: 100 messages of 1,000 bytes in 4 of 25,000
    parts = plan({"a": 5000}, {"a": 1000.0}, max_bytes_per_task=25_000)
    assert [(p.messages, p.bytes) for p in parts] == [(25, 25_000)] * 4
    # without a known size the tasks are split by messages, each still capped in bytes
    parts = plan({"a": 5000}, {}, max_bytes_per_task=25_000)
    assert [(p.messages, p.bytes) for p in parts] == [(500, 25_000)] * 2
    # small messages: the message limits decide, as without sizes
    assert plan({"a": 5000}, {"a": 10.0}) == plan({"a": 5000}, {})
    # a single huge message still makes a task
    assert [(p.messages, p.bytes) for p in plan({"a": 3}, {"a": 1e9})] == [(1, 100_000)]
    # the defaults with 200 KB bodies: each task's messages fit its bytes (168 of them in a
    # task of 32 MiB would not: the task would stop one short of its plan)
    parts = plan(
        {"a": 5000},
        {"a": 200_000.0},
        max_messages=1_000_000,
        max_bytes=256 << 20,
        max_messages_per_task=100_000,
        max_bytes_per_task=32 << 20,
    )
    assert sum(p.messages for p in parts) == (256 << 20) // 200_000
    assert all(p.messages * 200_000 <= p.bytes for p in parts), parts


def test_available_now_leaves_what_waited_when_the_run_began() -> None:
    # a: counters known (3 arrived since, backlog 10 now); b: not known, 4 planned since
    run = AvailableNow({"a": 8, "b": 6}, {"a": (100, 8)})
    run.plan([Part("b", 4, 100), Part("c", 9, 100)])
    assert run.left({"a": (103, 10)}) == {"a": 7, "b": 2}
    run.plan([Part("b", 5, 100)])
    assert run.left({"a": (110, 2)}) == {"a": 0, "b": 0}  # never below nothing


def test_held_messages_are_split_evenly_in_order() -> None:
    assert split_evenly(list(range(7)), 3) == [[0, 1, 2], [3, 4], [5, 6]]
    assert split_evenly([1, 2], 5) == [[1], [2]]
    assert split_evenly([], 3) == []


# -- nsqd's /stats ---------------------------------------------------------------------------


def test_the_topics_entries_are_read_from_either_envelope() -> None:
    entries = [{"topic_name": "t", "depth": 1}, {"topic_name": "u", "depth": 2}]
    assert topic_entries(200, b'{"topics": %s}' % _json(entries), "t") == [entries[0]]
    legacy = b'{"status_code": 200, "data": {"topics": %s}}' % _json(entries)
    assert topic_entries(200, legacy, "u") == [entries[1]]
    assert topic_entries(200, b'{"topics": null}', "t") == []
    with pytest.raises(ValueError, match="/stats answered 500"):
        topic_entries(500, b"", "t")


def test_what_waits_on_a_channel() -> None:
    channel = {
        "channel_name": "c",
        "depth": 5,
        "in_flight_count": 2,
        "deferred_count": 1,
        "message_count": 20,
    }
    topic = {"topic_name": "t", "message_count": 40, "message_bytes": 4000, "channels": [channel]}
    assert topic_channel(topic, "c") == channel and topic_channel(topic, "d") is None
    assert topic_channel({"channels": None}, "c") is None
    # nsqd: depth is what is ready; the mean size is the topic's
    assert waiting(topic, channel, partitioned=False) == (5, 100.0, (20, 8))
    # the partitioned server: depth counts what is in flight and deferred, depth_size tells
    # the bytes waiting
    sized = {**channel, "depth_size": 1000}
    assert waiting(topic, sized, partitioned=True) == (2, 200.0, (20, 5))
    # counters missing: none
    assert waiting(topic, {"depth": 3}, partitioned=False) == (3, 100.0, None)
    assert mean_body_size({}, None) is None
    assert mean_body_size({"message_count": 0, "message_bytes": 0}, {"depth": 0}) is None


# -- connections and their RDY ---------------------------------------------------------------


def test_connections_and_rdy_split_under_max_rdy_count() -> None:
    connections: list[dict[str, Any]] = [
        {"address": "a", "state": "SUBSCRIBED", "max_rdy_count": 2500},
        {"address": "b", "state": "CONNECTING", "max_rdy_count": 100},
        {"address": "c", "state": "SUBSCRIBED", "max_rdy_count": None},
    ]
    assert max_rdy_counts(connections) == [("a", 2500)]
    assert max_rdy_counts(connections, subscribed_only=False) == [("a", 2500), ("b", 100)]
    assert connections_for(6000, 2500, 64) == 3
    assert connections_for(2500, 2500, 64) == 1
    assert connections_for(10**6, 2500, 64) == 64
    assert shares(6000, 2, 2500) == [2500, 3500]
    assert shares(1000, 3, 2500) == [1000, 0, 0]
    # the fullest first; what one cannot take (its limit) goes to the others
    assert offers([2400, 0, 100], 900, 2500) == [(0, 2500), (2, 500), (1, 400)]
    assert offers([10, 10], 5, None) == [(0, 13), (1, 12)]
    assert offers([2500, 2500], 100, 2500) == [(0, 2500), (1, 2500)]


def _json(value: Any) -> bytes:
    return json.dumps(value).encode()


def test_sparks_read_limits_are_one_kind_and_amount() -> None:
    """The planning module tells pyspark's limits apart without importing pyspark."""
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadMaxBytes,
        ReadMaxFiles,
        ReadMaxRows,
        ReadMinRows,
    )

    assert read_limit(ReadMaxRows(5)) == ("rows", 5)
    assert read_limit(ReadMaxBytes(1000)) == ("bytes", 1000)
    assert read_limit(ReadMinRows(7)) == ("min_rows", 7)
    assert read_limit(ReadAllAvailable()) == ("all", 0)
    assert read_limit(ReadMaxFiles(3)) == ("all", 0)
