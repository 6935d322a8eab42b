"""Tests on a busy machine: waits that fail when nothing moves rather than at a fixed time, and
a measure of how starved the machine was, so that a figure below its goal says why.

A test that asserts behaviour (every message once, a stop that does not wait for its timeout)
should not go red because other processes took the cores: it waits as long as the thing it
watches keeps moving, and reports its figures (seconds, rates) beside the share of the time in
which tasks on this machine waited for a CPU."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

#: a share of the time above which the machine counts as starved: tasks waited for a CPU
#: during most of the stretch measured
STARVED = 0.5


def _stalled_us() -> int | None:
    """Microseconds in which some task of this machine waited for a CPU since boot (the
    kernel's pressure stall information), or None where the kernel does not tell."""
    try:
        with open("/proc/pressure/cpu") as f:
            for line in f:
                if line.startswith("some "):
                    return int(line.rsplit("total=", 1)[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


class CpuPressure:
    """How starved the machine is from its creation on: the share of the wall time in which
    some task waited for a CPU (``/proc/pressure/cpu``), and the load average."""

    def __init__(self) -> None:
        self._start = time.monotonic()
        self._stalled = _stalled_us()

    def share(self) -> float | None:
        """The share of the time since the start in which some task waited for a CPU, or
        None where the kernel does not tell."""
        now = _stalled_us()
        if now is None or self._stalled is None:
            return None
        wall = time.monotonic() - self._start
        return min(1.0, (now - self._stalled) / 1e6 / wall) if wall > 0 else 0.0

    def starved(self) -> bool:
        share = self.share()
        if share is None:  # no pressure information: the load average against the cores
            return os.getloadavg()[0] > 2 * (os.cpu_count() or 1)
        return share > STARVED

    def describe(self) -> str:
        share = self.share()
        load = f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
        if share is None:
            return load
        return f"tasks waited for a CPU {share:.0%} of the time, {load}"

    def against_goal(self, what: str, value: float, goal: float, unit: str = "s") -> str:
        """A figure against its goal (at most ``goal``): empty when it meets it; else a line
        saying by how much it missed, and whether the machine was starved meanwhile."""
        if value <= goal:
            return ""
        why = (
            "because the machine was starved"
            if self.starved()
            else "on a machine that was not starved"
        )
        return (
            f"{what} {value:.2f} {unit} above its goal of {goal:g} {unit} {why} ({self.describe()})"
        )


def wait_while_moving(
    predicate: Callable[[], bool],
    progress: Callable[[], object],
    *,
    stall: float = 60.0,
    interval: float = 0.2,
    what: str = "",
) -> float:
    """Poll until ``predicate()`` holds, as long as ``progress()`` (a figure of the work being
    waited for: rows written, a queue's depth) changes at least once every ``stall`` seconds;
    raises AssertionError when it stood still that long.  Returns the seconds waited."""
    start = moved = time.monotonic()
    last = progress()
    while not predicate():
        time.sleep(interval)
        now = progress()
        if now != last:
            last, moved = now, time.monotonic()
        elif time.monotonic() - moved > stall:
            raise AssertionError(
                f"nothing moved for {stall:g} s ({what or predicate}; still at {last!r} after "
                f"{time.monotonic() - start:.0f} s)"
            )
    return time.monotonic() - start
