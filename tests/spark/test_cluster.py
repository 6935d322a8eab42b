"""``format("nsq")`` on a standalone Spark cluster (a master and two workers on loopback)
against two real nsqd: the executors consume, the driver connects to no nsqd, each message is
written exactly once (an executor killed mid-stream included, and a slow task that speculation
copies), and large bodies are bounded by bytes with the default options.  Run when ``NSQD``
points at nsqd (or it is on PATH).

The driver is ``tests/spark/driver.py`` in a process of its own (the test process has its own
local Spark); the tests read what it wrote through Spark's file-sink log.

A cluster of seven JVMs and their Python workers starves a 2-core machine on its own: these
tests run alone (``alone``: no other test of the run at the same time, see tests/conftest.py),
and they wait for rows as long as the query moves (its sink's log, its checkpoint, nsqd's
counters, the cluster's applications), failing only when nothing moved for ``STALL`` seconds.
The figures (seconds to the rows) are printed at the end of the run, with how starved the
machine was when they are above their goals."""

from __future__ import annotations

import collections
import json
import os
import signal
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.gate import ConnectionGate, below, process_tree
from tests.support.load import CpuPressure, wait_while_moving

from ._cluster import CHANNEL, STALL, Cluster, Driver, stats
from .helpers import NSQD, RealNSQD, alive, descendants

pytestmark = [
    pytest.mark.spark,
    pytest.mark.real_nsqd,
    pytest.mark.alone,
    pytest.mark.skipif(not NSQD, reason="no real nsqd: set NSQD to the binary to run these"),
]


@pytest.fixture(scope="module")
def two_nsqd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[RealNSQD]]:
    assert NSQD
    nodes = []
    try:
        for i in range(2):
            node = RealNSQD(tmp_path_factory.mktemp(f"nsqd{i}"))
            node.start()
            nodes.append(node)
        yield nodes
    finally:
        for node in nodes:
            node.stop()


def publish(node: RealNSQD, topic: str, bodies: list[bytes], max_bytes: int = 4 << 20) -> None:
    """MPUB over HTTP in requests of at most ``max_bytes``."""
    at = 0
    while at < len(bodies):
        chunk: list[bytes] = []
        size = 0
        while at < len(bodies) and (not chunk or size + len(bodies[at]) < max_bytes):
            chunk.append(bodies[at])
            size += len(bodies[at]) + 1
            at += 1
        request = urllib.request.Request(
            f"http://{node.http}/mpub?topic={topic}", data=b"\n".join(chunk), method="POST"
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status == 200


def _waiting(node: RealNSQD, topic: str) -> int:
    """Messages on the channel (ready or in flight), or on the topic if it has no channel."""
    url = f"http://{node.http}/stats?format=json&topic={topic}"
    with urllib.request.urlopen(url, timeout=5) as response:
        data = json.load(response)
    for t in data["topics"]:
        for c in t["channels"]:
            if c["channel_name"] == CHANNEL:
                return int(c["depth"]) + int(c["in_flight_count"])
        return int(t["depth"])
    return 0


class ConnectionOwners:
    """Who opens the TCP connections to ``nodes``: a :class:`ConnectionGate` in front of each
    (the query is given ``addresses``, the gates' own) finds the process holding each
    connection before it relays one byte.  ``seen`` counts them: ``executor`` (a process
    below an executor JVM of a worker: ``executors`` lists those JVMs, last one last),
    ``other`` (any other process, the driver's included: ``others`` names them) and
    ``unknown`` (closed before it was looked up)."""

    def __init__(self, nodes: list[RealNSQD], cluster: Cluster) -> None:
        self.seen: collections.Counter[str] = collections.Counter()
        self.executors: list[int] = []
        self.others: list[str] = []
        self._cluster = cluster
        self._gates = [ConnectionGate(n.address, self._candidates, self._owner) for n in nodes]
        self.addresses = [gate.address for gate in self._gates]

    def _candidates(self) -> Iterator[int]:
        """The processes below the workers first (the executors, their Python workers),
        then every other one."""
        children = process_tree()
        workers: set[int] = set()
        for worker in self._cluster.worker_pids:
            workers |= below(children, worker)
        yield from workers
        yield from (pid for kids in children.values() for pid in kids if pid not in workers)

    def _owner(self, pid: int | None) -> None:
        if pid is None:
            self.seen["unknown"] += 1
            return
        jvm = _executor_jvm_of(pid, self._cluster)
        if jvm is not None:
            self.seen["executor"] += 1
            self.executors.append(jvm)
            return
        self.seen["other"] += 1
        try:
            self.others.append(Path(f"/proc/{pid}/cmdline").read_bytes()[:200].decode())
        except OSError:
            self.others.append(f"pid {pid}")

    def stop(self) -> None:
        for gate in self._gates:
            gate.close()


def _executor_jvm_of(pid: int, cluster: Cluster) -> int | None:
    """The executor JVM above ``pid`` (a Python worker), or ``pid`` itself."""
    while pid > 1:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except OSError:
            return None
        if b"CoarseGrainedExecutorBackend" in cmdline:
            return pid
        if parent in cluster.worker_pids:
            return None
        pid = parent
    return None


def test_executors_consume_and_a_killed_executor_loses_and_duplicates_nothing(
    spark_cluster: Cluster,
    two_nsqd: list[RealNSQD],
    tmp_path: Path,
    record_property: Callable[[str, object], None],
) -> None:
    topic = f"cluster-{time.monotonic_ns()}"
    sent: list[bytes] = []
    counts = [0, 0]

    def publish_chunk(size: int) -> None:
        for i, node in enumerate(two_nsqd):
            bodies = [f"n{i}-{j:06d}".encode() for j in range(counts[i], counts[i] + size)]
            publish(node, topic, bodies)
            counts[i] += size
            sent.extend(bodies)

    def backlog() -> int:
        """The most messages waiting on one nsqd: on the channel, or on the topic while the
        channel does not exist yet (the source creates it when it first plans)."""
        return max(_waiting(node, topic) for node in two_nsqd)

    publish_chunk(200)
    # the sender publishes slowly until a second after the kill: batches (and tasks holding
    # messages) follow one another whenever the test looks for an executor to kill, however
    # long Spark took to start; while the query is slower than the sender (starting, or on a
    # starved machine) it waits for the backlog to drain, so that what the drill must read
    # in the end does not grow with the time Spark took
    killed_at = threading.Event()

    def publish_until_after_the_kill() -> None:
        while not killed_at.is_set():
            if backlog() < 500:
                publish_chunk(50)
            time.sleep(0.1)
        for _ in range(10):
            publish_chunk(10)
            time.sleep(0.1)

    sender = threading.Thread(target=publish_until_after_the_kill, daemon=True)
    # what a killed task held comes back after msg_timeout
    watch = ConnectionOwners(two_nsqd, spark_cluster)
    driver = Driver(
        spark_cluster.master,
        two_nsqd,
        topic,
        tmp_path,
        "body;id;attempts;nsqd",
        nsqd_tcp_addresses=",".join(watch.addresses),
        msg_timeout=5,
        max_messages_per_trigger=1000,
    )
    pressure = CpuPressure()
    started = time.monotonic()
    sender.start()
    try:
        # a few batches in, while a task holds messages: kill -9 the executor holding them
        driver.wait_rows(
            two_nsqd, topic, spark_cluster, lambda r: len(r) >= 200, "the first 200 rows"
        )
        first_rows_s = time.monotonic() - started
        try:
            # the executor of the task that connected next: killed a few milliseconds
            # after its connection was accepted, while the task reads its messages
            connected = len(watch.executors)
            wait_while_moving(
                lambda: len(watch.executors) > connected,
                driver.committed,
                stall=STALL,
                interval=0.01,
                what="a task connecting",
            )
            victims = descendants(watch.executors[-1])
            for pid in alive(victims):
                os.kill(pid, signal.SIGKILL)
        finally:
            killed_at.set()
        killed_s = time.monotonic()
        sender.join(60)
        assert not sender.is_alive()
        assert len(driver.rows()) < len(sent), "the executor should die mid-stream"
        # what the dead task held comes back after msg_timeout
        expected = set(sent)
        try:
            rows = driver.wait_rows(
                two_nsqd,
                topic,
                spark_cluster,
                lambda r: {x["body"] for x in r} == expected,
                f"every one of {len(expected)} messages written",
                expected=expected,
            )
        except AssertionError as exc:
            missing = expected - {x["body"] for x in driver.rows()}
            raise AssertionError(
                f"{len(missing)} of {len(expected)} messages never written "
                f"(e.g. {sorted(missing)[:5]}): {exc}; nsqd: "
                f"{[stats(n, topic) for n in two_nsqd]}; driver exit status: "
                f"{driver.proc.poll()}; {pressure.describe()}"
            ) from exc
        after_kill_s = time.monotonic() - killed_s
    finally:
        killed_at.set()
        sender.join(60)
        watch.stop()
        driver.stop()
    _figure(
        record_property,
        pressure,
        f"cluster: executor killed, {len(sent)} messages",
        first_200_rows_s=(first_rows_s, 120.0),
        all_rows_after_the_kill_s=(after_kill_s, 60.0),
    )
    copies = collections.Counter(r["body"] for r in rows)
    assert [b for b, c in copies.items() if c > 1] == []  # not one duplicate
    assert sorted(copies) == sorted(sent)
    assert {r["nsqd"] for r in rows} == set(watch.addresses)
    # the connections to nsqd were the executors' (their Python workers), never the driver's
    # nor another process's
    assert watch.seen["executor"] > 0 and watch.others == [], (watch.seen, watch.others)
    for node in two_nsqd:
        final = stats(node, topic)
        assert final is not None and (final["depth"], final["in_flight_count"]) == (0, 0)


def _figure(
    record_property: Callable[[str, object], None],
    pressure: CpuPressure,
    what: str,
    **figures: tuple[float, float],
) -> None:
    """Report each figure (seconds) with its goal, printed at the end of the run; one above
    its goal says whether the machine was starved meanwhile."""
    shown = " ".join(f"{k}={v:.1f}" for k, (v, _) in figures.items())
    late = [pressure.against_goal(k, v, goal) for k, (v, goal) in figures.items()]
    note = "; ".join(line for line in late if line)
    record_property("figure", f"{what}: {shown}" + (f" note={note}" if note else ""))


def test_large_bodies_are_bounded_by_bytes_with_the_default_options(
    spark_cluster: Cluster,
    two_nsqd: list[RealNSQD],
    tmp_path: Path,
    record_property: Callable[[str, object], None],
) -> None:
    topic, per_node, size = f"cluster-large-{time.monotonic_ns()}", 700, 200_000
    sent: list[bytes] = []
    for i, node in enumerate(two_nsqd):
        bodies = [f"n{i}-{j:05d}-".encode().ljust(size, b"x") for j in range(per_node)]
        publish(node, topic, bodies)
        sent.extend(b[:12] for b in bodies)
    pressure = CpuPressure()
    started = time.monotonic()
    driver = Driver(
        spark_cluster.master,
        two_nsqd,
        topic,
        tmp_path,
        "substr(body, 1, 12) as head;id;spark_partition_id() as task",
    )
    try:
        driver.wait_rows(
            two_nsqd,
            topic,
            spark_cluster,
            lambda r: {x["head"] for x in r} == set(sent),
            f"every one of {len(sent)} large messages written",
        )
        batches = [b for b in driver.batches() if b]
    finally:
        driver.stop()
    _figure(
        record_property,
        pressure,
        f"cluster: {len(sent)} bodies of {size} bytes",
        all_rows_s=(time.monotonic() - started, 90.0),
    )
    heads = collections.Counter(r["head"] for b in batches for r in b)
    assert sorted(heads) == sorted(sent) and set(heads.values()) == {1}
    # 280 MB of bodies: batches of at most max_bytes_per_trigger (256 MiB) each, in tasks of
    # at most max_bytes_per_task (32 MiB)
    assert len(batches) >= 2 and max(len(b) for b in batches) <= (256 << 20) // size
    tasks = collections.Counter((i, r["task"]) for i, b in enumerate(batches) for r in b)
    assert max(tasks.values()) <= (32 << 20) // size, tasks


@pytest.fixture
def two_host_cluster() -> Iterator[Cluster]:
    """A standalone cluster whose two workers are on two loopback addresses: Spark launches a
    speculative copy of a task only on another host than the one the task runs on."""
    from ._cluster import standalone_cluster

    with standalone_cluster(worker_hosts=["127.0.0.1", "127.0.0.2"]) as cluster:
        yield cluster


def _task_events(events: Path) -> list[dict[str, Any]]:
    """The task start and end events of the event logs in ``events``."""
    found = []
    for log in events.rglob("*"):
        if not log.is_file() or log.name.startswith((".", "appstatus")):
            continue
        for line in log.read_text().splitlines():
            event = json.loads(line)
            if event["Event"] in ("SparkListenerTaskStart", "SparkListenerTaskEnd"):
                found.append(event)
    return found


def test_speculative_copies_of_a_slow_task_lose_and_duplicate_nothing(
    two_host_cluster: Cluster, two_nsqd: list[RealNSQD], tmp_path: Path
) -> None:
    topic, per_node = f"cluster-speculation-{time.monotonic_ns()}", 300
    sent: list[bytes] = []
    for i, node in enumerate(two_nsqd):
        bodies = [f"n{i}-{j:05d}".encode() for j in range(per_node)]
        publish(node, topic, bodies)
        sent.extend(bodies)
    events = tmp_path / "events"
    events.mkdir()
    conf = {
        "spark.speculation": "true",
        "spark.speculation.interval": "100ms",
        "spark.speculation.multiplier": "1.2",
        "spark.speculation.quantile": "0.5",
        "spark.speculation.minTaskRuntime": "500ms",
        # what the test reads back: which attempts ran, and how each ended
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": events.as_uri(),
        "spark.eventLog.compress": "false",
    }
    # one batch of two tasks (one per nsqd); the first attempt of partition 0 writes its rows
    # only after a minute, long after the other task ended: Spark copies it to the other
    # worker, whose copy finds the rows staged
    driver = Driver(
        two_host_cluster.master,
        two_nsqd,
        topic,
        tmp_path,
        "body;id;attempts;nsqd",
        env={
            "NSQ_SPARK_CONF": ";".join(f"{k}={v}" for k, v in conf.items()),
            "NSQ_SPARK_SLOW": "60",
        },
    )
    expected = set(sent)

    def attempts() -> list[tuple[Any, ...]]:
        """(Start or End, stage, task, attempt, host, speculative, how it ended)."""
        try:
            events_seen = _task_events(events)
        except (OSError, ValueError):  # a log being written: what can be read of it
            return []
        return [
            (
                e["Event"].removeprefix("SparkListenerTask"),
                e.get("Stage ID"),
                e["Task Info"]["Index"],
                e["Task Info"]["Attempt"],
                e["Task Info"]["Host"],
                e["Task Info"]["Speculative"],
                e.get("Task End Reason", {}).get("Reason"),
            )
            for e in events_seen
        ]

    def story() -> str:
        """What nsqd, Spark's tasks and the driver tell, for a failure's message."""
        return (
            f"nsqd: {[stats(n, topic) for n in two_nsqd]}\ntask attempts: {attempts()}\n"
            f"the driver's last lines:\n{driver.log_tail()}"
        )

    try:
        try:
            driver.wait_rows(
                two_nsqd,
                topic,
                two_host_cluster,
                lambda r: {x["body"] for x in r} == expected,
                f"every one of {len(expected)} messages written",
                expected=expected,
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}\ntask attempts: {attempts()}") from exc
    finally:
        driver.stop()
    # all it wrote, once stopped: each message once
    done = collections.Counter(r["body"] for r in driver.rows())
    assert set(done.values()) == {1} and sorted(done) == sorted(sent), (
        f"{driver.describe_rows(lambda r: False, expected)}\n{story()}"
    )
    for node in two_nsqd:
        final = stats(node, topic)
        assert final is not None and (final["depth"], final["in_flight_count"]) == (0, 0)
    # Spark did copy the slow task, and took the copy's rows
    seen = attempts()
    assert [a for a in seen if a[0] == "End" and a[5] and a[6] == "Success"], seen


def test_a_spark_connect_client_reads_on_the_cluster(
    spark_cluster: Cluster, two_nsqd: list[RealNSQD], tmp_path: Path
) -> None:
    from ._connect import CONNECT_DEPS, _importable, client, connect_server

    missing = [m for m in CONNECT_DEPS if not _importable(m)]
    if missing:
        pytest.skip(f"Spark Connect needs pyspark's connect extra: missing {', '.join(missing)}")
    topic = f"cluster-connect-{time.monotonic_ns()}"
    sent: list[str] = []
    for i, node in enumerate(two_nsqd):
        texts = [f"n{i}-{j:05d}" for j in range(3000)]
        publish(node, topic, [t.encode() for t in texts])
        sent.extend(texts)
    # the Connect server is the driver: its process tree must open no connection to nsqd
    with connect_server(spark_cluster.master) as (url, _server):
        watch = ConnectionOwners(two_nsqd, spark_cluster)
        try:
            got = client(
                url,
                "read",
                ",".join(watch.addresses),
                ",".join(n.http for n in two_nsqd),
                topic,
                str(tmp_path),
            )
        finally:
            watch.stop()
    bodies = collections.Counter(body for body, _id, _nsqd in got["rows"])
    assert sorted(bodies) == sorted(sent) and set(bodies.values()) == {1}
    assert {nsqd for _body, _id, nsqd in got["rows"]} == set(watch.addresses)
    assert watch.seen["executor"] > 0 and watch.others == [], (watch.seen, watch.others)
    for node in two_nsqd:
        final = stats(node, topic)
        assert final is not None and (final["depth"], final["in_flight_count"]) == (0, 0)
