"""``format("nsq")`` from a Spark Connect client (``SparkSession.builder.remote``): a Spark
Connect server on loopback (``spark-submit --class ...SparkConnectServer``, the connect jar that
ships with pyspark), its Python workers this interpreter; the source (``availableNow`` into
parquet) and the sink against the emulator, and an option error as the first line the user
reads.  Needs pyspark's ``connect`` extra (grpcio, grpcio-status, googleapis-common-protos,
zstandard); skipped without it."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from ._connect import client, connect_server, missing
from .helpers import Emulator

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
    with connect_server("local[2]") as (url, _server):
        yield url


def first_line(text: str) -> str:
    """The first line of an error, without Spark's words before ours (``[CLASS] ...: ``)."""
    return re.sub(r"^\[[A-Z_.]+\][^:]*: ", "", text.splitlines()[0])


def test_source_and_sink_from_a_connect_client(
    connect_url: str, emulator: Emulator, tmp_path: Path
) -> None:
    topic = "connect"
    got = client(
        connect_url, "pipeline", emulator.address, emulator.http_address, topic, str(tmp_path)
    )
    rows = got["rows"]
    assert sorted(body for body, _ in rows) == [f"c{i:03d}" for i in range(40)]
    assert len({id_ for _, id_ in rows}) == 40
    stats = emulator.channel_stats(topic, "spark")
    assert (stats.message_count, stats.depth, stats.in_flight_count) == (40, 0, 0)


def test_an_option_error_is_the_first_line_over_connect(connect_url: str) -> None:
    errors = client(connect_url, "errors")
    assert first_line(errors["source"]) == (
        "nsq_spark.OptionError: unknown option(s) of the nsq source: maxinflght"
        " (did you mean max_in_flight?)"
    )
    # a JVM stack trace may follow: below our line
    stack = errors["source"].find("JVM stacktrace")
    assert stack == -1 or stack > errors["source"].find("nsq_spark.OptionError")
    assert first_line(errors["sink"]).startswith(
        "nsq_spark.OptionError: option 'topic': 'a b' is not a topic name"
    )
    assert first_line(errors["batch"]).startswith(
        "nsq_spark.BatchReadNotSupported: the nsq source reads streams only"
    )
