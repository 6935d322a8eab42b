"""What the worker command's tests share (``test_worker.py``, ``test_worker_http.py``): the
worker run as a process of its own (``python -m nsq_cli`` or the installed script) on a
handler module written for the test, messages published to a real nsqd, what the handler
recorded, and a port that records connections."""

from __future__ import annotations

import contextlib
import os
import queue
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.support import ROOT
from tests.support.servers import Nsqd

#: the worker as ``python -m nsq_cli``, and as the installed script
PY = [sys.executable, "-m", "nsq_cli"]


SCRIPT = [str(Path(sys.executable).parent / "nsq-sansio")]


#: the handlers the tests run: each records the body of every message it handled, one a line
HANDLERS = """\
import os
import threading
import time

import anyio

OUT = os.environ["HANDLED_FILE"]
DELAY = float(os.environ.get("HANDLER_DELAY", "0.01"))
_lock = threading.Lock()
_running = 0


def _record(body):
    fd = os.open(OUT, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, body + b"\\n")
    finally:
        os.close(fd)


async def handle(message):
    await anyio.sleep(DELAY)
    _record(message.body)


def plain(message):
    global _running
    with _lock:
        _running += 1
        busy = _running
    try:
        time.sleep(DELAY)
        main = threading.current_thread() is threading.main_thread()
        _record(b"%s %s %d" % (message.body, b"main" if main else b"other", busy))
    finally:
        with _lock:
            _running -= 1


not_callable = 42
"""


def publish(nsqd: Nsqd, topic: str, count: int, prefix: str = "m") -> list[bytes]:
    """``count`` distinct bodies published in batches (nsqd's ``/mpub``)."""
    bodies = [f"{prefix}{i:06d}".encode() for i in range(count)]
    for first in range(0, count, 1000):
        batch = b"\n".join(bodies[first : first + 1000])
        url = f"http://127.0.0.1:{nsqd.http}/mpub?topic={topic}"
        with urllib.request.urlopen(urllib.request.Request(url, data=batch), timeout=10) as r:
            assert r.status == 200
    return bodies


def handled(app: Path) -> list[bytes]:
    path = app / "handled.txt"
    return path.read_bytes().splitlines() if path.exists() else []


def wait_until(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.05)


class Worker:
    """``worker`` running in the background in the application's directory; its stderr
    lines as they come."""

    def __init__(
        self,
        app: Path,
        *args: str,
        env: dict[str, str] | None = None,
        program: list[str] = PY,
    ) -> None:
        environ = {
            key: value
            for key, value in os.environ.items()
            if not (key.startswith("NSQ_") or key == "NSQD_TCP_ADDRESSES")
        }
        environ |= {
            "PYTHONPATH": str(ROOT),
            "PYTHONUNBUFFERED": "1",
            "HANDLED_FILE": str(app / "handled.txt"),
            **(env or {}),
        }
        self.proc = subprocess.Popen(
            [*program, "worker", *args],
            cwd=app,
            env=environ,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.err: list[str] = []
        self.lines: queue.Queue[str] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.err.append(line)
            self.lines.put(line)

    def wait_for(self, text: str, timeout: float = 30) -> str:
        """The first line (not yet read) containing ``text``."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(
                    f"no {text!r} on stderr in {timeout} s: {''.join(self.err)}"
                ) from None
            if text in line:
                return line

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def wait(self, timeout: float) -> tuple[int, float]:
        """The exit status, and the seconds it took to come."""
        start = time.monotonic()
        code = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=10)
        return code, time.monotonic() - start

    @property
    def stderr(self) -> str:
        return "".join(self.err)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._reader.join(timeout=10)


@contextlib.contextmanager
def worker(app: Path, *args: str, **kwargs: Any) -> Iterator[Worker]:
    running = Worker(app, *args, **kwargs)
    try:
        yield running
    finally:
        running.kill()
        for stream in (running.proc.stdout, running.proc.stderr):
            assert stream is not None
            stream.close()


@contextlib.contextmanager
def listener() -> Iterator[tuple[str, socket.socket]]:
    """A port that records connections (none is accepted)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        sock.setblocking(False)
        yield f"127.0.0.1:{sock.getsockname()[1]}", sock


def connected(sock: socket.socket) -> bool:
    try:
        conn, _ = sock.accept()
    except BlockingIOError:
        return False
    conn.close()
    return True
