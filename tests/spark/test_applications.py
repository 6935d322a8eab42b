"""The source and sink as applications use them: a job started with the virtual environment's
Python (not activated), ``availableNow`` while publishing goes on, and a driver killed in the
middle of a batch read on the executors, then started again from its checkpoint."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ._cluster import Driver
from .helpers import NSQD, Emulator, RealNSQD, wait_for, write_available_now

pytestmark = pytest.mark.spark

CHANNEL = "spark"
needs_nsqd = pytest.mark.skipif(not NSQD, reason="no real nsqd: set NSQD to the binary to run this")


@pytest.fixture(scope="module")
def nsqd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealNSQD]:
    assert NSQD
    node = RealNSQD(tmp_path_factory.mktemp("nsqd"))
    node.start()
    try:
        yield node
    finally:
        node.stop()


def create_channel(node: RealNSQD, topic: str) -> None:
    """The topic and its channel, before the first message (so the channel keeps them all)."""
    for path in (f"topic/create?topic={topic}", f"channel/create?topic={topic}&channel={CHANNEL}"):
        request = urllib.request.Request(f"http://{node.http}/{path}", data=b"", method="POST")
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200


# ---------------------------------------------------------------------------------------------
# a job started as ``.venv/bin/python job.py``

#: how the jobs below start: their arguments, then a local[2] session with the source
JOB_START = """
import json
import sys

from pyspark.sql import SparkSession

from nsq_spark import NSQDataSource

{arguments} = sys.argv[1:]
spark = (
    SparkSession.builder.master("local[2]")
    .config("spark.ui.enabled", "false")
    .config("spark.driver.bindAddress", "127.0.0.1")
    .config("spark.driver.host", "127.0.0.1")
    .getOrCreate()
)
spark.sparkContext.setLogLevel("ERROR")
spark.dataSource.register(NSQDataSource)
"""

JOB = (
    JOB_START.format(arguments="nsqd, http, topic, staging")
    + """

# the sink: tasks publish
(
    spark.range(20)
    .selectExpr("concat('job-', id) as body")
    .write.format("nsq")
    .mode("append")
    .option("nsqd_tcp_addresses", nsqd)
    .option("topic", topic)
    .save()
)
# the source: the driver plans, tasks consume
got = []
query = (
    spark.readStream.format("nsq")
    .option("nsqd_tcp_addresses", nsqd)
    .option("nsqd_http_addresses", http)
    .option("topic", topic)
    .option("channel", "job")
    .option("staging_location", staging)
    .load()
    .writeStream.foreachBatch(lambda df, _: got.extend(r.body for r in df.collect()))
    .trigger(availableNow=True)
    .start()
)
query.awaitTermination()
print("ROWS", json.dumps(sorted(bytes(b).decode() for b in got)))
spark.stop()
"""
)


def test_a_job_run_by_the_virtual_environments_python_finds_nsq_spark_in_its_workers(
    emulator: Emulator, tmp_path: Path
) -> None:
    """No ``PYSPARK_PYTHON``, no ``PYTHONPATH``, the environment not activated: Spark's Python
    workers would run ``python3`` from the PATH, which does not have nsq_spark."""
    topic = "plain-job"
    job = tmp_path / "job.py"
    job.write_text(textwrap.dedent(JOB))
    venv_bin = os.path.dirname(sys.executable)
    path = [p for p in os.environ.get("PATH", os.defpath).split(os.pathsep) if p != venv_bin]
    env = {"PATH": os.pathsep.join(path), "HOME": os.environ.get("HOME", str(tmp_path))}
    for name in ("JAVA_HOME", "TMPDIR", "LANG"):
        if name in os.environ:
            env[name] = os.environ[name]
    done = subprocess.run(
        [
            sys.executable,
            str(job),
            emulator.address,
            emulator.http_address,
            topic,
            str(tmp_path / "staging"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        timeout=300,
    )
    out = done.stdout.decode()
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    rows = [line for line in out.splitlines() if line.startswith("ROWS ")]
    assert rows and json.loads(rows[0][5:]) == sorted(f"job-{i}" for i in range(20))


# ---------------------------------------------------------------------------------------------
# availableNow while publishing goes on


@pytest.mark.real_nsqd
@needs_nsqd
def test_available_now_ends_while_publishing_goes_on_and_loses_nothing(
    spark: Any, nsqd: RealNSQD, tmp_path: Path
) -> None:
    topic = f"available-now-publishing-{time.monotonic_ns()}"
    create_channel(nsqd, topic)
    before = [f"before-{i:05d}".encode() for i in range(500)]
    nsqd.publish(topic, before)
    later: list[bytes] = []
    stop = threading.Event()

    def keep_publishing() -> None:
        i = 0
        while not stop.is_set():
            chunk = [f"later-{i + j:06d}".encode() for j in range(10)]
            nsqd.publish(topic, chunk)
            later.extend(chunk)
            i += len(chunk)
            time.sleep(0.05)

    out, checkpoint = tmp_path / "out", tmp_path / "cp"

    def run() -> list[bytes]:
        df = (
            spark.readStream.format("nsq")
            .option("nsqd_tcp_addresses", nsqd.address)
            .option("nsqd_http_addresses", nsqd.http)
            .option("topic", topic)
            .option("channel", CHANNEL)
            .option("staging_location", str(tmp_path / "staging"))
            .option("max_messages_per_trigger", 200)
            .option("min_partitions", 2)
            .load()
            .select("body")
        )
        return [bytes(r.body) for r in write_available_now(df, out, checkpoint)]

    publisher = threading.Thread(target=keep_publishing, daemon=True)
    publisher.start()
    try:
        wait_for(lambda: len(later) >= 50)  # publishing goes on as the query starts
        first = run()
        assert publisher.is_alive() and not stop.is_set()
        published_meanwhile = len(later)
    finally:
        stop.set()
        publisher.join(30)
    # it read at least what was there at its start, and ended although more came
    assert set(before) <= set(first)
    assert published_meanwhile > 50
    # a second run gets the rest: nothing lost, nothing twice
    rows = run()
    copies = collections.Counter(rows)
    assert [b for b, c in copies.items() if c > 1] == []
    assert sorted(copies) == sorted(before + later)


# ---------------------------------------------------------------------------------------------
# the driver killed in the middle of a batch read on the executors


def _sink_batch(out: Path, batch_id: int) -> list[dict[str, Any]] | None:
    """The rows of one batch of the file sink's log, None if it is not committed."""
    import pyarrow.parquet as pq  # type: ignore[import-untyped]  # no type information

    entry = out / "_spark_metadata" / str(batch_id)
    if not entry.exists():
        return None
    rows: list[dict[str, Any]] = []
    for line in entry.read_text().splitlines()[1:]:
        if line.strip():
            path = json.loads(line)["path"].removeprefix("file:")
            rows.extend(pq.read_table(path).to_pylist())
    return rows


def _staged_uncommitted_batch(
    checkpoint: Path, out: Path, staging: Path
) -> tuple[int, list[str]] | None:
    """A batch in Spark's offset log that the sink has not committed and whose every task has
    staged its rows: (its id, the ids of its messages)."""
    import pyarrow as pa

    offsets = checkpoint / "offsets"
    if not offsets.exists():
        return None
    for entry in sorted(offsets.iterdir(), key=lambda p: p.name):
        if not entry.name.isdigit() or (out / "_spark_metadata" / entry.name).exists():
            continue
        try:
            end = json.loads(entry.read_text().splitlines()[-1])
        except (ValueError, IndexError):
            continue  # being written
        if "parts" not in end:
            continue
        files = [
            staging / end["run"] / str(end["batch"]) / f"{i}.arrow"
            for i in range(len(end["parts"]))
        ]
        if all(f.exists() for f in files):
            ids: list[str] = []
            for f in files:
                with pa.memory_map(str(f)) as source:
                    ids.extend(pa.ipc.open_file(source).read_all().column("id").to_pylist())
            return int(entry.name), ids
    return None


@pytest.mark.real_nsqd
@needs_nsqd
@pytest.mark.parametrize("where", ["local", "cluster"])
def test_a_driver_killed_mid_batch_replays_the_batch_with_the_same_rows(
    nsqd: RealNSQD, tmp_path: Path, where: str, request: pytest.FixtureRequest
) -> None:
    # on the cluster the killed driver's executors go with it, and the driver started again is
    # a new application with executors of its own
    master = "local[2]" if where == "local" else request.getfixturevalue("spark_cluster").master
    topic, n = f"executor-restart-{time.monotonic_ns()}", 600
    sent = [f"m{i:05d}".encode() for i in range(n)]
    create_channel(nsqd, topic)
    nsqd.publish(topic, sent)
    staging = tmp_path / "staging"
    options: dict[str, Any] = {
        "staging_location": staging,
        "max_messages_per_trigger": 150,
        "min_partitions": 2,
    }
    # each task waits once its rows are staged and FINished, before it writes them: the batch
    # is read, not yet committed, when the driver is killed
    driver = Driver(
        master, [nsqd], topic, tmp_path, "body;id", env={"NSQ_SPARK_PAUSE": "4"}, **options
    )
    try:

        def staged_and_finished() -> Any:
            # the rows are staged before their FINs go out: wait for nsqd to have them too
            found = _staged_uncommitted_batch(driver.checkpoint, driver.out, staging)
            counts = nsqd.counts(topic)
            done = found and counts is not None and counts.in_flight == 0
            return (found, counts) if done else None

        found, counts = wait_for(staged_and_finished, timeout=180, interval=0.05)
        driver.kill()
    finally:
        if driver.proc.poll() is None:
            driver.kill()
    batch_id, staged_ids = found
    assert staged_ids and _sink_batch(driver.out, batch_id) is None, "killed after its commit"
    assert counts is not None and counts.in_flight == 0  # its messages were FINished

    driver = Driver(master, [nsqd], topic, tmp_path, "body;id", **options)
    try:
        rows = wait_for(
            lambda: (r := driver.rows()) and {x["body"] for x in r} == set(sent) and r,
            timeout=180,
            interval=0.5,
        )
        replayed = _sink_batch(driver.out, batch_id)
    finally:
        driver.stop()
    # the batch that ran again gave exactly the rows it had
    assert replayed is not None
    assert sorted(r["id"] for r in replayed) == sorted(staged_ids)
    # nothing lost, nothing twice
    copies = collections.Counter(r["body"] for r in rows)
    assert [b for b, c in copies.items() if c > 1] == []
    assert sorted(copies) == sorted(sent)


# ---------------------------------------------------------------------------------------------
# large bodies with the default options and Spark's default memory

LARGE_JOB = (
    JOB_START.format(arguments="nsqd, http, topic, channel, mode, staging")
    + """
heads = []
executors_only = {"nsqd_http_addresses": http, "staging_location": staging}
query = (
    spark.readStream.format("nsq")
    .option("nsqd_tcp_addresses", nsqd)
    .option("topic", topic)
    .option("channel", channel)
    .option("read_mode", mode)
    .options(**(executors_only if mode == "executors" else {}))
    .load()
    .writeStream.foreachBatch(
        lambda df, _: heads.extend(
            r.head for r in df.selectExpr("cast(substr(body, 1, 12) as string) as head").collect()
        )
    )
    .trigger(availableNow=True)
    .start()
)
query.awaitTermination()
print("HEADS", json.dumps(heads))
spark.stop()
"""
)


class _PeakRSS:
    """The largest resident set of any Python process under ``pid``, sampled every 0.2 s."""

    def __init__(self, pid: int) -> None:
        from .helpers import descendants

        self.peak: dict[str, int] = {}
        self._done = threading.Event()

        def sample() -> None:
            while not self._done.wait(0.2):
                for p in descendants(pid):
                    try:
                        exe = Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")[0]
                        status = Path(f"/proc/{p}/status").read_text()
                    except OSError:
                        continue
                    if b"python" not in os.path.basename(exe) or "VmRSS:" not in status:
                        continue
                    rss = int(status.split("VmRSS:")[1].split()[0]) * 1024
                    self.peak[str(p)] = max(self.peak.get(str(p), 0), rss)

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()

    def stop(self) -> int:
        self._done.set()
        self._thread.join(10)
        return max(self.peak.values(), default=0)


@pytest.mark.real_nsqd
@needs_nsqd
@pytest.mark.parametrize(
    ("mode", "driver_memory"),
    [("executors", None), ("driver", None), ("executors", "768m"), ("driver", "768m")],
)
def test_large_bodies_with_the_default_options_and_memory(
    nsqd: RealNSQD, tmp_path: Path, mode: str, driver_memory: str | None
) -> None:
    """5,000 bodies of 200 KB (1 GB) on ``local[2]``: Spark's default memory (a 1 GB driver)
    and the source's default options, in either read mode. Every message arrives once, and no
    Python process holds anything near the gigabyte. A driver with a quarter less memory
    (768 MB) does as well: the defaults leave room (a driver reader's batch travels inside
    its task, which the JVM holds several copies of while it ships it)."""
    topic, n, size = f"large-{mode}-{time.monotonic_ns()}", 5_000, 200_000
    create_channel(nsqd, topic)
    for at in range(0, n, 20):  # MPUB of 4 MB (nsqd's --max-body-size is 5 MB)
        nsqd.publish(topic, [f"{i:05d}".encode().ljust(size, b"x") for i in range(at, at + 20)])
    job = tmp_path / "job.py"
    job.write_text(textwrap.dedent(LARGE_JOB))
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    env.pop("PYSPARK_SUBMIT_ARGS", None)
    if driver_memory is not None:
        env["PYSPARK_SUBMIT_ARGS"] = f"--driver-memory {driver_memory} pyspark-shell"
    argv = [sys.executable, str(job), nsqd.address, nsqd.http, topic, CHANNEL, mode]
    proc = subprocess.Popen(
        [*argv, str(tmp_path / "staging")],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    rss = _PeakRSS(proc.pid)
    try:
        out, err = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"the job did not end within 300 s: {err.decode()[-3000:]}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        peak = rss.stop()
    assert proc.returncode == 0, err.decode()[-3000:]
    lines = [line for line in out.decode().splitlines() if line.startswith("HEADS ")]
    heads = collections.Counter(h[:5] for h in json.loads(lines[0][6:]))
    assert sorted(heads) == [f"{i:05d}" for i in range(n)] and set(heads.values()) == {1}
    counts = nsqd.counts(topic)
    assert counts is not None and (counts.depth, counts.in_flight) == (0, 0)
    # the largest Python process (driver, source runner, worker) held a small part of it
    assert peak < 1 << 30, f"a Python process reached {peak >> 20} MB"
