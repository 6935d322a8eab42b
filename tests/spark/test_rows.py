"""The rows of a batch (``nsq_spark._rows``) without a JVM: message ids and the Arrow columns
built from the messages."""

from __future__ import annotations

import collections
import subprocess
import sys
import types
from typing import Any, cast

from pyspark.sql.pandas.types import to_arrow_schema

import nsq_proto
from nsq_client._message import Message, _Origin
from nsq_spark import SCHEMA
from nsq_spark._rows import message_id, record_batch


class _NoConsumer:
    """What a message's origin reads of the consumer that delivered it, for messages that
    are only turned into rows (never answered)."""

    def __init__(self) -> None:
        self._inbox = types.SimpleNamespace(items=collections.deque())
        self._answering: list[object] = []
        self._runner = None


def test_message_ids() -> None:
    assert message_id(b"0a1b2c3d4e5f6071") == "0a1b2c3d4e5f6071"
    assert message_id(b"\x00\x01" + b"\xff" * 14) == "0001" + "ff" * 14


def test_record_batch_columns() -> None:
    def stand_in(core: nsq_proto.Message, nsqd: str, partition: int | None) -> Any:
        # the client's message, as a consumer of nsqd at ``nsqd`` delivers it
        return Message._of(_Origin(cast(Any, _NoConsumer()), 1, nsqd, partition), core)

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
        from nsq_client._message import Message, _Origin
        from nsq_spark import SCHEMA
        from nsq_spark._rows import message_ids, record_batch

        import collections, types

        def stand_in(core, nsqd, partition):
            consumer = types.SimpleNamespace(
                _inbox=types.SimpleNamespace(items=collections.deque()), _answering=[], _runner=None
            )
            return Message._of(_Origin(consumer, 1, nsqd, partition), core)

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
