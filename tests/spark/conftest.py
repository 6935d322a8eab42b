"""Fixtures of the Spark tests: the emulator on loopback (its loop in a background thread) and
one local Spark session shared by the whole run."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from anyio.from_thread import start_blocking_portal

from nsq_emulator.loopback import serve_emulator

from .helpers import Emulator

try:  # without the spark extra there is nothing to test here
    import pyarrow  # type: ignore[import-untyped]  # noqa: F401 (no type information, as in nsq_spark)
    import pyspark  # noqa: F401
except ImportError:
    collect_ignore_glob = ["test_*.py"]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def emulator() -> Iterator[Emulator]:
    with start_blocking_portal() as portal:
        with portal.wrap_async_context_manager(serve_emulator(lookupd=False)) as cluster:
            yield Emulator(portal, cluster)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    # the Python workers must be this interpreter, and must find this checkout
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    path = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), path) if p)

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

    from pyspark.sql import SparkSession

    from nsq_spark import NSQDataSource

    session = (
        SparkSession.builder.master("local[2]")
        .appName("nsq_spark tests")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.streaming.pollingDelay", "50ms")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(NSQDataSource)
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="session")
def spark_cluster() -> Iterator[Any]:
    """A standalone cluster (a master, two workers of one core and 1 GB) on loopback."""
    from ._cluster import standalone_cluster

    with standalone_cluster() as cluster:
        yield cluster
