"""nsq_spark: NSQ as a PySpark data source (``format("nsq")``), built on ``nsq_anyio``.

.. code-block:: python

    from nsq_spark import NSQDataSource

    spark.dataSource.register(NSQDataSource)
    events = (
        spark.readStream.format("nsq")
        .option("nsqd_tcp_addresses", "127.0.0.1:4150")
        .option("topic", "events")
        .option("channel", "spark")
        .load()
    )
    (
        events.selectExpr("body")
        .writeStream.format("nsq")
        .option("nsqd_tcp_addresses", "127.0.0.1:4150")
        .option("topic", "copied")
        .option("checkpointLocation", "/tmp/copy")
        .start()
    )

Read on the executors (the default), a micro-batch that runs again gives the same rows, so
each message reaches a sink that is idempotent per batch exactly once (but for two narrow
windows); read on the driver (``read_mode`` ``driver``) and published by the sink, delivery is
at-least-once.  The options, the guarantees and how to run it are in ``docs/spark.md`` (the
"Spark source and sink" page of the documentation).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._datasource import SCHEMA, BatchReadNotSupported, NSQDataSource
from ._executor_source import NSQExecutorStreamReader, NSQStagedPartition
from ._options import OptionError
from ._sink import NSQCommitMessage, NSQStreamWriter, NSQWriter
from ._source import ConnectTimeout, NSQInputPartition, NSQStreamReader
from ._staging import StagingNotShared

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "SCHEMA",
    "BatchReadNotSupported",
    "ConnectTimeout",
    "NSQCommitMessage",
    "NSQDataSource",
    "NSQExecutorStreamReader",
    "NSQInputPartition",
    "NSQStagedPartition",
    "NSQStreamReader",
    "NSQStreamWriter",
    "NSQWriter",
    "OptionError",
    "StagingNotShared",
    "register",
]


def register(spark: SparkSession) -> None:
    """``spark.dataSource.register(NSQDataSource)``: makes ``format("nsq")`` available."""
    spark.dataSource.register(NSQDataSource)
