"""The command line, run as a user would: separate processes over loopback."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

PY = [sys.executable, "-m", "nsq_anyio"]


def run(*args: str, stdin: str = "", timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*PY, *args], input=stdin, capture_output=True, text=True, timeout=timeout, check=False
    )


def test_demo_round_trip() -> None:
    out = run("demo", "--count", "500")
    assert out.returncode == 0, out.stderr
    assert "consumed 500 distinct messages" in out.stdout
    assert "round trip OK" in out.stdout


@contextlib.contextmanager
def serve() -> Iterator[dict[str, str]]:
    """``python -m nsq_anyio serve`` on free loopback ports; its addresses by name."""
    proc = subprocess.Popen(
        [*PY, "serve", "--tcp-port", "0", "--http-port", "0", "--lookupd-http-port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        addresses = {}
        for _ in range(3):
            line = proc.stdout.readline()
            name, _, address = line.rpartition(" ")
            addresses[name.strip()] = address.strip()
        yield addresses
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


@pytest.fixture
def server() -> Iterator[dict[str, str]]:
    with serve() as addresses:
        yield addresses


def test_pub_then_tail_through_lookupd(server: dict[str, str]) -> None:
    nsqd = server["nsqd TCP"]
    out = run("pub", "clicks", "--nsqd-tcp-address", nsqd, stdin="a\nb\n\nc\n")
    assert out.returncode == 0, out.stderr
    assert "published 3 messages" in out.stderr
    out = run("pub", "clicks", "--nsqd-tcp-address", nsqd, "--count", "250", "--size", "10")
    assert out.returncode == 0, out.stderr
    lookupd = server["lookupd HTTP"]
    out = run("tail", "clicks", "--lookupd-http-address", lookupd, "-n", "253")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[:3] == ["a", "b", "c"]
    assert lines[3:] == ["x" * 10] * 250


def test_unreachable_nsqd_is_a_clear_error() -> None:
    out = run("pub", "t", "--nsqd-tcp-address", "127.0.0.1:1", "--timeout", "1", stdin="x\n")
    assert out.returncode == 1
    assert out.stderr.startswith("error: publish 1 not acknowledged in time")
    assert "Traceback" not in out.stderr


def test_missing_address_is_a_usage_error() -> None:
    out = run("pub", "t", stdin="x\n")
    assert out.returncode != 0
    assert "--nsqd-tcp-address" in out.stderr


def test_bad_topic_is_a_clear_error(server: dict[str, str]) -> None:
    out = run("pub", "bad!topic", "--nsqd-tcp-address", server["nsqd TCP"], stdin="x\n")
    assert out.returncode == 1
    assert out.stderr.startswith("error: topic name 'bad!topic' is not valid")


def test_tail_stops_cleanly_on_interrupt(server: dict[str, str]) -> None:
    proc = subprocess.Popen(
        [*PY, "tail", "quiet", "--nsqd-tcp-address", server["nsqd TCP"]],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        proc.wait(timeout=1.5)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 130
    assert "Traceback" not in err


def test_nsq_tools_spellings_json_lines_and_rate_summaries(server: dict[str, str]) -> None:
    nsqd = server["nsqd TCP"]
    out = run("pub", "--topic=orders", f"--nsqd-tcp-address={nsqd}", stdin="one\ntwo\n")
    assert out.returncode == 0, out.stderr
    assert out.stderr.startswith("published 2 messages to orders in ")
    assert out.stderr.rstrip().endswith("msgs/s)")
    out = run(
        "tail",
        "--topic=orders",
        "--channel=c",
        "-n",
        "2",
        f"--nsqd-tcp-address={nsqd}",
        "--nsqd-tcp-address",
        nsqd,
        "--format",
        "json",
    )
    assert out.returncode == 0, out.stderr
    records = [json.loads(line) for line in out.stdout.splitlines()]
    assert [r["body"] for r in records] == ["one", "two"]
    assert all(r["attempts"] == 1 and r["nsqd"] == nsqd and len(r["id"]) == 16 for r in records)
    assert records[0]["timestamp"] > 1_600_000_000 * 10**9
    assert "received 2 messages from orders in " in out.stderr
    out = run("stats", "--nsqd-http-address", server["nsqd HTTP"], "--topic", "orders")
    assert out.returncode == 0, out.stderr
    (row,) = [line.split() for line in out.stdout.splitlines() if line.startswith("orders  ")][1:]
    assert row[:6] == ["orders", "c", "0", "0", "0", "0"]


def test_a_topic_given_twice_or_not_at_all_is_a_usage_error() -> None:
    out = run("tail", "a", "--topic=b", "--nsqd-tcp-address", "127.0.0.1:1")
    assert out.returncode != 0 and "give the topic once" in out.stderr
    out = run("pub", "--nsqd-tcp-address", "127.0.0.1:1", stdin="x\n")
    assert out.returncode != 0 and "give a topic" in out.stderr
