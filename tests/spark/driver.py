"""A Spark driver as a user runs one: ``python -m tests.spark.driver OUT CHECKPOINT k=v...``
streams ``format("nsq")`` (the ``k=v`` options) into parquet files at OUT until it is killed,
or until a line ``stop`` on its standard input stops the query (``query.stop()``) and Spark.
The driver tests run it in a process of its own to kill it.  ``NSQ_SPARK_MASTER`` is the
master (default ``local[2]``); ``NSQ_SPARK_SELECT`` the SQL expressions written, separated by ``;``
(default: every column); ``NSQ_SPARK_PAUSE`` seconds that each task waits once the source
gave it its first rows, before it writes them (the source has staged and FINished them then);
``NSQ_SPARK_SLOW`` seconds that the first attempt of partition 0 of each batch waits there
besides (a task tried again, or a speculative copy, does not); ``NSQ_SPARK_CONF`` more Spark
settings, ``key=value`` separated by ``;``.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from typing import Any


def main(argv: list[str]) -> None:
    out, checkpoint, *pairs = argv
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

    from pyspark.sql import SparkSession

    from nsq_spark import NSQDataSource

    builder = (
        SparkSession.builder.master(os.environ.get("NSQ_SPARK_MASTER", "local[2]"))
        .appName("nsq_spark driver")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.streaming.pollingDelay", "50ms")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
    )
    for setting in filter(None, os.environ.get("NSQ_SPARK_CONF", "").split(";")):
        key, _, value = setting.partition("=")
        builder = builder.config(key.strip(), value.strip())
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(NSQDataSource)
    reader = spark.readStream.format("nsq")
    for pair in pairs:
        name, _, value = pair.partition("=")
        reader = reader.option(name, value)
    df = reader.load()
    select = os.environ.get("NSQ_SPARK_SELECT")
    if select:
        df = df.selectExpr(*select.split(";"))
    pause = float(os.environ.get("NSQ_SPARK_PAUSE") or 0)
    slow = float(os.environ.get("NSQ_SPARK_SLOW") or 0)
    if pause or slow:

        def paused(batches: Iterator[Any]) -> Iterator[Any]:
            import time

            from pyspark import TaskContext

            task = TaskContext.get()
            wait = pause
            if task is not None and task.partitionId() == 0 and task.attemptNumber() == 0:
                wait += slow
            for i, batch in enumerate(batches):
                if i == 0:
                    time.sleep(wait)
                yield batch

        df = df.mapInArrow(paused, df.schema)
    query = (
        df.writeStream.format("parquet")
        .option("path", out)
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="100 milliseconds")
        .start()
    )

    def wait_for_stop() -> None:
        for line in sys.stdin:
            if line.strip() == "stop":
                break
        query.stop()

    threading.Thread(target=wait_for_stop, daemon=True).start()
    query.awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
