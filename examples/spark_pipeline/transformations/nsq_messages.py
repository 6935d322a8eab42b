"""The streaming table ``nsq_messages``: the messages of an NSQ topic, as ``spark-pipelines
run`` reads them (each run reads what waits on the channel when it starts, then ends).

The source's options are the spec's ``spark.nsq.source.<option>`` settings (``configuration``
in ``spark-pipeline.yml``), each overridden by an environment variable ``NSQ_SOURCE_<OPTION>``
(``NSQ_SOURCE_TOPIC=orders``)."""

import os

from pyspark import pipelines as dp
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from nsq_spark import NSQDataSource

# the session of `spark-pipelines run` (which also passes it to this file as `spark`)
spark = SparkSession.active()

CONF_PREFIX = "spark.nsq.source."
ENV_PREFIX = "NSQ_SOURCE_"

spark.dataSource.register(NSQDataSource)


def source_options() -> dict[str, str]:
    options = {
        name.removeprefix(CONF_PREFIX): value
        for name, value in spark.conf.getAll.items()
        if name.startswith(CONF_PREFIX)
    }
    options.update(
        (name.removeprefix(ENV_PREFIX).lower(), value)
        for name, value in os.environ.items()
        if name.startswith(ENV_PREFIX)
    )
    return options


@dp.table(comment="the messages of an NSQ topic")
def nsq_messages() -> DataFrame:
    return (
        spark.readStream.format("nsq")
        .options(**source_options())
        .load()
        .select(F.col("body").cast("string").alias("body"), "id", "attempts", "timestamp", "nsqd")
    )
