"""What the commands say beside their output: a runtime error (:class:`Failure`, one line) and
the count of messages of ``pub`` and ``tail`` (:class:`Progress`)."""

from __future__ import annotations

import sys
import time

import anyio

__all__ = ["Failure", "Progress", "stopped"]


class Failure(Exception):
    """A runtime error, reported as one line (``nsq: error: ...``, exit status 1)."""


def stopped(error: BaseException) -> bool:
    """Whether ``error`` is the command being stopped (cancelled, interrupted), not a failure."""
    return isinstance(error, KeyboardInterrupt | anyio.get_cancelled_exc_class())


class Progress:
    """Counts messages; a live line on a terminal's stderr, one summary line at the end."""

    def __init__(self, verb: str, topic: str) -> None:
        self.verb = verb
        self.topic = topic
        self.count = 0
        self.start = time.perf_counter()
        self._shown = self.start
        self._live = sys.stderr.isatty()

    def add(self, n: int = 1) -> None:
        self.count += n
        if self._live:
            now = time.perf_counter()
            if now - self._shown >= 0.5:
                self._shown = now
                rate = self.count / (now - self.start)
                print(f"\r{self.verb} {self.count} ({rate:,.0f} msgs/s)", end="", file=sys.stderr)

    def summary(self) -> str:
        seconds = max(time.perf_counter() - self.start, 1e-9)
        return (
            f"{self.verb} {self.count} messages {'to' if self.verb == 'published' else 'from'} "
            f"{self.topic} in {seconds:.2f} s ({self.count / seconds:,.0f} msgs/s)"
        )

    def close(self, error: BaseException | None = None) -> None:
        """End the live line; the summary unless the command failed with ``error``."""
        if self._live:
            print("\r\033[K", end="", file=sys.stderr)
        if error is None or stopped(error):
            print(self.summary(), file=sys.stderr)
