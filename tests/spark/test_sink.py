"""The sink (``nsq_spark._sink``) without a JVM: how rows become MPUB batches, and publishing
them to the emulator."""

from __future__ import annotations

import pyarrow as pa  # type: ignore[import-untyped]  # no type information (as in nsq_spark)
import pytest

from nsq_spark._options import parse_sink_options
from nsq_spark._sink import _requests

from .helpers import Emulator


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
    with pytest.raises(ServerError) as refused:
        publish_batches(iter([pa.RecordBatch.from_pydict({"body": [b"ok", too_big]})]), options)
    assert refused.value.code == "E_BAD_MESSAGE"
    assert options.producer_key() not in _POOL._producers  # the retry starts afresh
    # the small body may have gone before the task failed (at least once), never twice
    stored = emulator.topic_stats("units-refused").message_count
    assert stored <= 1
    # the task's retry (here without the bad body) publishes on a new producer
    publish_batches(iter([pa.RecordBatch.from_pydict({"body": [b"ok"]})]), options)
    assert emulator.topic_stats("units-refused").message_count == stored + 1
    _POOL.close()
