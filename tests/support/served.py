"""The emulator served on loopback by the command line (``python -m nsq_cli serve``), in a
process of its own, and commands run as a user runs them (:func:`run`, :class:`Running`).
The ``server`` fixture gives a served emulator's addresses by name (``nsqd TCP``, ``nsqd
HTTP``, ``lookupd HTTP``); a test module imports it."""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import IO

import pytest

from . import ROOT

PY = [sys.executable, "-m", "nsq_cli"]
ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    "PYTHONUNBUFFERED": "1",
}


def as_in_a_terminal() -> None:
    """A child's ``preexec_fn``: Ctrl-C (SIGINT) as a terminal's foreground program gets it.
    A program started in the background of a script (``cmd &``, as a CI job may be) starts
    with SIGINT ignored, and Python then raises no KeyboardInterrupt for it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run(
    *args: str, stdin: str = "", timeout: float = 60, program: list[str] = PY
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*program, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=ENV,
    )


class Running:
    """A command running in the background; its output lines as they come."""

    def __init__(
        self, *args: str, stdin: int | None = subprocess.DEVNULL, program: list[str] = PY
    ) -> None:
        self.proc = subprocess.Popen(
            [*program, *args],
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=ENV,
            preexec_fn=as_in_a_terminal,
        )
        self.lines: queue.Queue[tuple[str, str]] = queue.Queue()
        self.out: list[str] = []
        self.err: list[str] = []
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self._readers = [
            threading.Thread(target=self._read, args=(self.proc.stdout, "out", self.out)),
            threading.Thread(target=self._read, args=(self.proc.stderr, "err", self.err)),
        ]
        for reader in self._readers:
            reader.start()

    def _read(self, stream: IO[str], name: str, into: list[str]) -> None:
        for line in stream:
            into.append(line)
            self.lines.put((name, line))

    def wait_for(self, name: str, text: str, timeout: float = 10) -> str:
        """The first line of ``name`` (``out`` or ``err``) containing ``text``."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                which, line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(
                    f"no {text!r} on std{name} in {timeout} s: {''.join(self.err)}"
                ) from None
            if which == name and text in line:
                return line

    def interrupt(self) -> float:
        """SIGINT; the seconds until the process ended."""
        start = time.monotonic()
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(timeout=20)
        return time.monotonic() - start

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for reader in self._readers:
            reader.join()
        for stream in (self.proc.stdout, self.proc.stderr):
            assert stream is not None
            stream.close()


@contextlib.contextmanager
def running(
    *args: str, stdin: int | None = subprocess.DEVNULL, program: list[str] = PY
) -> Iterator[Running]:
    proc = Running(*args, stdin=stdin, program=program)
    try:
        yield proc
    finally:
        proc.stop()


@contextlib.contextmanager
def serve() -> Iterator[dict[str, str]]:
    """``python -m nsq_cli serve`` on free loopback ports; its addresses by name."""
    with running(
        "serve", "--tcp-port", "0", "--http-port", "0", "--lookupd-http-port", "0"
    ) as proc:
        addresses = {}
        for _ in range(3):
            line = proc.wait_for("out", " ")
            name, _, address = line.rpartition(" ")
            addresses[name.strip()] = address.strip()
        yield addresses
        proc.interrupt()


@pytest.fixture
def server() -> Iterator[dict[str, str]]:
    with serve() as addresses:
        yield addresses
