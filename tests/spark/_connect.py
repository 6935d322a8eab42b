"""A Spark Connect server on loopback for the tests (``spark-submit --class
...SparkConnectServer``, the connect jar that ships with pyspark) and a client of it; what of
pyspark's ``connect`` extra is missing (its tests skip then)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from ._cluster import ROOT, spark_env


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its parent package is missing
        return False


CONNECT_DEPS = ("grpc", "grpc_status", "google.rpc", "zstandard")


missing = [m for m in CONNECT_DEPS if not _importable(m)]


@contextlib.contextmanager
def connect_server(master: str) -> Iterator[Any]:
    """A Spark Connect server on loopback whose master is ``master``; (its URL, its process)."""
    env = spark_env()
    log_dir = tempfile.mkdtemp(prefix="spark-connect-")
    log_path = os.path.join(log_dir, "server.log")
    log = open(log_path, "wb")  # noqa: SIM115 (closed below)
    server = subprocess.Popen(
        [
            os.path.join(env["SPARK_HOME"], "bin", "spark-submit"),
            "--class",
            "org.apache.spark.sql.connect.service.SparkConnectServer",
            "--master",
            master,
            "--conf",
            "spark.connect.grpc.binding.address=127.0.0.1",
            # a port of the server's own choosing, read from its log: a port picked free here
            # could be taken meanwhile (an executor's block manager took one), and a client
            # would then talk to whatever listens there
            "--conf",
            "spark.connect.grpc.binding.port=0",
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
        started = re.compile(rb"Spark Connect server started at: ([0-9.]+):(\d+)")
        while True:
            with open(log_path, "rb") as text:
                found = started.search(text.read())
            if found is not None:
                port = int(found.group(2))
                break
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the Spark Connect server did not start: see {log_path}")
            time.sleep(0.5)
        # it listens once it says so
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
        yield f"sc://127.0.0.1:{port}", server
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=10)
        log.close()


def client(url: str, *argv: str) -> Any:
    """Run ``tests/spark/connect_client.py`` (a process holds either classic sessions or remote
    ones, and this one has a classic one); what it printed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARK_CONNECT")}
    env.pop("SPARK_REMOTE", None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, "-m", "tests.spark.connect_client", url, *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    return json.loads(done.stdout.decode().strip().splitlines()[-1])
