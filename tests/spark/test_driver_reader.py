"""The driver-side reader (``read_mode="driver"``: ``nsq_spark._reader``, its feed and the data
source that makes it) without a JVM, against the emulator: what Spark would call, called
directly.  Its options are ``test_options``'s, the rows it builds ``test_rows``'s."""

from __future__ import annotations

import gc
import logging
import pickle
import socket
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
)
from nsq_spark._feed import Feed
from nsq_spark._options import parse_sink_options, parse_source_options
from nsq_spark._planning import shares
from nsq_spark._rows import record_batch

from .helpers import Emulator, wait_for


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
    about 20 of them in flight to the reader, a batch carries at most 50,000 bytes (a quarter
    of it, the default of max_bytes_per_trigger) whatever rows Spark allows, and every message
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
        assert sum(len(row["body"]) for row in batch) <= 50_000
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


# -- with the sink: TLS and compression, both ways ----------------------------------------------


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
    # the restart did redeliver: the first batch's messages came back, either into a later
    # batch (attempts 2) or, when every body was seen before they reached one, into the
    # channel, requeued by stop() (their first batch's FINs went to a connection that died)
    assert any(max(a) > 1 for a in copies.values()) or stats.depth > 0
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
