"""``examples/spark_pipeline``, the declarative pipeline, run as a user runs it:
``spark-pipelines run --remote 'local[2]'`` in (a copy of) its directory, against a real nsqd;
the streaming table then holds every message published before the run, once, and the channel
is drained.  Run when ``NSQD`` points at nsqd (or it is on PATH); needs pyspark's ``connect``
extra, as ``spark-pipelines`` is a Spark Connect client.

On pyspark 4.3.0 the command may exit 1 after the run completed, its last words
``[UNKNOWN_RESPONSE] Unknown response: Plan observed(__python_accumulator__=...)``: pyspark's
client does not know the response a Python streaming source's metrics make.  The test accepts
that exit and no other failure."""

from __future__ import annotations

import collections
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.net import live_processes

from ._cluster import ROOT, spark_env
from ._connect import missing
from .helpers import NSQD, RealNSQD

pytestmark = [
    pytest.mark.spark,
    pytest.mark.real_nsqd,
    pytest.mark.skipif(not NSQD, reason="no real nsqd: set NSQD to the binary to run these"),
    pytest.mark.skipif(
        bool(missing), reason=f"spark-pipelines needs pyspark's connect extra: {missing}"
    ),
]

EXAMPLE = ROOT / "examples" / "spark_pipeline"
TABLE = "nsq_messages"
#: the exit of pyspark 4.3.0's client after a run with a Python streaming source (see above)
KNOWN_FAILURE = "__python_accumulator__"


@pytest.fixture
def nsqd(tmp_path: Path) -> Iterator[RealNSQD]:
    assert NSQD
    node = RealNSQD(tmp_path / "nsqd")
    (tmp_path / "nsqd").mkdir()
    node.start()
    try:
        yield node
    finally:
        node.stop()


def _session(sid: int) -> set[int]:
    """The live processes of the session ``sid`` (Linux /proc)."""
    return {pid for pid, fields in live_processes() if int(fields[3]) == sid}


def run_pipeline(project: Path, env: dict[str, str], timeout: float = 240.0) -> tuple[int, str]:
    """``spark-pipelines run --remote 'local[2]'`` in ``project``: its exit code and output."""
    cli = Path(sys.executable).parent / "spark-pipelines"
    proc = subprocess.Popen(
        [str(cli), "run", "--remote", "local[2]"],
        cwd=project,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for pid in _session(proc.pid):
            os.kill(pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"spark-pipelines ran over {timeout} s:\n{out.decode()[-5000:]}")
    finally:
        for pid in _session(proc.pid):  # nothing it started outlives it
            os.kill(pid, signal.SIGKILL)
    return proc.returncode, out.decode(errors="replace")


def table_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a table written by a streaming query: the files its file-sink log lists."""
    import pyarrow.parquet as pq  # type: ignore[import-untyped]  # no type information

    files: dict[str, bool] = {}
    log = path / "_spark_metadata"
    for entry in sorted(log.iterdir(), key=lambda p: (len(p.name), p.name)):
        if entry.name.startswith(".") or not entry.name.split(".")[0].isdigit():
            continue
        for line in entry.read_text().splitlines()[1:]:
            if line.strip():
                item = json.loads(line)
                files[item["path"]] = item["action"] != "delete"
    rows: list[dict[str, Any]] = []
    for name, present in files.items():
        if present:
            rows.extend(
                pq.read_table(name.removeprefix("file://").removeprefix("file:")).to_pylist()
            )
    return rows


def channel_stats(node: RealNSQD, topic: str, channel: str) -> dict[str, Any]:
    url = f"http://{node.http}/stats?format=json&topic={topic}&channel={channel}"
    with urllib.request.urlopen(url, timeout=5) as response:
        data = json.load(response)
    for t in data["topics"]:
        for c in t["channels"]:
            if c["channel_name"] == channel:
                return dict(c)
    raise AssertionError(f"no channel {channel!r} on {topic!r}: {data}")


def test_the_pipeline_example_fills_its_table_with_every_message_once(
    nsqd: RealNSQD, tmp_path: Path
) -> None:
    # the example in a directory of its own: its checkpoints (the spec's storage) and its
    # tables (spark-warehouse, in the directory the command runs in) land there
    project = tmp_path / "project"
    shutil.copytree(EXAMPLE, project, ignore=shutil.ignore_patterns("__pycache__"))
    spec = project / "spark-pipeline.yml"
    text, replaced = re.subn(
        r"^storage: .*$",
        f"storage: {(tmp_path / 'storage').as_uri()}",
        spec.read_text(),
        flags=re.M,
    )
    assert replaced == 1
    spec.write_text(text)
    # the channel is the spec's; the addresses and the topic come from the environment
    found = re.search(r"^\s*spark\.nsq\.source\.channel: (\S+)$", text, re.M)
    assert found is not None
    channel = found[1]

    topic = f"pipeline-{time.monotonic_ns()}"
    sent = [f"p{i:04d}".encode() for i in range(400)]
    nsqd.publish(topic, sent)

    env = {
        k: v
        for k, v in spark_env().items()
        if not k.startswith(("SPARK_CONNECT", "SPARK_REMOTE", "NSQ_SOURCE_"))
    }
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.update(
        NSQ_SOURCE_NSQD_TCP_ADDRESSES=nsqd.address,
        NSQ_SOURCE_NSQD_HTTP_ADDRESSES=nsqd.http,
        NSQ_SOURCE_TOPIC=topic,
        NSQ_SOURCE_STAGING_LOCATION=str(tmp_path / "staging"),
        # a few micro-batches
        NSQ_SOURCE_MAX_MESSAGES_PER_TRIGGER="150",
    )
    code, out = run_pipeline(project, env)
    assert code == 0 or (code == 1 and KNOWN_FAILURE in out), out[-5000:]

    rows = table_rows(project / "spark-warehouse" / TABLE)
    copies = collections.Counter(r["body"] for r in rows)
    assert [b for b, c in copies.items() if c > 1] == []  # not one duplicate
    assert sorted(copies) == sorted(b.decode() for b in sent)
    assert len({r["id"] for r in rows}) == len(sent)
    assert {r["nsqd"] for r in rows} == {nsqd.address}
    stats = channel_stats(nsqd, topic, channel)
    assert (stats["depth"], stats["in_flight_count"], stats["message_count"]) == (0, 0, len(sent))
