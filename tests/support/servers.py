"""Real nsqd/nsqlookupd processes on loopback (the fault scenarios, the benchmarks, the tests
against real servers): start, kill -9, stop, freeze (SIGSTOP), thaw (SIGCONT) and restart on
the same ports and data; and an nsqd auth endpoint."""

from __future__ import annotations

import http.server
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from .net import free_ports, start_server, wait_serving

NSQD = os.environ.get("NSQD") or shutil.which("nsqd")
NSQLOOKUPD = os.environ.get("NSQLOOKUPD") or shutil.which("nsqlookupd")
MISSING = "no real nsqd/nsqlookupd: set NSQD and NSQLOOKUPD to the binaries to run these"


def _stopped(pid: int) -> bool:
    """Whether every thread of ``pid`` is in the stopped state (T)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue  # a thread that ended
        if stat.rsplit(")", 1)[1].split()[0] not in ("T", "t"):
            return False
    return True


class Process:
    """One server process that can be killed, frozen and started again as it was.  Its first
    start chooses its ports (again, when another process took one first); a restart keeps
    them."""

    def __init__(self, nports: int) -> None:
        self.nports = nports
        self.ports: list[int] = free_ports(nports)
        self.started = False
        self.proc: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        raise NotImplementedError

    @property
    def tcp(self) -> int:
        return self.ports[0]

    @property
    def http(self) -> int:
        return self.ports[1]

    @property
    def ping(self) -> str:
        return f"http://127.0.0.1:{self.http}/ping"

    def start(self) -> None:
        if not self.started:

            def argv_for(ports: list[int]) -> list[str]:
                self.ports = ports
                return self.argv()

            self.proc, self.ports = start_server(
                argv_for, self.nports, lambda ports: self.ping, first=self.ports, timeout=10.0
            )
            self.started = True
            return
        self.proc = subprocess.Popen(
            self.argv(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            wait_serving(self.proc, self.ping, self.ports)
        except BaseException:
            self.stop()  # never leave a server behind
            raise

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def freeze(self) -> None:
        """SIGSTOP, and wait until every thread of the process is stopped (the signal is only
        queued when ``kill`` returns)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + 10.0
        while not _stopped(self.proc.pid):
            if time.monotonic() > deadline:
                raise TimeoutError(f"pid {self.proc.pid} not stopped 10 s after SIGSTOP")
            time.sleep(0.001)

    def thaw(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM (nsqd writes what it holds to disk), SIGKILL after ``timeout`` seconds."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


class Lookupd(Process):
    def __init__(self) -> None:
        assert NSQLOOKUPD
        super().__init__(2)

    def argv(self) -> list[str]:
        assert NSQLOOKUPD
        return [
            NSQLOOKUPD,
            f"--tcp-address=127.0.0.1:{self.tcp}",
            f"--http-address=127.0.0.1:{self.http}",
        ]

    @property
    def http_address(self) -> str:
        return f"127.0.0.1:{self.http}"


class Nsqd(Process):
    """``durable`` (the default): every acknowledged publish reaches the disk before the OK
    (``--mem-queue-size=0 --sync-every=1``), so a kill -9 loses only what nsqd held in memory:
    in-flight messages.  Otherwise nsqd's own defaults.  ``data``: its data path (default: a
    new temporary directory)."""

    def __init__(
        self,
        *extra: str,
        lookupd: Lookupd | None = None,
        durable: bool = True,
        data: str | None = None,
    ) -> None:
        assert NSQD
        self.extra = extra
        self.lookupd = lookupd
        self.durable = durable
        self.data = data if data is not None else tempfile.mkdtemp(prefix="nsqd-fault-")
        super().__init__(2)

    def argv(self) -> list[str]:
        assert NSQD
        argv = [
            NSQD,
            f"--tcp-address=127.0.0.1:{self.tcp}",
            f"--http-address=127.0.0.1:{self.http}",
            "--https-address=",
            "--broadcast-address=127.0.0.1",
            f"--data-path={self.data}",
            *(("--mem-queue-size=0", "--sync-every=1") if self.durable else ()),
            *self.extra,
        ]
        if self.lookupd is not None:
            argv.append(f"--lookupd-tcp-address=127.0.0.1:{self.lookupd.tcp}")
        return argv

    @property
    def tcp_address(self) -> str:
        return f"127.0.0.1:{self.tcp}"

    def stats(self, topic: str) -> dict[str, Any]:
        url = f"http://127.0.0.1:{self.http}/stats?format=json&topic={topic}"
        with urllib.request.urlopen(url, timeout=5) as response:
            data: dict[str, Any] = json.load(response)
        return data

    def channel(self, topic: str, channel: str) -> dict[str, Any] | None:
        for t in self.stats(topic).get("topics", []):
            if t["topic_name"] == topic:
                for c in t["channels"]:
                    if c["channel_name"] == channel:
                        return dict(c)
        return None

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.data, ignore_errors=True)


def auth_server(topic_pattern: str, secret: str = "good") -> http.server.ThreadingHTTPServer:
    """An nsqd auth endpoint on loopback: ``secret`` may publish and subscribe to topics
    matching ``topic_pattern``; any other secret is refused (403).  ``shutdown()`` it."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            good = f"secret={secret}" in self.path
            body = json.dumps(
                {
                    "ttl": 3600,
                    "identity": "tester",
                    "identity_url": "",
                    "authorizations": [
                        {
                            "topic": topic_pattern,
                            "channels": [".*"],
                            "permissions": ["subscribe", "publish"],
                        }
                    ],
                }
            ).encode()
            self.send_response(200 if good else 403)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body) if good else 0))
            self.end_headers()
            if good:
                self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def channel_stats(http: str, topic: str, channel: str) -> dict[str, Any]:
    """One channel's entry of the ``/stats`` of the nsqd (real or emulated) whose HTTP address
    is ``http``."""
    with urllib.request.urlopen(f"http://{http}/stats?format=json&topic={topic}") as r:
        data = json.load(r)
    (t,) = [t for t in data["topics"] if t["topic_name"] == topic]
    (c,) = [c for c in t["channels"] if c["channel_name"] == channel]
    return dict(c)
