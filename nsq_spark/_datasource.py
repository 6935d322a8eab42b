"""The ``nsq`` data source: what ``spark.dataSource.register`` takes."""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
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
from ._sink import NSQStreamWriter, NSQWriter, check_sink_schema
from ._source import NSQStreamReader, RefusingStreamReader

__all__ = ["NSQDataSource", "SCHEMA"]

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
    """NSQ for Spark: ``readStream.format("nsq")`` (topic/channel, at-least-once) and
    ``write``/``writeStream.format("nsq")`` (MPUB, at-least-once).

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
        return "nsq"

    def schema(self) -> StructType:
        # Spark asks for the schema when ``.load()`` runs: the options fail here, at once
        parse_source_options(self.options)
        return SCHEMA

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
        options = parse_sink_options(self.options)
        _check_write(schema, overwrite)
        check_sink_schema(schema, options)
        return NSQWriter(options)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        options = parse_sink_options(self.options)
        _check_write(schema, overwrite)
        check_sink_schema(schema, options)
        return NSQStreamWriter(options)


def _check_write(schema: StructType, overwrite: bool) -> None:
    if overwrite:
        raise ValueError("an nsq topic cannot be overwritten: write with mode 'append'")
