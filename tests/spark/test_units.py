"""The data source's parts without a JVM: options, the driver-side reader against the emulator
(what Spark would call, called directly), and how the sink batches rows."""

from __future__ import annotations

import gc
import logging
import pickle
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from types import SimpleNamespace
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]  # no type information (as in nsq_spark)
import pytest
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadMaxBytes,
    ReadMaxRows,
    ReadMinRows,
)
from pyspark.sql.types import StringType, StructField, StructType

import nsq_proto
from nsq_client import ConsumerConnectionStats
from nsq_spark import (
    SCHEMA,
    ConnectTimeout,
    NSQDataSource,
    NSQInputPartition,
    NSQStreamReader,
    OptionError,
)
from nsq_spark._feed import Feed
from nsq_spark._options import parse_sink_options, parse_source_options
from nsq_spark._planning import shares
from nsq_spark._rows import message_id, record_batch
from nsq_spark._sink import _requests

from .helpers import Emulator, wait_for

# -- options ---------------------------------------------------------------------------------


def test_source_options_defaults_and_spellings() -> None:
    o = parse_source_options(
        {
            "topic": "t",
            "channel": "c",
            "nsqdTcpAddresses": "a:1, b:2",
            "MAX_IN_FLIGHT": "300",
            "read_mode": "driver",
        }
    )
    assert o.connection.nsqd_tcp_addresses == ("a:1", "b:2")
    assert (o.max_in_flight, o.max_messages_per_trigger, o.num_partitions) == (300, 150, 1)
    assert (o.msg_timeout, o.max_attempts) == (60.0, 0)
    kwargs = o.consumer_kwargs()
    assert kwargs["max_in_flight"] == 300 and kwargs["backoff"] is False
    assert kwargs["max_attempts"] == 0  # never give a message up: Spark decides
    o = parse_source_options(
        {
            "topic": "t",
            "channel": "c",
            "lookupd_http_addresses": "l:4161",
            "maxMessagesPerTrigger": "7",
            "compression": "snappy",
            "auth_secret": "s",
            "ordered": "true",
            "partitions": "0,2",
            "read_mode": "driver",
        }
    )
    kwargs = o.consumer_kwargs()
    assert o.max_messages_per_trigger == 7
    assert kwargs["lookupd_http_addresses"] == ["l:4161"] and kwargs["snappy"] is True
    assert kwargs["ordered"] is True and kwargs["partitions"] == (0, 2)
    assert kwargs["auth_secret"] == "s"


def test_start_from_applies_to_a_new_query_only() -> None:
    from nsq_proto import StartFrom

    base = {"topic": "t", "channel": "c", "lookupd_http_addresses": "l:4161", "read_mode": "driver"}
    o = parse_source_options({**base, "startFrom": "end"})
    assert o.consumer_kwargs(fresh=True)["start_from"] == StartFrom.end()
    assert "start_from" not in o.consumer_kwargs()  # resuming from a checkpoint
    o = parse_source_options({**base, "start_from": "0=msgcount:5, 1=timestamp:1700000000"})
    assert o.start_from == {0: StartFrom.message_count(5), 1: StartFrom.timestamp(1700000000)}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"topic": "t", "channel": "c", "lookupd_http_addresses": "l:1", "start_from": "now"},
            "start_from",
        ),
        (
            {"topic": "t", "channel": "c", "lookupd_http_addresses": "l:1", "start_from": "x=end"},
            "start_from",
        ),
        (
            {"topic": "t", "channel": "c", "nsqd_tcp_addresses": "a:1", "start_from": "end"},
            "lookupd",
        ),
        ({"channel": "c", "nsqd_tcp_addresses": "a:1"}, "topic"),
        ({"topic": "t", "nsqd_tcp_addresses": "a:1"}, "channel"),
        ({"topic": "t", "channel": "c"}, "nsqd_tcp_addresses"),
        ({"topic": "t", "channel": "c", "nsqd_tcp_addresses": "nohost"}, "host:port"),
        (
            {"topic": "t", "channel": "c", "nsqd_tcp_addresses": "a:1", "max_in_flight": "0"},
            "at least",
        ),
        (
            {"topic": "t", "channel": "c", "nsqd_tcp_addresses": "a:1", "compression": "lz4"},
            "snappy",
        ),
        (
            {"topic": "t", "channel": "c", "nsqd_tcp_addresses": "a:1", "tls": "maybe"},
            "true or false",
        ),
        (
            {"topic": "t", "channel": "c", "nsqd_tcp_addresses": "a:1", "maxInFlght": "3"},
            "maxInFlght",
        ),
        (
            {"topic": "t", "channel": "c", "nsqd_tcp_addresses": "a:1", "max_in_flight": "-5"},
            "at least 1",
        ),
        (
            {"topic": "t", "channel": "c", "nsqd_tcp_addresses": "a:1", "max_in_flight": "abc"},
            "integer",
        ),
        ({"topic": "a b", "channel": "c", "nsqd_tcp_addresses": "a:1"}, "not a topic name"),
        ({"topic": "t", "channel": "c" * 65, "nsqd_tcp_addresses": "a:1"}, "not a channel"),
        (
            {"topic": "t", "channel": "c", "nsqd_tcp_addresses": "http://127.0.0.1:4150"},
            "no scheme",
        ),
        (
            {"topic": "t", "channel": "c", "lookupd_http_addresses": "127.0.0.1:4161/lookup"},
            "no path",
        ),
        ({"topic": "t", "channel": "c", "nsqd_tcp_addresses": "a:70000"}, "host:port"),
    ],
)
def test_source_option_errors(options: dict[str, str], message: str) -> None:
    with pytest.raises(OptionError, match=message):
        parse_source_options(options)


def test_source_options_are_checked_when_spark_asks_for_the_schema() -> None:
    options = {"topic": "t", "channel": "c", "nsqd_tcp_addresses": "a:1", "read_mode": "driver"}
    assert NSQDataSource(options).schema() == SCHEMA
    with pytest.raises(OptionError, match="'channel'"):
        NSQDataSource({"topic": "t", "nsqd_tcp_addresses": "a:1"}).schema()
    # given a schema, Spark first meets the options in streamReader(): the reader it gets
    # fails the query at its first call, with the option error itself
    reader = NSQDataSource({**options, "max_in_flight": "0"}).streamReader(SCHEMA)
    with pytest.raises(OptionError, match="max_in_flight"):
        reader.initialOffset()
    with pytest.raises(OptionError, match="max_in_flight"):
        reader.latestOffset({"seq": 0}, ReadAllAvailable())
    reader.stop()
    narrow = StructType([StructField("nope", StringType())])
    with pytest.raises(ValueError, match="no column 'nope'"):
        NSQDataSource(options).streamReader(narrow).initialOffset()


def test_sink_options() -> None:
    with pytest.raises(OptionError, match=r"max_attempts \(did you mean max_publish_attempts\?\)"):
        parse_sink_options({"nsqd_tcp_addresses": "a:1", "max_attempts": "2"})
    o = parse_sink_options({"nsqd_tcp_addresses": "a:1", "max_publish_attempts": "2"})
    assert o.producer_kwargs()["max_publish_attempts"] == 2
    with pytest.raises(OptionError, match="not a topic name"):
        parse_sink_options({"nsqd_tcp_addresses": "a:1", "topic": "a b"})
    o = parse_sink_options({"nsqd_tcp_addresses": "a:1", "batchSize": "10", "deflate_level": "3"})
    assert (o.topic, o.batch_size, o.max_outstanding) == (None, 10, 8)
    assert o.producer_kwargs()["nsqd_tcp_addresses"] == ["a:1"]
    with pytest.raises(OptionError, match="publish_timeout"):
        parse_sink_options({"nsqd_tcp_addresses": "a:1", "publish_timeout": "soon"})
    # sinks that differ in topic or batching share the worker's producer
    assert (
        o.producer_key()
        == parse_sink_options(
            {"nsqd_tcp_addresses": "a:1", "topic": "other", "batch_size": "3", "deflate_level": "3"}
        ).producer_key()
    )


def test_tls_options_build_a_verifying_context(tmp_path: Any) -> None:
    import trustme

    ca = trustme.CA()
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    o = parse_source_options(
        {
            "topic": "t",
            "channel": "c",
            "nsqd_tcp_addresses": "a:1",
            "tls_ca_file": str(ca_file),
            "read_mode": "driver",
        }
    )
    context = o.connection.ssl_context()
    assert o.connection.tls and context is not None and context.check_hostname
    assert (
        parse_source_options(
            {"topic": "t", "channel": "c", "nsqd_tcp_addresses": "a:1", "read_mode": "driver"}
        ).connection.ssl_context()
        is None
    )


# -- the reader, called the way Spark calls it -----------------------------------------------


def make_reader(emulator: Emulator, topic: str, **options: object) -> NSQStreamReader:
    values = {
        "topic": topic,
        "channel": "c",
        "nsqd_tcp_addresses": emulator.address,
        "read_mode": "driver",
    }
    values.update({k: str(v) for k, v in options.items()})
    return NSQStreamReader(parse_source_options(values), SCHEMA, handle_sigterm=False)


@pytest.fixture
def readers() -> Iterator[list[NSQStreamReader]]:
    made: list[NSQStreamReader] = []
    yield made
    for reader in made:
        reader.stop()


def row_counts(parts: Sequence[object]) -> list[int]:
    """The rows of each of a batch's partitions (each one the source's own, with a length)."""
    counts = []
    for part in parts:
        assert isinstance(part, NSQInputPartition), part
        counts.append(len(part))
    return counts


def held_count(reader: NSQStreamReader) -> int:
    runtime = reader._runtime
    assert runtime is not None
    return runtime.loop.call(runtime.feed.stats)["held"]


def test_the_data_source_and_reader_pickle_and_connect_lazily(emulator: Emulator) -> None:
    source = NSQDataSource(
        {
            "topic": "lazy",
            "channel": "c",
            "nsqd_tcp_addresses": emulator.address,
            "read_mode": "driver",
        }
    )
    reader = source.streamReader(SCHEMA)
    assert isinstance(reader, NSQStreamReader)
    copy = pickle.loads(pickle.dumps(reader))
    pickle.loads(pickle.dumps(source))
    # no loop, no connection yet: the topic does not even exist at nsqd
    assert reader._runtime is None and copy._runtime is None
    assert "lazy" not in emulator.on_loop(emulator.nsqd.topic_names)
    assert copy.options == reader.options
    reader.handle_sigterm = False  # this is pytest's process, not Spark's source runner
    try:
        reader.initialOffset()  # the first call connects
        wait_for(lambda: "lazy" in emulator.on_loop(emulator.nsqd.topic_names), 10, 0.05)
        # a started reader still pickles (without its connection)
        assert pickle.loads(pickle.dumps(reader))._runtime is None
    finally:
        reader.stop()


def test_reader_numbers_messages_and_finishes_after_commit(
    emulator: Emulator, readers: list[NSQStreamReader]
) -> None:
    topic = "units-fin"
    emulator.publish(topic, [b"%02d" % i for i in range(30)])
    reader = make_reader(emulator, topic, max_in_flight=30, numPartitions=2)
    readers.append(reader)
    start = reader.initialOffset()
    assert start == {"seq": 0} == reader.initialOffset()
    assert reader.getDefaultReadLimit() == ReadMaxRows(15)
    wait_for(lambda: held_count(reader) == 30, 10, 0.05)

    end = reader.latestOffset(start, ReadMaxRows(10))
    assert end == {"seq": 10}
    assert reader.reportLatestOffset() == {"seq": 30}
    parts = reader.partitions(start, end)
    assert row_counts(parts) == [5, 5]
    batches = [b for p in parts for b in reader.read(p)]
    assert all(b.schema.equals(to_arrow_schema(SCHEMA, timezone="UTC")) for b in batches)
    table = pa.Table.from_batches(batches)
    assert table.column("body").to_pylist() == [b"%02d" % i for i in range(10)]
    assert set(table.column("attempts").to_pylist()) == {1}
    assert set(table.column("topic").to_pylist()) == {topic}
    # nothing is FINished while the batch runs
    assert emulator.channel_stats(topic, "c").in_flight_count == 30

    # Spark asks past 10 only once batch [0, 10) is committed: those ten are FINished now
    end2 = reader.latestOffset(end, ReadAllAvailable())
    assert end2 == {"seq": 30}
    wait_for(lambda: emulator.channel_stats(topic, "c").in_flight_count == 20, 10, 0.05)
    reader.partitions(end, end2)
    reader.commit(end2)
    reader.commit(end2)  # idempotent
    stats = wait_for(
        lambda: (s := emulator.channel_stats(topic, "c")).in_flight_count == 0 and s, 10, 0.05
    )
    assert (stats.depth, stats.requeue_count) == (0, 0)
    assert reader.latestOffset(end2, ReadMaxRows(10)) == end2  # nothing new


def test_read_limits(emulator: Emulator, readers: list[NSQStreamReader]) -> None:
    topic = "units-limits"
    emulator.publish(topic, [b"x" * 100] * 20)
    reader = make_reader(emulator, topic, max_in_flight=20)
    readers.append(reader)
    start = reader.initialOffset()
    wait_for(lambda: held_count(reader) == 20, 10, 0.05)
    assert reader.latestOffset(start, ReadMinRows(21)) == start  # not enough yet
    end = reader.latestOffset(start, ReadMaxBytes(350))
    assert end == {"seq": 3}
    # asked again from the same start: the numbered three count against the limit
    assert reader.latestOffset(start, ReadMaxRows(5)) == {"seq": 5}
    assert reader.latestOffset(start, ReadMaxBytes(1)) == {"seq": 5}
    assert reader.latestOffset(start, ReadAllAvailable()) == {"seq": 20}


def test_committed_but_unread_messages_are_requeued_not_finished(
    emulator: Emulator, readers: list[NSQStreamReader]
) -> None:
    topic = "units-unread"
    emulator.publish(topic, [b"a", b"b", b"c"])
    reader = make_reader(emulator, topic, max_in_flight=3)
    readers.append(reader)
    start = reader.initialOffset()
    wait_for(lambda: held_count(reader) == 3, 10, 0.05)
    end = reader.latestOffset(start, ReadAllAvailable())
    reader.commit(end)  # partitions() never asked for them
    stats = wait_for(
        lambda: (s := emulator.channel_stats(topic, "c")).requeue_count == 3 and s, 10, 0.05
    )
    assert stats.message_count == 3


def test_a_new_reader_continues_the_numbering_and_stop_requeues(
    emulator: Emulator, readers: list[NSQStreamReader]
) -> None:
    topic = "units-restart"
    emulator.publish(topic, [b"%d" % i for i in range(10)])
    first = make_reader(emulator, topic, max_in_flight=10)
    start = first.initialOffset()
    wait_for(lambda: held_count(first) == 10, 10, 0.05)
    end = first.latestOffset(start, ReadMaxRows(4))
    first.partitions(start, end)
    first.stop()  # the query stops with batch [0, 4) uncommitted: everything goes back
    stats = wait_for(lambda: (s := emulator.channel_stats(topic, "c")).depth == 10 and s, 10, 0.05)
    assert stats.in_flight_count == 0 and stats.requeue_count == 10

    # restarted from the checkpoint: Spark runs batch [0, 4) again, then asks past it
    second = make_reader(emulator, topic, max_in_flight=10)
    readers.append(second)
    assert second.partitions(start, end) == []  # NSQ cannot replay: they come again below
    wait_for(lambda: held_count(second) == 10, 10, 0.05)
    end2 = second.latestOffset(end, ReadAllAvailable())
    assert end2 == {"seq": 14}
    parts = second.partitions(end, end2)
    rows = pa.Table.from_batches([b for p in parts for b in second.read(p)])
    assert sorted(rows.column("body").to_pylist()) == sorted(b"%d" % i for i in range(10))
    assert set(rows.column("attempts").to_pylist()) == {2}  # redelivered: duplicates are visible


def connections(reader: NSQStreamReader) -> list[ConsumerConnectionStats]:
    """The subscribed connections of the reader's consumers."""
    runtime = reader._runtime
    assert runtime is not None

    async def collect() -> list[ConsumerConnectionStats]:
        return [
            c
            for consumer in runtime.feed.consumers
            for c in consumer.stats()["connections"]
            if c["state"] == "SUBSCRIBED"
        ]

    return runtime.loop.call(collect)


def test_the_driver_reader_holds_about_max_bytes_in_flight_of_large_bodies(
    emulator: Emulator, readers: list[NSQStreamReader]
) -> None:
    """400 bodies of 10,000 bytes with max_bytes_in_flight 200,000: nsqd never has more than
    about 20 of them in flight to the reader, a batch carries at most 100,000 bytes (half of
    it, the default of max_bytes_per_trigger) whatever rows Spark allows, and every message
    is read once."""
    topic, n, size = "units-large-bodies", 400, 10_000
    emulator.publish(topic, [f"{i:04d}".encode().ljust(size, b"x") for i in range(n)])
    reader = make_reader(emulator, topic, max_bytes_in_flight=200_000)
    readers.append(reader)
    start = reader.initialOffset()
    peak, seen = 0, list[bytes]()
    deadline = time.monotonic() + 60
    while len(seen) < n and time.monotonic() < deadline:
        time.sleep(0.05)  # what arrives meanwhile
        peak = max(peak, emulator.channel_stats(topic, "c").in_flight_count)
        end = reader.latestOffset(start, ReadMaxRows(1000))
        parts = reader.partitions(start, end)
        batch = [row for part in parts for row in _batch(part).to_pylist()]
        assert sum(len(row["body"]) for row in batch) <= 100_000
        seen.extend(row["body"][:4] for row in batch)
        reader.commit(end)
        start = end
    assert sorted(seen) == [f"{i:04d}".encode() for i in range(n)]
    assert 0 < peak <= 22  # 20, and what was on its way while RDY went down
    stats = wait_for(
        lambda: (s := emulator.channel_stats(topic, "c")).in_flight_count == 0 and s, 10, 0.05
    )
    assert (stats.depth, stats.requeue_count) == (0, 0)


def test_the_driver_readers_window_follows_a_rise_of_body_sizes_at_once_and_a_fall_slowly() -> None:
    base = {"topic": "t", "channel": "c", "nsqd_tcp_addresses": "127.0.0.1:4150"}
    options = parse_source_options(
        {**base, "read_mode": "driver", "max_bytes_in_flight": "1000000"}
    )
    feed = Feed(options)
    assert feed.window == 1  # before any message: nsqd's largest (1 MiB) is expected
    feed._follow_size(10_000.0)
    assert feed.window == 100
    feed._follow_size(100_000.0)  # larger bodies: the window shrinks at once
    assert feed.window == 10
    feed._follow_size(100.0)  # smaller ones: slowly (a few large ones may still come)
    assert feed.window < 20
    for _ in range(100):
        feed._follow_size(100.0)
    assert 8_000 <= feed.window <= 10_000  # 1,000,000 bytes of 100-byte bodies, nearly
    # split between connections that may hold 2,500 each: the first ones full
    assert shares(6000, 2, 2500) == [2500, 3500]  # (a third connection opens for the rest)
    assert shares(3000, 3, 2500) == [2500, 500, 0]


def test_available_now_does_not_wait_for_quiet_once_the_window_is_full(
    emulator: Emulator, readers: list[NSQStreamReader]
) -> None:
    """nsqd sends nothing more once the reader holds its window of large bodies: the batch is
    planned then, not after available_now_idle_timeout (here 120 s) without a message."""
    topic, size = "units-large-available-now", 10_000
    emulator.publish(topic, [f"{i:04d}".encode().ljust(size, b"x") for i in range(100)])
    reader = make_reader(
        emulator,
        topic,
        max_bytes_in_flight=200_000,
        max_bytes_per_trigger=10**9,
        available_now_idle_timeout=120,
    )
    readers.append(reader)
    start = reader.initialOffset()
    reader.prepareForTriggerAvailableNow()
    began = time.monotonic()
    end = reader.latestOffset(start, ReadMaxRows(1000))
    assert time.monotonic() - began < 60
    assert 0 < end["seq"] <= 22


def _batch(part: object) -> pa.RecordBatch:
    assert isinstance(part, NSQInputPartition), part
    return part.batch


def test_max_bytes_in_flight_is_an_option_of_the_driver_reader() -> None:
    base = {"topic": "t", "channel": "c", "nsqd_tcp_addresses": "127.0.0.1:4150"}
    o = parse_source_options({**base, "read_mode": "driver"})
    assert (o.max_bytes_in_flight, o.max_bytes_per_trigger) == (128 << 20, 64 << 20)
    o = parse_source_options({**base, "read_mode": "driver", "max_bytes_in_flight": "1000"})
    assert (o.max_bytes_in_flight, o.max_bytes_per_trigger) == (1000, 500)
    with pytest.raises(OptionError, match="'max_bytes_in_flight' needs read_mode 'driver'"):
        parse_source_options(
            {**base, "nsqd_http_addresses": "127.0.0.1:4151", "max_bytes_in_flight": "1000"}
        )


def test_an_option_of_the_other_read_mode_is_refused_in_either_mode() -> None:
    base = {"topic": "t", "channel": "c", "nsqd_tcp_addresses": "127.0.0.1:4150"}
    executors = {**base, "nsqd_http_addresses": "127.0.0.1:4151"}
    for name, value in [
        ("staging_location", "/tmp/staged"),
        ("max_messages_per_task", "10"),
        ("max_bytes_per_task", "10"),
        ("min_partitions", "2"),
        ("task_idle_timeout", "2"),
        ("redelivery_window", "60"),
    ]:
        with pytest.raises(OptionError, match=f"^option '{name}' needs read_mode 'executors'$"):
            parse_source_options({**base, "read_mode": "driver", name: value})
        assert getattr(parse_source_options({**executors, name: value}), name) is not None
    with pytest.raises(OptionError, match=r"^option 'nsqd_http_addresses' needs read_mode 'exec"):
        parse_source_options({**executors, "read_mode": "driver"})
    for name, value in [
        ("max_in_flight", "10"),
        ("num_partitions", "2"),
        ("max_msg_timeout", "100"),
        ("available_now_idle_timeout", "1"),
    ]:
        with pytest.raises(OptionError, match=f"^option '{name}' needs read_mode 'driver'$"):
            parse_source_options({**executors, name: value})
        parse_source_options({**base, "read_mode": "driver", name: value})
    # every one of them is named, in any spelling; an empty value is no option
    with pytest.raises(
        OptionError,
        match=r"^option 'staging_location' needs read_mode 'executors'; "
        r"option 'task_idle_timeout' needs read_mode 'executors'$",
    ):
        parse_source_options(
            {**base, "readMode": "DRIVER", "stagingLocation": "/s", "TASK_IDLE_TIMEOUT": "2"}
        )
    parse_source_options({**base, "read_mode": "driver", "staging_location": ""})


def test_the_parsed_options_are_the_tables_options() -> None:
    from dataclasses import MISSING, fields

    from nsq_spark._options import (
        CONNECTION_OPTIONS,
        SINK_OPTIONS,
        SOURCE_OPTIONS,
        ConnectionOptions,
        SinkOptions,
        SourceOptions,
    )

    for cls, table in [
        (ConnectionOptions, CONNECTION_OPTIONS),
        (SourceOptions, SOURCE_OPTIONS),
        (SinkOptions, SINK_OPTIONS),
    ]:
        own = [f for f in fields(cls) if f.name != "connection"]
        assert [f.name for f in own] == [o.name for o in table], cls.__name__
        # the defaults are the table's alone
        assert all(f.default is MISSING and f.default_factory is MISSING for f in own)
    # given nothing but what it needs, each option is its table's default
    o = parse_source_options({"topic": "t", "channel": "c", "lookupd_http_addresses": "l:1"})
    for option in SOURCE_OPTIONS[3:]:
        if option.name not in ("max_bytes_per_trigger", "max_messages_per_trigger"):
            assert getattr(o, option.name) == option.default, option.name
    assert (o.max_messages_per_trigger, o.max_bytes_per_trigger) == (1_000_000, 256 << 20)
    sink = parse_sink_options({"nsqd_tcp_addresses": "a:1"})
    for option in SINK_OPTIONS:
        assert getattr(sink, option.name) == option.default, option.name
    for option in CONNECTION_OPTIONS[2:]:
        assert getattr(sink.connection, option.name) == option.default, option.name


def test_max_in_flight_above_nsqds_cap_opens_more_connections(
    emulator: Emulator, readers: list[NSQStreamReader]
) -> None:
    # nsqd lets one connection hold 2,500 unanswered messages (--max-rdy-count); the source
    # holds a whole batch until it is committed, so it needs more connections to hold more
    topic = "units-pool"
    emulator.publish(topic, [b"%d" % i for i in range(6500)])
    reader = make_reader(emulator, topic, max_in_flight=6000)
    readers.append(reader)
    start = reader.initialOffset()
    end = wait_for(
        lambda: (e := reader.latestOffset(start, ReadAllAvailable()))["seq"] >= 6000 and e,
        20,
        0.05,
    )
    assert end == {"seq": 6000}  # all it may hold, and not one more
    conns = connections(reader)
    assert len(conns) == 3
    assert all(c["address"] == emulator.address and c["rdy"] <= 2500 for c in conns)
    assert sum(c["in_flight"] for c in conns) == 6000
    assert sum(c["rdy"] for c in conns) <= 6000
    assert emulator.channel_stats(topic, "c").in_flight_count == 6000
    # the batch is committed: its FINs go out, and the rest comes in
    parts = reader.partitions(start, end)
    assert sum(row_counts(parts)) == 6000
    end2 = wait_for(
        lambda: (e := reader.latestOffset(end, ReadAllAvailable()))["seq"] == 6500 and e,
        20,
        0.05,
    )
    reader.partitions(end, end2)
    reader.commit(end2)
    stats = wait_for(
        lambda: (s := emulator.channel_stats(topic, "c")).in_flight_count == 0 and s, 10, 0.05
    )
    assert (stats.depth, stats.requeue_count, stats.message_count) == (0, 0, 6500)


def test_max_in_flight_above_what_the_connections_may_hold_is_a_warning(
    emulator: Emulator, readers: list[NSQStreamReader], caplog: pytest.LogCaptureFixture
) -> None:
    reader = make_reader(emulator, "units-cap", max_in_flight=3000, max_connections_per_nsqd=1)
    readers.append(reader)
    start = reader.initialOffset()
    wait_for(lambda: connections(reader), 10, 0.05)
    with caplog.at_level(logging.WARNING, logger="nsq_spark"):
        reader.latestOffset(start, ReadMaxRows(10))
        reader.latestOffset(start, ReadMaxRows(10))
    warnings = [r.getMessage() for r in caplog.records if r.name == "nsq_spark"]
    assert warnings == [
        "max_in_flight 3000 is above what nsqd allows: the source holds at most 2500 messages"
        f" (1 connections per nsqd: {emulator.address} 2500; nsqd's --max-rdy-count, the"
        " option max_connections_per_nsqd)"
    ]
    # below the cap: nothing to say
    caplog.clear()
    quiet = make_reader(emulator, "units-cap", max_in_flight=2500, max_connections_per_nsqd=1)
    readers.append(quiet)
    start = quiet.initialOffset()
    wait_for(lambda: connections(quiet), 10, 0.05)
    with caplog.at_level(logging.WARNING, logger="nsq_spark"):
        quiet.latestOffset(start, ReadMaxRows(10))
    assert not [r for r in caplog.records if r.name == "nsq_spark"]


def closed_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@pytest.mark.parametrize("where", ["nsqd_tcp_addresses", "lookupd_http_addresses"])
def test_an_unreachable_nsqd_fails_the_reader_after_connect_timeout(where: str) -> None:
    address = f"127.0.0.1:{closed_port()}"
    options = {
        "topic": "t",
        "channel": "c",
        where: address,
        "connect_timeout": "0.5",
        "read_mode": "driver",
    }
    reader = NSQStreamReader(parse_source_options(options), SCHEMA, handle_sigterm=False)
    started = time.monotonic()
    try:
        start = reader.initialOffset()
        with pytest.raises(ConnectTimeout) as info:
            while time.monotonic() - started < 10:  # Spark asks at every trigger
                reader.latestOffset(start, ReadMaxRows(10))
                time.sleep(0.05)
    finally:
        reader.stop()
    assert 0.5 <= time.monotonic() - started < 3
    message = str(info.value)
    assert message.startswith(
        f"the nsq source of t/c has no nsqd to consume from after connect_timeout (0.5 s) "
        f"({where.split('_')[0]} {address}); last error: "
    )
    # the refusal, named
    assert message.endswith("failed: connection refused")


def test_read_with_a_narrower_schema(emulator: Emulator) -> None:
    schema = StructType([StructField("id", StringType()), StructField("body", StringType())])
    options = parse_source_options(
        {
            "topic": "t",
            "channel": "c",
            "nsqd_tcp_addresses": emulator.address,
            "read_mode": "driver",
        }
    )
    reader = NSQStreamReader(options, schema, handle_sigterm=False)
    core = nsq_proto.Message(b"0123456789abcdef", 0, 1, b"text")
    message = SimpleNamespace(id=core.id, body=core.body, raw=core)
    arrow_schema = to_arrow_schema(schema, timezone="UTC")
    # a stand-in for the message: only what the schema's columns need is read
    part = NSQInputPartition(0, record_batch([message], arrow_schema, "t"))  # type: ignore[list-item]
    (batch,) = list(reader.read(pickle.loads(pickle.dumps(part))))
    assert batch.to_pylist() == [{"id": "0123456789abcdef", "body": "text"}]
    with pytest.raises(ValueError, match="no column"):
        NSQStreamReader(options, StructType([StructField("nope", StringType())]))


def test_sparks_read_limits_are_one_kind_and_amount() -> None:
    """The planning module tells pyspark's limits apart without importing pyspark."""
    from pyspark.sql.streaming.datasource import ReadMaxFiles

    from nsq_spark._planning import read_limit

    assert read_limit(ReadMaxRows(5)) == ("rows", 5)
    assert read_limit(ReadMaxBytes(1000)) == ("bytes", 1000)
    assert read_limit(ReadMinRows(7)) == ("min_rows", 7)
    assert read_limit(ReadAllAvailable()) == ("all", 0)
    assert read_limit(ReadMaxFiles(3)) == ("all", 0)


def test_message_ids() -> None:
    assert message_id(b"0a1b2c3d4e5f6071") == "0a1b2c3d4e5f6071"
    assert message_id(b"\x00\x01" + b"\xff" * 14) == "0001" + "ff" * 14


def test_record_batch_columns() -> None:
    def stand_in(core: nsq_proto.Message, nsqd: str, partition: int | None) -> Any:
        return SimpleNamespace(raw=core, id=core.id, nsqd_address=nsqd, partition=partition)

    nsqd_ids = [b"0a1b2c3d4e5f6071", b"0a1b2c3d4e5f6072"]
    binary = b"\x00\x01" + b"\xff" * 14
    cases = {
        "nsqd": [
            stand_in(nsq_proto.Message(i, 1_795_700_331_123_456_789, 2, b"b"), "a:1", None)
            for i in nsqd_ids
        ],
        # the partitioned server's binary ids, among printable ones: each shown as it would be
        "partitioned": [
            stand_in(nsq_proto.Message(i, 7_999, 1, b"", trace_id=9), "b:2", 3)
            for i in [*nsqd_ids, binary, b"ab\x7fcd"]
        ],
        "none": [],
    }
    arrow_schema = to_arrow_schema(SCHEMA, timezone="UTC")
    for name, messages in cases.items():
        rows = record_batch(messages, arrow_schema, "t").to_pylist()
        assert len(rows) == len(messages), name
        for row, m in zip(rows, messages, strict=True):
            core = m.raw
            assert row["id"] == message_id(core.id)
            assert (row["body"], row["attempts"]) == (core.body, core.attempts)
            micros = row["timestamp"].timestamp() * 1e6
            assert abs(micros - core.timestamp // 1000) < 2  # microseconds, truncated
            assert (row["topic"], row["nsqd"]) == ("t", m.nsqd_address)
            assert (row["partition"], row["trace_id"]) == (m.partition, core.trace_id)
    ids = [r["id"] for r in record_batch(cases["partitioned"], arrow_schema, "t").to_pylist()]
    assert ids[2:] == ["0001" + "ff" * 14, "6162" + "7f" + "6364"]


def test_a_tasks_rows_are_built_without_importing_pandas() -> None:
    """pyarrow imports pandas (when installed) the first time it converts a Python list or
    scalar: most of the first second of each Python worker's first task.  The rows are built
    from their buffers instead."""
    code = """if True:
        import sys
        import pyarrow as pa
        from pyspark.sql.pandas.types import to_arrow_schema
        import nsq_proto
        from types import SimpleNamespace
        from nsq_spark import SCHEMA
        from nsq_spark._rows import message_ids, record_batch

        def stand_in(core, nsqd, partition):
            return SimpleNamespace(raw=core, id=core.id, nsqd_address=nsqd, partition=partition)

        schema = to_arrow_schema(SCHEMA, timezone="UTC")
        for partition, trace_id, ident in ((None, None, b"0a1b2c3d4e5f6071"), (3, 9, b"\\x00")):
            core = nsq_proto.Message(ident, 7_999, 1, b"b", trace_id=trace_id)
            messages = [stand_in(core, "a:1", partition)] * 3
            ids = message_ids(messages)
            batch = record_batch(messages, schema, "t", ids=ids)
            table = pa.Table.from_batches([batch]).append_column("_id", ids)
            table.replace_schema_metadata({"k": "v"}).to_batches()
        print(sorted(m for m in sys.modules if m.split(".")[0] == "pandas")[:3])
    """
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


# -- the sink's batching ---------------------------------------------------------------------


def test_rows_become_mpub_batches_by_topic_count_and_size() -> None:
    options = parse_sink_options(
        {"nsqd_tcp_addresses": "a:1", "topic": "default", "batch_size": "3", "batch_bytes": "10"}
    )
    batch = pa.RecordBatch.from_pydict(
        {
            "body": ["a", "b", "c", "d", "eeeeeeeeee", "f", "g", "late"],
            "topic": [None, None, None, None, None, "other", "other", None],
            "delay": [None, None, None, None, None, None, 0.0, 1.5],
            "partition": [None] * 8,
            "sharding_key": [None, None, None, None, None, None, "k", None],
        }
    )
    requests = list(_requests(batch, options))
    summary = sorted((r.topic, r.bodies, r.delay, r.sharding_key) for r in requests)
    assert summary == [
        ("default", [b"a", b"b", b"c"], None, None),  # batch_size
        ("default", [b"d"], None, None),  # batch_bytes: d + eeeeeeeeee > 10
        ("default", [b"eeeeeeeeee"], None, None),
        ("default", [b"late"], 1.5, None),  # DPUB
        ("other", [b"f"], None, None),
        ("other", [b"g"], None, b"k"),
    ]


def test_a_null_body_fails_the_task() -> None:
    options = parse_sink_options({"nsqd_tcp_addresses": "a:1", "topic": "t"})
    batch = pa.RecordBatch.from_pydict({"body": pa.array([b"x", None], pa.binary())})
    with pytest.raises(ValueError, match="null"):
        list(_requests(batch, options))


def test_publish_batches_against_the_emulator(emulator: Emulator) -> None:
    from nsq_spark._sink import _POOL, publish_batches

    options = parse_sink_options({"nsqd_tcp_addresses": emulator.address, "topic": "units-sink"})
    batches = [
        pa.RecordBatch.from_pydict({"body": [f"{i}-{j}".encode() for j in range(250)]})
        for i in range(4)
    ]
    message = publish_batches(iter(batches), options)
    assert (message.messages, message.requests) == (1000, 4)
    assert emulator.topic_stats("units-sink").message_count == 1000
    # the pooled producer serves the next task
    producer = _POOL.get(options)
    publish_batches(iter(batches[:1]), options)
    assert _POOL.get(options) is producer
    assert emulator.topic_stats("units-sink").message_count == 1250
    _POOL.close()


def test_a_refused_publish_fails_the_task_and_drops_the_producer(emulator: Emulator) -> None:
    from nsq_anyio import ServerError
    from nsq_spark._sink import _POOL, publish_batches

    options = parse_sink_options(
        {
            "nsqd_tcp_addresses": emulator.address,
            "topic": "units-refused",
            "max_publish_attempts": "1",
        }
    )
    too_big = b"x" * (emulator.nsqd.options.max_msg_size + 1)
    with pytest.raises(ServerError):
        publish_batches(iter([pa.RecordBatch.from_pydict({"body": [b"ok", too_big]})]), options)
    assert options.producer_key() not in _POOL._producers  # the retry starts afresh
    # the small body went out in an MPUB of its own (batch_bytes): a retry publishes it again
    assert emulator.topic_stats("units-refused").message_count == 1
    _POOL.close()


def test_tls_and_compression_end_to_end(tmp_path: Any, readers: list[NSQStreamReader]) -> None:
    import ssl

    import trustme
    from anyio.from_thread import start_blocking_portal

    from nsq_emulator.loopback import serve_emulator
    from nsq_spark._sink import _POOL, publish_batches

    ca = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_context)
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    with start_blocking_portal() as portal:
        serving = serve_emulator(lookupd=False, tls_context=server_context)
        with portal.wrap_async_context_manager(serving) as cluster:
            emulator = Emulator(portal, cluster)
            common = {"nsqd_tcp_addresses": emulator.address, "tls_ca_file": str(ca_file)}
            sink = parse_sink_options({**common, "topic": "tls", "compression": "snappy"})
            publish_batches(iter([pa.RecordBatch.from_pydict({"body": [b"a", b"b"]})]), sink)
            _POOL.close()
            reader = NSQStreamReader(
                parse_source_options(
                    {
                        **common,
                        "topic": "tls",
                        "channel": "c",
                        "compression": "deflate",
                        "read_mode": "driver",
                    }
                ),
                SCHEMA,
                handle_sigterm=False,
            )
            readers.append(reader)
            start = reader.initialOffset()
            wait_for(lambda: held_count(reader) == 2, 10, 0.05)
            end = reader.latestOffset(start, ReadAllAvailable())
            rows = [
                r
                for p in reader.partitions(start, end)
                for b in reader.read(p)
                for r in b.to_pylist()
            ]
            assert sorted(r["body"] for r in rows) == [b"a", b"b"]
            reader.stop()
            readers.clear()


def test_an_nsqd_restart_while_a_batch_runs_loses_nothing() -> None:
    # the connections that delivered a running batch die with nsqd: the batch's messages come
    # back (attempts 2) in later batches, and the late commit's FINs are moot
    from anyio.from_thread import start_blocking_portal

    from nsq_emulator.loopback import serve_emulator

    with start_blocking_portal() as portal:
        with portal.wrap_async_context_manager(serve_emulator(lookupd=False)) as cluster:
            emulator = Emulator(portal, cluster)
            bodies = [b"%03d" % i for i in range(300)]
            emulator.publish("restart", bodies)
            reader = make_reader(
                emulator, "restart", max_in_flight=200, reconnect_delay=0.1, msg_timeout=5
            )
            try:
                start = reader.initialOffset()
                end = wait_for(
                    lambda: (e := reader.latestOffset(start, ReadMaxRows(150)))["seq"] == 150 and e,
                    10,
                    0.05,
                )
                first = [b for p in reader.partitions(start, end) for b in reader.read(p)]
                emulator.stop_nsqd()
                emulator.start_nsqd()
                seen = pa.Table.from_batches(first).to_pylist()
                reader.commit(end)
                deadline = time.monotonic() + 30
                while {r["body"] for r in seen} != set(bodies) and time.monotonic() < deadline:
                    nxt = reader.latestOffset(end, ReadMaxRows(150))
                    if nxt != end:
                        parts = reader.partitions(end, nxt)
                        seen += pa.Table.from_batches(
                            [b for p in parts for b in reader.read(p)]
                        ).to_pylist()
                        reader.commit(nxt)
                        end = nxt
                    time.sleep(0.05)
                reader.latestOffset(end, ReadMaxRows(150))  # FINs what was committed
            finally:
                reader.stop()  # requeues what it holds beyond the batches
            stats = wait_for(
                lambda: (s := emulator.channel_stats("restart", "c")).in_flight_count == 0 and s,
                10,
                0.05,
            )
    assert {r["body"] for r in seen} == set(bodies)  # nothing lost
    # a message seen twice was delivered again by nsqd, and its attempts say so
    copies: dict[bytes, list[int]] = {}
    for r in seen:
        copies.setdefault(r["body"], []).append(r["attempts"])
    assert all(max(a) > 1 for a in copies.values() if len(a) > 1)
    assert any(max(a) > 1 for a in copies.values())  # the restart did redeliver
    assert stats.in_flight_count == 0  # nothing stuck in flight


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ((700, 10, 10), (100_000, 50, 100)),
        ((200_000, 5, 5), (200_000, 5, 5)),
        ((0, 10, 10), (0, 10, 10)),
    ],
)
def test_the_reader_collects_less_often_unless_told_otherwise(
    emulator: Emulator, before: tuple[int, int, int], after: tuple[int, int, int]
) -> None:
    saved = gc.get_threshold()
    gc.set_threshold(*before)
    reader = make_reader(emulator, "units-gc")
    try:
        reader.initialOffset()  # the reader's runtime starts here
        assert gc.get_threshold() == after
    finally:
        reader.stop()
        gc.set_threshold(*saved)
