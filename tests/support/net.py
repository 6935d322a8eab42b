"""Loopback helpers: a free port, waiting until an HTTP server answers, one plain HTTP call."""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_ports(n: int) -> list[int]:
    """``n`` distinct free ports (each socket is held until all are chosen: ``free_port()``
    called twice may give the same port, since nothing is bound to it in between)."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for s in sockets:
            s.close()


def wait_http(url: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                if response.status == 200:
                    return
        except urllib.error.HTTPError:
            return  # it answers (an nsqd requiring TLS refuses plain HTTP with 403)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def http(method: str, url: str, body: bytes | None = None) -> tuple[int, bytes]:
    """The status and body of one request (an HTTP error status is an answer, not raised)."""
    request = urllib.request.Request(url, data=body, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
