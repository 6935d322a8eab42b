"""What both stream readers share (``_source``'s on the driver, ``_executor_source``'s on the
executors): the options, the schema and its columns, what is never pickled, the default read
limit, the check of the partitions ``read()`` gets; and the reader of a source whose options
are wrong.  Also the collector's thresholds of a process that holds many messages."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar, NoReturn

import pyarrow as pa  # type: ignore[import-untyped]
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from ._options import SourceOptions
from ._planning import check_columns

__all__ = [
    "GC_THRESHOLD",
    "NSQReader",
    "RefusingStreamReader",
    "fewer_collections",
    "tune_gc",
]


#: the collector's first threshold in the process that runs the reader
GC_THRESHOLD = 100_000


def tune_gc() -> None:
    """The reader holds up to ``max_in_flight`` messages (a few objects each) for about one
    batch, and receives as many every batch: with Python's default thresholds the cyclic
    collector runs every 700 allocations and walks all of them, which cost about a third of
    the reader's CPU.  The reader runs in a process of its own (Spark's source runner), so it
    collects less often there, unless the thresholds were already raised."""
    first, second, third = gc.get_threshold()
    if 0 < first < GC_THRESHOLD:
        gc.set_threshold(GC_THRESHOLD, max(second, 50), max(third, 100))


@contextlib.contextmanager
def fewer_collections() -> Iterator[None]:
    """The collector's first threshold at :data:`GC_THRESHOLD` for the block, then as it was:
    a task on an executor receives and holds its whole share (tens of thousands of messages,
    a few objects each) before it answers any, and with Python's default of 700 the cyclic
    collector walked them all over and over, about a third of the task's CPU.  The Python
    worker that runs the task may run other code after it, so the thresholds are restored."""
    saved = gc.get_threshold()
    tune_gc()
    try:
        yield
    finally:
        gc.set_threshold(*saved)


class NSQReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The part both readers share: ``options``, ``schema`` (its columns checked), the live
    attributes left out of a pickle (:attr:`live`), the default read limit, and ``read()``'s
    check that a partition is the reader's own (:attr:`partition_type`) before
    :meth:`read_rows` reads it."""

    #: the attributes that are set to None in a pickle (the reader's live part)
    live: ClassVar[tuple[str, ...]] = ()
    #: the input partitions the reader plans
    partition_type: ClassVar[type[InputPartition]] = InputPartition
    #: the rows of one of the reader's own partitions (each reader defines it)
    read_rows: Callable[[Any], Iterator[pa.RecordBatch]]

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema
        check_columns(schema.fieldNames())

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for name in self.live:
            state[name] = None
        return state

    def arrow_schema(self) -> pa.Schema:
        """The query's schema as Arrow's (timestamps in UTC)."""
        return to_arrow_schema(self.schema, timezone="UTC")

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.options.max_messages_per_trigger)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, self.partition_type):
            raise TypeError(f"not a partition of the nsq source: {partition!r}")
        yield from self.read_rows(partition)


class RefusingStreamReader(DataSourceStreamReader):
    """The reader of a source whose options (or schema) are wrong: every call Spark makes
    raises that error, so the query fails at once with it."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def _refuse(self) -> NoReturn:
        raise self.error

    def initialOffset(self) -> dict[str, int]:
        self._refuse()

    def getDefaultReadLimit(self) -> ReadLimit:
        self._refuse()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, int]:
        self._refuse()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        self._refuse()

    def commit(self, end: dict[str, Any]) -> None:
        self._refuse()

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        self._refuse()

    def stop(self) -> None:
        pass
