"""A standalone Spark cluster on loopback for the tests: one master and two workers of one core
each (``spark-class ...deploy.master.Master`` / ``...deploy.worker.Worker``), their Python
workers this interpreter with this checkout on their path; stopped by PID.  The workers are on
127.0.0.1 unless told otherwise (``worker_hosts``: Spark takes each address for a machine)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.net import free_ports

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Cluster:
    master: str
    web_ui: str
    #: the master's and each worker's process
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def worker_pids(self) -> list[int]:
        return [p.pid for p in self.processes[1:]]

    def state(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.web_ui}/json/", timeout=5) as response:
            state: dict[str, Any] = json.load(response)
        return state


def spark_env() -> dict[str, str]:
    import pyspark

    env = dict(os.environ)
    env["SPARK_HOME"] = os.path.dirname(pyspark.__file__)
    env["PYSPARK_PYTHON"] = sys.executable
    env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    return env


@contextmanager
def standalone_cluster(
    workers: int = 2, timeout: float = 90.0, worker_hosts: Sequence[str] = ()
) -> Iterator[Cluster]:
    hosts = list(worker_hosts) or ["127.0.0.1"] * workers
    assert len(hosts) == workers
    env = spark_env()
    spark_class = os.path.join(env["SPARK_HOME"], "bin", "spark-class")
    # the master's port, its web UI's and each worker's web UI's, all distinct: a worker that
    # took the master's UI port moved the master's UI elsewhere (Spark tries the next port)
    port, ui, *worker_uis = free_ports(2 + workers)
    work = tempfile.mkdtemp(prefix="spark-cluster-")
    env["SPARK_LOG_DIR"] = work
    cluster = Cluster(f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{ui}")
    deploy = "org.apache.spark.deploy"

    def start(*argv: str) -> None:
        cluster.processes.append(
            subprocess.Popen(
                [spark_class, *argv],
                env=env,
                cwd=work,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        )

    try:
        start(
            f"{deploy}.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--webui-port",
            str(ui),
        )
        for i in range(workers):
            start(
                f"{deploy}.worker.Worker",
                cluster.master,
                "--host",
                hosts[i],
                "--cores",
                "1",
                "--memory",
                "1g",
                "--webui-port",
                str(worker_uis[i]),
                "--work-dir",
                os.path.join(work, f"worker{i}"),
            )
        deadline = time.monotonic() + timeout
        while True:
            try:
                alive = [w for w in cluster.state()["workers"] if w["state"] == "ALIVE"]
                if len(alive) >= workers:
                    break
            except (OSError, ValueError, KeyError):  # not up yet, or another UI there
                pass
            for p in cluster.processes:
                if p.poll() is not None:
                    raise RuntimeError(f"a Spark process ended: {p.args!r}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the standalone cluster was not ready in {timeout} s")
            time.sleep(0.5)
        yield cluster
    finally:
        for p in reversed(cluster.processes):
            if p.poll() is None:
                # the whole session of each: the worker's executors and their Python workers
                os.killpg(p.pid, signal.SIGTERM)
        for p in cluster.processes:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=10)
