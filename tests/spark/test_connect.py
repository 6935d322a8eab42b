"""``format("nsq")`` from a Spark Connect client (``SparkSession.builder.remote``): a Spark
Connect server on loopback (``spark-submit --class ...SparkConnectServer``, the connect jar that
ships with pyspark), its Python workers this interpreter; the source (``availableNow`` into
parquet) and the sink against the emulator, and an option error as the first line the user
reads.  Needs pyspark's ``connect`` extra (grpcio, grpcio-status, googleapis-common-protos,
zstandard); skipped without it."""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.faults._servers import free_port

from ._cluster import spark_env
from .helpers import Emulator


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its parent package is missing
        return False


CONNECT_DEPS = ("grpc", "grpc_status", "google.rpc", "zstandard")
missing = [m for m in CONNECT_DEPS if not _importable(m)]

pytestmark = [
    pytest.mark.spark,
    pytest.mark.skipif(
        bool(missing),
        reason="Spark Connect needs pyspark's connect extra (grpcio, grpcio-status, "
        f"googleapis-common-protos, zstandard): missing {', '.join(missing)}",
    ),
]


@pytest.fixture(scope="module")
def connect_url() -> Iterator[str]:
    """A Spark Connect server (master ``local[2]``) on loopback; its URL."""
    env = spark_env()
    port = free_port()
    log_dir = tempfile.mkdtemp(prefix="spark-connect-")
    log = open(os.path.join(log_dir, "server.log"), "wb")  # noqa: SIM115 (closed below)
    server = subprocess.Popen(
        [
            os.path.join(env["SPARK_HOME"], "bin", "spark-submit"),
            "--class",
            "org.apache.spark.sql.connect.service.SparkConnectServer",
            "--master",
            "local[2]",
            "--conf",
            "spark.connect.grpc.binding.address=127.0.0.1",
            "--conf",
            f"spark.connect.grpc.binding.port={port}",
            "--conf",
            "spark.ui.enabled=false",
            "--conf",
            "spark.sql.shuffle.partitions=2",
            "--conf",
            "spark.sql.streaming.pollingDelay=50ms",
            "--conf",
            "spark.driver.bindAddress=127.0.0.1",
            "--conf",
            "spark.driver.host=127.0.0.1",
        ],
        env=env,
        cwd=log_dir,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the Spark Connect server did not start: see {log.name}")
            time.sleep(0.5)
        yield f"sc://127.0.0.1:{port}"
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=10)
        log.close()


@pytest.fixture(scope="module")
def remote(connect_url: str) -> Iterator[Any]:
    from pyspark.sql import SparkSession

    from nsq_spark import NSQDataSource

    session = SparkSession.builder.remote(connect_url).create()
    session.dataSource.register(NSQDataSource)
    try:
        yield session
    finally:
        session.stop()


def first_line(error: BaseException) -> str:
    """The first line of the error, without Spark's words before ours (``[CLASS] ...: ``)."""
    return re.sub(r"^\[[A-Z_.]+\][^:]*: ", "", str(error).splitlines()[0])


def test_source_and_sink_from_a_connect_client(
    remote: Any, emulator: Emulator, tmp_path: Path
) -> None:
    topic = "connect"
    (
        remote.range(40)
        .selectExpr("concat('c', lpad(cast(id as string), 3, '0')) as body")
        .write.format("nsq")
        .mode("append")
        .option("nsqd_tcp_addresses", emulator.address)
        .option("topic", topic)
        .save()
    )
    assert emulator.topic_stats(topic).message_count == 40
    out = tmp_path / "out"
    query = (
        remote.readStream.format("nsq")
        .option("nsqd_tcp_addresses", emulator.address)
        .option("nsqd_http_addresses", emulator.http_address)
        .option("topic", topic)
        .option("channel", "spark")
        .option("staging_location", str(tmp_path / "staging"))
        .option("max_messages_per_trigger", 15)
        .load()
        .select("body", "id")
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(180), "availableNow did not end"
    finally:
        query.stop()
    rows = remote.read.parquet(str(out)).collect()
    assert sorted(bytes(r.body) for r in rows) == [f"c{i:03d}".encode() for i in range(40)]
    assert len({r.id for r in rows}) == 40
    stats = emulator.channel_stats(topic, "spark")
    assert (stats.depth, stats.in_flight_count) == (0, 0)


def test_an_option_error_is_the_first_line_over_connect(remote: Any) -> None:
    options = {
        "nsqd_tcp_addresses": "127.0.0.1:4150",
        "nsqd_http_addresses": "127.0.0.1:4151",
        "topic": "t",
        "channel": "c",
    }
    with pytest.raises(Exception) as info:
        # (Spark Connect analyses the plan when asked for its schema)
        remote.readStream.format("nsq").options(**options, maxInFlght="3").load().schema  # noqa: B018
    assert first_line(info.value) == (
        "nsq_spark.OptionError: unknown option(s) of the nsq source: maxinflght"
        " (did you mean max_in_flight?)"
    )
    # a JVM stack trace may follow: below our line
    text = str(info.value)
    stack = text.find("JVM stacktrace")
    assert stack == -1 or stack > text.find("nsq_spark.OptionError")
    writer = remote.range(3).selectExpr("cast(id as string) as body").write.format("nsq")
    with pytest.raises(Exception) as info:
        writer.mode("append").option("nsqd_tcp_addresses", "127.0.0.1:4150").option(
            "topic", "a b"
        ).save()
    assert first_line(info.value).startswith(
        "nsq_spark.OptionError: option 'topic': 'a b' is not a topic name"
    )
    with pytest.raises(Exception) as info:
        remote.read.format("nsq").options(**options).load().collect()
    assert first_line(info.value).startswith(
        "NotImplementedError: the nsq source reads streams only"
    )
