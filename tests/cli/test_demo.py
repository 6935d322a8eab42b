"""``demo``: the round trip against the embedded emulator, its usage errors and its stop."""

from __future__ import annotations

import pytest

from tests.cli.helpers import (
    BACKENDS,
    assert_interrupted,
    assert_usage_error,
)
from tests.support.served import run, running


def test_demo_round_trip() -> None:
    out = run("demo", "--count", "500")
    assert out.returncode == 0, out.stderr
    assert "consumed 500 distinct messages" in out.stdout
    assert "round trip OK" in out.stdout


def test_demo_count_zero_is_a_usage_error() -> None:
    out = run("demo", "--count", "0", timeout=10)
    assert_usage_error(out, "--count", "'0'")


@pytest.mark.parametrize("backend", BACKENDS)
def test_demo_stops_on_interrupt(backend: str) -> None:
    with running("demo", "--count", "10000000", "--backend", backend) as proc:
        proc.wait_for("err", "emulated lookupd at")
        assert_interrupted(proc)
