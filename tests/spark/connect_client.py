"""A Spark Connect client as a user runs one, in a process of its own (a process holds either
classic sessions or remote ones): ``python -m tests.spark.connect_client URL WHAT ...`` prints
one line of JSON.

``pipeline NSQD HTTP TOPIC TMP``: writes 40 rows with the sink, reads them back with the source
(``availableNow`` into parquet under TMP): ``{"rows": [[body, id], ...]}``.
``read NSQDS HTTPS TOPIC TMP``: reads what waits on the comma-separated nsqd (``availableNow``
into parquet under TMP, tasks of 500): ``{"rows": [[body, id, nsqd], ...]}``.
``errors``: ``{"source": ..., "sink": ..., "batch": ...}``, the text of each error."""

from __future__ import annotations

import json
import sys
from typing import Any


def read_all(
    spark: Any, nsqds: str, https: str, topic: str, tmp: str, columns: list[str], **options: int
) -> list[Any]:
    """What waits on the nsqd, read with ``availableNow`` into parquet under ``tmp``."""
    reader = (
        spark.readStream.format("nsq")
        .option("nsqd_tcp_addresses", nsqds)
        .option("nsqd_http_addresses", https)
        .option("topic", topic)
        .option("channel", "spark")
        .option("staging_location", f"{tmp}/staging")
    )
    for name, value in options.items():
        reader = reader.option(name, value)
    query = (
        reader.load()
        .select(*columns)
        .writeStream.format("parquet")
        .option("path", f"{tmp}/out")
        .option("checkpointLocation", f"{tmp}/cp")
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(240)
    query.stop()
    return list(spark.read.parquet(f"{tmp}/out").collect())


def main(argv: list[str]) -> None:
    from pyspark.sql import SparkSession

    from nsq_spark import NSQDataSource

    url, what, *rest = argv
    spark = SparkSession.builder.remote(url).getOrCreate()
    spark.dataSource.register(NSQDataSource)
    if what == "pipeline":
        nsqd, http, topic, tmp = rest
        (
            spark.range(40)
            .selectExpr("concat('c', lpad(cast(id as string), 3, '0')) as body")
            .write.format("nsq")
            .mode("append")
            .option("nsqd_tcp_addresses", nsqd)
            .option("topic", topic)
            .save()
        )
        rows = read_all(spark, nsqd, http, topic, tmp, ["body", "id"], max_messages_per_trigger=15)
        print(json.dumps({"rows": [[bytes(r.body).decode(), r.id] for r in rows]}))
    elif what == "read":
        nsqds, https, topic, tmp = rest
        columns = ["body", "id", "nsqd"]
        rows = read_all(spark, nsqds, https, topic, tmp, columns, max_messages_per_task=500)
        print(json.dumps({"rows": [[bytes(r.body).decode(), r.id, r.nsqd] for r in rows]}))
    elif what == "errors":
        options = {
            "nsqd_tcp_addresses": "127.0.0.1:4150",
            "nsqd_http_addresses": "127.0.0.1:4151",
            "topic": "t",
            "channel": "c",
        }
        errors = {}
        try:  # Spark Connect analyses the plan when asked for its schema
            spark.readStream.format("nsq").options(**options, maxInFlght="3").load().schema  # noqa: B018
        except Exception as exc:
            errors["source"] = str(exc)
        try:
            (
                spark.range(3)
                .selectExpr("cast(id as string) as body")
                .write.format("nsq")
                .mode("append")
                .option("nsqd_tcp_addresses", "127.0.0.1:4150")
                .option("topic", "a b")
                .save()
            )
        except Exception as exc:
            errors["sink"] = str(exc)
        try:
            spark.read.format("nsq").options(**options).load().collect()
        except Exception as exc:
            errors["batch"] = str(exc)
        print(json.dumps(errors))
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
