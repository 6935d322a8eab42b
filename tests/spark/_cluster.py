"""A standalone Spark cluster on loopback for the tests: one master and two workers of one core
each (``spark-class ...deploy.master.Master`` / ``...deploy.worker.Worker``), their Python
workers this interpreter with this checkout on their path; stopped by PID.  The workers are on
127.0.0.1 unless told otherwise (``worker_hosts``: Spark takes each address for a machine)."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.load import wait_while_moving
from tests.support.net import free_ports

from .helpers import RealNSQD, alive, descendants, wait_for
from .sink_log import SinkLog

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


# -- the application on the cluster ------------------------------------------------------------

CHANNEL = "spark"


#: seconds without any sign of the query moving after which a wait fails
STALL = 180.0


def stats(node: RealNSQD, topic: str) -> dict[str, Any] | None:
    url = f"http://{node.http}/stats?format=json&topic={topic}"
    with urllib.request.urlopen(url, timeout=5) as response:
        data: dict[str, Any] = json.load(response)
    for t in data["topics"]:
        for c in t["channels"]:
            if c["channel_name"] == CHANNEL:
                return dict(c)
    return None


class Driver:
    """The user's application, on the cluster."""

    def __init__(
        self,
        master: str,
        nodes: list[RealNSQD],
        topic: str,
        tmp: Path,
        select: str,
        *,
        env: dict[str, str] | None = None,
        **extra: object,
    ) -> None:
        self.out, self.checkpoint = tmp / "out", tmp / "cp"
        self.sink = SinkLog(self.out)
        options = {
            "nsqd_tcp_addresses": ",".join(n.address for n in nodes),
            "nsqd_http_addresses": ",".join(n.http for n in nodes),
            "topic": topic,
            "channel": CHANNEL,
            "staging_location": str(tmp / "staging"),
            **{k: str(v) for k, v in extra.items()},
        }
        environ = spark_env()
        environ["NSQ_SPARK_MASTER"] = master
        environ["NSQ_SPARK_SELECT"] = select
        environ.update(env or {})
        self.log = (tmp / "driver.log").open("ab")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.spark.driver",
                str(self.out),
                str(self.checkpoint),
                *(f"{k}={v}" for k, v in options.items()),
            ],
            cwd=ROOT,
            env=environ,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=self.log,
            start_new_session=True,
        )

    def stop(self) -> None:
        family = descendants(self.proc.pid)
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.write(b"stop\n")
            self.proc.stdin.flush()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        for pid in alive(family):
            os.kill(pid, signal.SIGKILL)
        self.log.close()

    def kill(self) -> None:
        """``kill -9`` the driver; returns once it and every process it started are gone."""
        family = descendants(self.proc.pid)
        self.proc.kill()
        self.proc.wait(timeout=60)
        try:
            wait_for(lambda: not alive(family), timeout=60, interval=0.1)
        finally:
            for pid in alive(family):
                os.kill(pid, signal.SIGKILL)
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.log.close()

    def batches(self) -> list[list[dict[str, Any]]]:
        """The rows of each committed batch of the file sink's log."""
        return self.sink.batches()

    def rows(self) -> list[dict[str, Any]]:
        return self.sink.rows()

    def committed(self) -> int:
        """How many batches the sink's log holds (cheap: a directory listing)."""
        return len(self.sink.entries())

    def log_tail(self, lines: int = 20) -> str:
        """The last lines that the driver logged (its progress bars left out)."""
        path = self.out.parent / "driver.log"
        try:
            with path.open("rb") as f:
                f.seek(max(0, path.stat().st_size - 64_000))
                text = f.read().decode(errors="replace")
        except OSError as exc:
            return f"(no driver log: {exc})"
        kept = [
            line.rstrip()
            for line in text.replace("\r", "\n").splitlines()
            if line.strip() and not line.lstrip().startswith("[Stage ")
        ]
        return "\n".join(kept[-lines:]) or "(nothing)"

    def activity(self, nodes: list[RealNSQD], topic: str, cluster: Cluster) -> tuple[Any, ...]:
        """What changes while the query works: the sink's log, the checkpoint's files, the
        driver's log, nsqd's counters of the channel (its backlog drains as the consumers take
        it; a publisher that waits for the backlog to drain publishes no more), and the
        cluster's applications."""
        files = sum(1 for _ in self.checkpoint.rglob("*")) if self.checkpoint.exists() else 0
        log = (self.out.parent / "driver.log").stat().st_size
        channels = []
        for node in nodes:
            try:
                c = stats(node, topic)
            except OSError:
                c = None
            keys = ("depth", "in_flight_count", "requeue_count", "timeout_count")
            channels.append(
                None if c is None else (*[c.get(k) for k in keys], len(c.get("clients") or []))
            )
        try:
            apps = [
                (a.get("id"), a.get("state"), a.get("cores"))
                for a in cluster.state().get("activeapps", [])
            ]
        except (OSError, ValueError):
            apps = []
        return (self.committed(), files, log, tuple(channels), tuple(apps))

    def wait_rows(
        self,
        nodes: list[RealNSQD],
        topic: str,
        cluster: Cluster,
        done: Callable[[list[dict[str, Any]]], bool],
        what: str,
        *,
        expected: Collection[Any] | None = None,
        column: str = "body",
    ) -> list[dict[str, Any]]:
        """The rows committed, once ``done(rows)``; fails when the query did not move (see
        :meth:`activity`) for ``STALL`` seconds, or the driver ended, saying what the sink
        holds then (of the ``expected`` values of ``column``: how many are there, which are
        missing or written twice) and the last lines the driver logged."""
        rows: list[dict[str, Any]] = []
        seen: tuple[str, ...] | None = None

        def ready() -> bool:
            nonlocal rows, seen
            if self.proc.poll() is not None:
                raise AssertionError(f"the driver ended with status {self.proc.returncode}")
            entries = self.sink.entries()
            if entries != seen:  # the rows again only when a batch was committed
                seen, rows = entries, self.rows()
            return done(rows)

        try:
            wait_while_moving(
                ready,
                lambda: self.activity(nodes, topic, cluster),
                stall=STALL,
                interval=0.5,
                what=what,
            )
        except AssertionError as exc:
            raise AssertionError(
                f"{exc}\n{self.describe_rows(done, expected, column)}\n"
                f"the driver's last lines:\n{self.log_tail()}"
            ) from exc
        return rows

    def describe_rows(
        self,
        done: Callable[[list[dict[str, Any]]], bool],
        expected: Collection[Any] | None = None,
        column: str = "body",
    ) -> str:
        """What the sink holds now, read afresh: its batches and rows; of the ``expected``
        values of ``column``, how many are there, and a few missing, written twice or never
        sent."""
        try:
            entries, batches = self.sink.entries(), self.batches()
        except (OSError, ValueError) as exc:
            return f"the sink's log could not be read: {exc!r}"
        rows = [row for batch in batches for row in batch]
        said = [
            f"the sink's log: {len(entries)} batches ({', '.join(entries[-5:]) or 'none'}), "
            f"{len(rows)} rows ({[len(b) for b in batches[-10:]]} in the last batches)"
        ]
        if done(rows):
            said.append("read again now, the rows are what was awaited")
        if expected is not None:
            want = set(expected)
            written = collections.Counter(row.get(column) for row in rows)
            missing = sorted(want - set(written), key=repr)
            twice = sorted((v for v, n in written.items() if n > 1), key=repr)
            stray = sorted(set(written) - want, key=repr)

            def some(values: list[Any]) -> str:
                return f"{len(values)}" + (f" (e.g. {values[:5]})" if values else "")

            said.append(
                f"of {len(want)} expected values of {column!r}: {len(want) - len(missing)} "
                f"written, missing {some(missing)}, written more than once {some(twice)}, "
                f"never sent {some(stray)}"
            )
        return "; ".join(said)
