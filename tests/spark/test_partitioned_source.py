"""The source on the partitioned server (youzan/nsq), read on the executors: each NSQ partition
is planned and consumed on its own, found through lookupd or in nsqd's stats."""

from __future__ import annotations

import collections
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.net import http
from tests.support.partitioned import NEEDS_CLUSTER, PartitionedCluster, partitioned_cluster

from .helpers import write_available_now

pytestmark = [pytest.mark.spark, pytest.mark.real_nsqd, NEEDS_CLUSTER]

PER_PARTITION = 150


@pytest.fixture(scope="module")
def cluster() -> Iterator[PartitionedCluster]:
    with partitioned_cluster() as c:
        yield c


def publish(cluster: PartitionedCluster, topic: str) -> set[bytes]:
    sent = set()
    for p in (0, 1):
        bodies = [f"p{p}-{i:04d}".encode() for i in range(PER_PARTITION)]
        url = f"http://{cluster.nsqd_http}/mpub?topic={topic}&partition={p}"
        status, body = http("POST", url, b"\n".join(bodies))
        assert status == 200, body
        sent.update(bodies)
    return sent


def channel_depths(cluster: PartitionedCluster, topic: str) -> dict[int, int]:
    """Each partition's unconfirmed messages on channel ``c`` (the partitioned server's depth
    counts those in flight too)."""
    status, body = http("GET", f"http://{cluster.nsqd_http}/stats?format=json&topic={topic}")
    assert status == 200, body
    stats = json.loads(body)
    stats = stats.get("data", stats)
    return {
        int(t["topic_partition"]): c["depth"]
        for t in stats["topics"]
        if t["topic_name"] == topic
        for c in t["channels"]
        if c["channel_name"] == "c"
    }


def read(spark: Any, tmp_path: Path, topic: str, **options: str) -> list[Any]:
    reader = spark.readStream.format("nsq").option("topic", topic).option("channel", "c")
    for name, value in options.items():
        reader = reader.option(name, value)
    df = (
        reader.option("staging_location", str(tmp_path / "staging"))
        .option("max_messages_per_trigger", "100")
        .load()
        .select("body", "partition")
    )
    return write_available_now(df, tmp_path / "out", tmp_path / "checkpoint")


@pytest.mark.parametrize("found_by", ["lookupd", "nsqd"])
def test_every_partition_is_read_once_on_the_executors(
    spark: Any, cluster: PartitionedCluster, tmp_path: Path, found_by: str
) -> None:
    topic = f"spark-parts-{found_by}-{time.monotonic_ns()}"
    cluster.create_topic(topic, partitions=2)
    sent = publish(cluster, topic)
    if found_by == "lookupd":
        where = {"lookupd_http_addresses": cluster.lookupd_http}
    else:
        where = {"nsqd_tcp_addresses": cluster.nsqd_tcp, "nsqd_http_addresses": cluster.nsqd_http}
    rows = read(spark, tmp_path, topic, **where)
    copies = collections.Counter(bytes(r.body) for r in rows)
    assert sorted(copies) == sorted(sent) and set(copies.values()) == {1}
    # each row says the partition it came from
    assert all(r.partition == int(bytes(r.body)[1:2]) for r in rows)
    assert channel_depths(cluster, topic) == {0: 0, 1: 0}


def test_the_partitions_option_reads_those_partitions_only(
    spark: Any, cluster: PartitionedCluster, tmp_path: Path
) -> None:
    topic = f"spark-parts-one-{time.monotonic_ns()}"
    cluster.create_topic(topic, partitions=2)
    sent = publish(cluster, topic)
    rows = read(spark, tmp_path, topic, lookupd_http_addresses=cluster.lookupd_http, partitions="1")
    assert sorted(bytes(r.body) for r in rows) == sorted(b for b in sent if b.startswith(b"p1"))
    assert channel_depths(cluster, topic) == {0: PER_PARTITION, 1: 0}
