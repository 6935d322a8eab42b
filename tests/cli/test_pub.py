"""``pub``: publishing stdin lines or generated bodies, its usage and runtime errors, and a
terminal's input (Ctrl-D ends, Ctrl-C stops)."""

from __future__ import annotations

import os
import pty

import pytest

from tests.cli.helpers import (
    BACKENDS,
    assert_interrupted,
    assert_runtime_error,
    assert_usage_error,
)
from tests.support.served import run, running


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
    assert_runtime_error(out, "127.0.0.1:1")


def test_missing_topic_is_a_usage_error() -> None:
    out = run("pub", "--nsqd-tcp-address", "127.0.0.1:1", stdin="x\n")
    assert_usage_error(out, "give a topic")


def test_missing_address_is_a_usage_error() -> None:
    out = run("pub", "t", stdin="x\n")
    assert_usage_error(out, "--nsqd-tcp-address", "--lookupd-http-address")


def test_bad_topic_is_a_usage_error() -> None:
    out = run("pub", "bad!topic", "--nsqd-tcp-address", "127.0.0.1:1", stdin="x\n")
    assert_usage_error(out, "'bad!topic'", "topic name")


@pytest.mark.parametrize("backend", BACKENDS)
def test_pub_from_a_terminal_stops_on_interrupt(server: dict[str, str], backend: str) -> None:
    """Reading a terminal that nobody types on, it still stops at once."""
    parent, child = pty.openpty()
    try:
        with running(
            "pub",
            "t",
            "--nsqd-tcp-address",
            server["nsqd TCP"],
            "--backend",
            backend,
            stdin=child,
        ) as proc:
            proc.wait_for("err", "Ctrl-D")
            assert_interrupted(proc)
    finally:
        os.close(parent)
        os.close(child)


@pytest.mark.parametrize("backend", BACKENDS)
def test_pub_from_a_terminal_publishes_lines_until_end_of_input(
    server: dict[str, str], backend: str
) -> None:
    parent, child = pty.openpty()
    try:
        with running(
            "pub",
            "t",
            "--nsqd-tcp-address",
            server["nsqd TCP"],
            "--backend",
            backend,
            stdin=child,
        ) as proc:
            proc.wait_for("err", "Ctrl-D")
            os.write(parent, b"one\ntwo\n\x04")
            assert proc.proc.wait(timeout=10) == 0, "".join(proc.err)
            proc.stop()
            assert "published 2 messages to t" in "".join(proc.err)
    finally:
        os.close(parent)
        os.close(child)
