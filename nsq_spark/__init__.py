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

from importlib import import_module
from typing import TYPE_CHECKING, Any

from ._option_parsers import OptionError
from ._planning import ConnectTimeout

if TYPE_CHECKING:  # imported on first use (below): pyspark and pyarrow come with them
    from pyspark.sql import SparkSession

    from ._datasource import SCHEMA, BatchReadNotSupported, NSQDataSource
    from ._executor_source import NSQExecutorStreamReader, NSQStagedPartition
    from ._sink import NSQCommitMessage, NSQStreamWriter, NSQWriter
    from ._source import NSQInputPartition, NSQStreamReader
    from ._staging import StagingNotShared

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

#: where each name that needs pyspark (or pyarrow) lives: imported when it is first used, so
#: that the modules without them (``_planning``, the options) import alone
_LAZY = {
    "SCHEMA": "_datasource",
    "BatchReadNotSupported": "_datasource",
    "NSQDataSource": "_datasource",
    "NSQExecutorStreamReader": "_executor_source",
    "NSQStagedPartition": "_executor_source",
    "NSQCommitMessage": "_sink",
    "NSQStreamWriter": "_sink",
    "NSQWriter": "_sink",
    "NSQInputPartition": "_source",
    "NSQStreamReader": "_source",
    "StagingNotShared": "_staging",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


def register(spark: SparkSession) -> None:
    """``spark.dataSource.register(NSQDataSource)``: makes ``format("nsq")`` available."""
    from ._datasource import NSQDataSource

    spark.dataSource.register(NSQDataSource)
