"""A Spark driver killed (``kill -9``), terminated (SIGTERM) or stopped (``query.stop()``) in
the middle of a stream, and an nsqd restarted under a running driver; each time the driver is
started again from its checkpoint: nothing is lost, and a message written twice is one that
nsqd delivered again (same id, more attempts).  Against the emulator always, and against a real
nsqd when ``NSQD`` points at one.

The driver is ``tests/spark/driver.py`` in a process of its own, as a user runs it; the tests
read what it wrote through Spark's file-sink log, so only committed batches count."""

from __future__ import annotations

import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal, Protocol

import pytest

from .helpers import CHANNEL, NSQD, Counts, Emulator, RealNSQD, alive, descendants, wait_for

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]


class Target(Protocol):
    @property
    def address(self) -> str: ...

    def publish(self, topic: str, bodies: list[bytes]) -> None: ...

    def counts(self, topic: str) -> Counts | None: ...

    def restart(self) -> None:
        """Stop nsqd (its queues kept, as on disk) and start it again on the same port."""


class EmulatedNSQD:
    def __init__(self, emulator: Emulator) -> None:
        self.emulator = emulator
        self.address = emulator.address

    def publish(self, topic: str, bodies: list[bytes]) -> None:
        self.emulator.publish(topic, bodies)

    def counts(self, topic: str) -> Counts | None:
        try:
            s = self.emulator.channel_stats(topic, CHANNEL)
        except KeyError:
            return None
        return Counts(s.depth, s.in_flight_count, s.requeue_count)

    def restart(self) -> None:
        self.emulator.stop_nsqd()
        time.sleep(0.5)
        self.emulator.start_nsqd()


@pytest.fixture(scope="module")
def real_nsqd() -> Iterator[RealNSQD]:
    if not NSQD:
        pytest.skip("no real nsqd: set NSQD to the binary to run the driver tests against it")
    data = tempfile.mkdtemp(prefix="nsqd-spark-")
    nsqd = RealNSQD(data)
    try:
        nsqd.start()
        yield nsqd
    finally:
        nsqd.stop()
        shutil.rmtree(data, ignore_errors=True)


@pytest.fixture(params=["emulator", "real-nsqd"])
def target(request: pytest.FixtureRequest, emulator: Emulator) -> Target:
    if request.param == "emulator":
        return EmulatedNSQD(emulator)
    real: RealNSQD = request.getfixturevalue("real_nsqd")
    return real


class Driver:
    """One run of ``tests/spark/driver.py``: the user's Spark application."""

    def __init__(self, target: Target, topic: str, out: Path, checkpoint: Path) -> None:
        options = {
            "nsqd_tcp_addresses": target.address,
            "topic": topic,
            "channel": CHANNEL,
            "max_in_flight": 400,
            "maxMessagesPerTrigger": 100,
            # what a killed driver held comes back after msg_timeout
            "msg_timeout": 2,
            # the reader that holds messages in the driver between batches
            "read_mode": "driver",
        }
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.spark.driver",
                str(out),
                str(checkpoint),
                *(f"{k}={v}" for k, v in options.items()),
            ],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def end(self, how: signal.Signals | None) -> float:
        """Send ``how`` to the driver (None: ``query.stop()``); seconds until it and every
        process it started are gone."""
        family = descendants(self.proc.pid)
        started = time.monotonic()
        assert self.proc.stdin is not None
        if how is None:
            self.proc.stdin.write(b"stop\n")
            self.proc.stdin.flush()
        else:
            self.proc.send_signal(how)
        self.proc.wait(timeout=60)
        self.proc.stdin.close()
        if how is None:
            assert self.proc.returncode == 0
        try:
            wait_for(lambda: not alive(family), timeout=60, interval=0.1)
        finally:
            for pid in alive(family):  # the test failed: leave nothing behind
                os.kill(pid, signal.SIGKILL)
        return time.monotonic() - started

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.end(signal.SIGKILL)
        if self.proc.stdin is not None:
            self.proc.stdin.close()


def committed_rows(out: Path) -> list[dict[str, Any]]:
    """The rows of every batch in Spark's file-sink log (what a reader of OUT sees)."""
    import pyarrow.parquet as pq  # type: ignore[import-untyped]  # no type information

    log = out / "_spark_metadata"
    if not log.exists():
        return []
    files: list[str] = []
    for entry in sorted(log.iterdir()):
        if entry.name.startswith("."):
            continue
        lines = entry.read_text().splitlines()[1:]  # "v1", then one JSON object per file
        files.extend(json.loads(line)["path"] for line in lines if line.strip())
    rows: list[dict[str, Any]] = []
    for path in dict.fromkeys(files):  # a compacted log lists files again
        table = pq.read_table(path.removeprefix("file:"), columns=["id", "body", "attempts"])
        rows.extend(table.to_pylist())
    return rows


def test_killed_and_terminated_drivers_lose_nothing(target: Target, tmp_path: Path) -> None:
    topic, n = f"driver-restarts-{time.monotonic_ns()}", 3000
    sent = [f"m{i:05d}".encode() for i in range(n)]
    target.publish(topic, sent)
    out, checkpoint = tmp_path / "out", tmp_path / "cp"

    def finished() -> int:
        c = target.counts(topic)
        return 0 if c is None else n - c.depth - c.in_flight

    def progress(before: int, step: int = 300) -> None:
        wait_for(lambda: finished() >= before + step, timeout=120, interval=0.05)

    ends: list[tuple[str, int, int, float]] = []
    # a signal, query.stop() (None), or query.stop() after an nsqd restart under the driver
    ways: list[signal.Signals | Literal["restart"] | None] = [
        signal.SIGKILL,
        signal.SIGKILL,
        signal.SIGKILL,
        signal.SIGTERM,
        None,
        "restart",
    ]
    for i, way in enumerate(ways):
        how = way if isinstance(way, signal.Signals) else None
        before = finished()
        driver = Driver(target, topic, out, checkpoint)
        try:
            # ended in the middle of the stream: a few batches in, messages held, at a
            # different point of a batch each time
            progress(before)
            if way == "restart":
                target.restart()  # nsqd, under the running driver
                progress(finished())
            time.sleep(0.07 * i)
            counts = target.counts(topic)
            held = 0 if counts is None else counts.in_flight
            requeues = 0 if counts is None else counts.requeues
            seconds = driver.end(how)
        finally:
            driver.kill()
        name = how.name if how is not None else "stop" if way is None else "nsqd restart"
        ends.append((name, finished(), held, seconds))
        assert finished() < n, "the stream should have been ended in the middle"
        if how is None:
            # a stopped query requeues what it held at once (a killed one cannot: nsqd times
            # it out after msg_timeout)
            after = wait_for(
                lambda: (c := target.counts(topic)) and c.in_flight == 0 and c, timeout=30
            )
            assert after.requeues > requeues

    driver = Driver(target, topic, out, checkpoint)
    try:
        wait_for(lambda: finished() == n, timeout=120)
        rows = wait_for(
            lambda: (r := committed_rows(out)) and {x["body"] for x in r} == set(sent) and r,
            timeout=60,
        )
        driver.end(None)
    finally:
        driver.kill()
    copies_of = collections.Counter(r["body"] for r in rows)
    duplicates = len(rows) - n
    print(f"ends (signal, finished, held, seconds to exit): {ends}; {duplicates} duplicates")
    assert set(copies_of) == set(sent)
    # what the ended drivers held came back from nsqd, and was written
    assert sum(e[2] for e in ends) > 0
    assert any(r["attempts"] >= 2 for r in rows)
    for body, count in copies_of.items():
        if count > 1:  # a duplicate is a redelivery: one id, attempts say so
            copies = [r for r in rows if r["body"] == body]
            assert len({r["id"] for r in copies}) == 1
            assert max(r["attempts"] for r in copies) >= 2
    final = target.counts(topic)
    assert final is not None and (final.depth, final.in_flight) == (0, 0)
