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
import urllib.request
from typing import Any

from .net import free_port, wait_http

NSQD = os.environ.get("NSQD") or shutil.which("nsqd")
NSQLOOKUPD = os.environ.get("NSQLOOKUPD") or shutil.which("nsqlookupd")
MISSING = "no real nsqd/nsqlookupd: set NSQD and NSQLOOKUPD to the binaries to run these"


class Process:
    """One server process that can be killed, frozen and started again as it was."""

    def __init__(self, argv: list[str], ping: str) -> None:
        self.argv = argv
        self.ping = ping
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            self.argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            wait_http(self.ping)
        except BaseException:
            self.stop()  # never leave a server behind
            raise

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def freeze(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


class Lookupd(Process):
    def __init__(self) -> None:
        assert NSQLOOKUPD
        self.tcp, self.http = free_port(), free_port()
        super().__init__(
            [
                NSQLOOKUPD,
                f"--tcp-address=127.0.0.1:{self.tcp}",
                f"--http-address=127.0.0.1:{self.http}",
            ],
            f"http://127.0.0.1:{self.http}/ping",
        )

    @property
    def http_address(self) -> str:
        return f"127.0.0.1:{self.http}"


class Nsqd(Process):
    """Every acknowledged publish reaches the disk before the OK (``--mem-queue-size=0
    --sync-every=1``), so a kill -9 loses only what nsqd held in memory: in-flight messages."""

    def __init__(self, *extra: str, lookupd: Lookupd | None = None) -> None:
        assert NSQD
        self.tcp, self.http = free_port(), free_port()
        self.data = tempfile.mkdtemp(prefix="nsqd-fault-")
        argv = [
            NSQD,
            f"--tcp-address=127.0.0.1:{self.tcp}",
            f"--http-address=127.0.0.1:{self.http}",
            "--https-address=",
            "--broadcast-address=127.0.0.1",
            f"--data-path={self.data}",
            "--mem-queue-size=0",
            "--sync-every=1",
            *extra,
        ]
        if lookupd is not None:
            argv.append(f"--lookupd-tcp-address=127.0.0.1:{lookupd.tcp}")
        super().__init__(argv, f"http://127.0.0.1:{self.http}/ping")

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
