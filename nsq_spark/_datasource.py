"""The ``nsq`` data source: what ``spark.dataSource.register`` takes."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from ._executor_source import NSQExecutorStreamReader
from ._options import parse_sink_options, parse_source_options
from ._reader import RefusingStreamReader
from ._sink import NSQStreamWriter, NSQWriter, check_sink_schema
from ._source import NSQStreamReader

__all__ = [
    "BATCH_READ_ERROR",
    "BatchReadNotSupported",
    "NSQDataSource",
    "SCHEMA",
    "use_this_interpreter",
]

log = logging.getLogger("nsq_spark")


class BatchReadNotSupported(ValueError):
    """``spark.read.format("nsq")``: the source reads streams only (its message says how to
    read what waits now)."""


BatchReadNotSupported.__module__ = "nsq_spark"

#: the message of :class:`BatchReadNotSupported`
BATCH_READ_ERROR = (
    "the nsq source reads streams only (reading a queue consumes it, so a batch DataFrame would "
    "take messages away each time it is computed): read the messages waiting now with "
    'spark.readStream.format("nsq") and .trigger(availableNow=True), which ends once it has '
    "read them, into a sink such as parquet or foreachBatch"
)

#: the rows of ``spark.readStream.format("nsq")``
SCHEMA = StructType(
    [
        StructField("body", BinaryType()),
        StructField("id", StringType()),
        StructField("attempts", IntegerType()),
        StructField("timestamp", TimestampType()),
        StructField("topic", StringType()),
        StructField("nsqd", StringType()),
        StructField("partition", IntegerType()),
        StructField("trace_id", LongType()),
    ]
)


class NSQDataSource(DataSource):
    """NSQ for Spark: ``readStream.format("nsq")`` (a topic/channel; replayable micro-batches
    read on the executors, or at-least-once on the driver) and ``write``/``writeStream
    .format("nsq")`` (MPUB, at-least-once); a batch ``read`` is refused.

    .. code-block:: python

        spark.dataSource.register(NSQDataSource)
        df = (
            spark.readStream.format("nsq")
            .option("nsqd_tcp_addresses", "127.0.0.1:4150")
            .option("topic", "events")
            .option("channel", "spark")
            .load()
        )
    """

    @classmethod
    def name(cls) -> str:
        # ``spark.dataSource.register`` asks the name on the driver, just before it hands the
        # class to Spark with the interpreter its Python workers will run
        use_this_interpreter()
        return "nsq"

    def schema(self) -> StructType:
        # Spark asks for the schema when ``.load()`` runs: the options fail here, at once
        with _reported_alone():
            parse_source_options(self.options)
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        with _reported_alone():
            raise BatchReadNotSupported(BATCH_READ_ERROR)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        try:
            options = parse_source_options(self.options)
            if options.read_mode == "executors":
                return NSQExecutorStreamReader(options, schema)
            return NSQStreamReader(options, schema)
        except ValueError as exc:
            # with a schema given, ``.load()`` does not ask for ours and the options arrive
            # here first; an exception raised here reaches the user buried under one of
            # PySpark's own, so the reader fails the query at its first call instead
            return RefusingStreamReader(exc)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        with _reported_alone():
            options = parse_sink_options(self.options)
            _check_write(schema, overwrite)
            check_sink_schema(schema, options)
        return NSQWriter(options)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        with _reported_alone():
            options = parse_sink_options(self.options)
            _check_write(schema, overwrite)
            check_sink_schema(schema, options)
        return NSQStreamWriter(options)


@contextlib.contextmanager
def _reported_alone() -> Iterator[None]:
    """A mistake of the user's (an option, the DataFrame's columns, a batch read) raised while
    Spark plans, in one of its Python workers: Spark reports it without our traceback, so that
    its line comes first in the error the user sees, right after Spark's own words (over Spark
    Connect a JVM stack trace follows it).  The planning workers report one error and exit, so
    the setting (Spark's ``spark.sql.execution.pyspark.udf.hideTraceback.enabled``) ends with
    them; outside a Spark worker nothing changes."""
    try:
        yield
    except ValueError:
        if "PYTHON_WORKER_FACTORY_SECRET" in os.environ:
            os.environ["SPARK_HIDE_TRACEBACK"] = "1"
        raise


def _check_write(schema: StructType, overwrite: bool) -> None:
    if overwrite:
        raise ValueError("an nsq topic cannot be overwritten: write with mode 'append'")


def use_this_interpreter() -> None:
    """Make Spark's Python workers run this interpreter when the user chose none.

    Spark starts its Python workers (which unpickle the data source, so they must import
    ``nsq_spark``) with ``PYSPARK_PYTHON``, or ``python3`` from the ``PATH`` when it is not
    set: not the virtual environment of a job started as ``.venv/bin/python job.py``.  With a
    local master (every worker on this machine) and neither ``PYSPARK_PYTHON`` nor
    ``spark.pyspark.python`` set, the active SparkContext's workers run ``sys.executable``
    instead; with another master the workers' Python is the cluster's business, and a
    warning says what to set.  Nothing happens without an active SparkContext (in a Python
    worker, or a Spark Connect client)."""
    try:
        from pyspark import SparkContext
    except ImportError:  # pragma: no cover (pyspark is what calls this)
        return
    sc = SparkContext._active_spark_context
    if sc is None or sc.pythonExec != "python3" or os.environ.get("PYSPARK_PYTHON"):
        return
    if not sys.executable or sc.getConf().get("spark.pyspark.python"):
        return
    if (sc.master or "").startswith("local"):
        sc.pythonExec = sys.executable
        log.info("Spark's Python workers run %s (PYSPARK_PYTHON is not set)", sys.executable)
    else:
        log.warning(
            "PYSPARK_PYTHON is not set: Spark's Python workers on the executors run python3, "
            "which must import nsq_spark; set PYSPARK_PYTHON (or spark.pyspark.python) to a "
            "Python that has it on every worker (this one is %s)",
            sys.executable,
        )
