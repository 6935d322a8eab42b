"""Loopback helpers: a free port, waiting until an HTTP server answers, starting a server
process on ports of its own, one plain HTTP call."""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any


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


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1):
            return True
    except urllib.error.HTTPError:
        return True  # an answer all the same (an nsqd requiring TLS refuses plain HTTP)
    except OSError:
        return False


class PortTaken(RuntimeError):
    """A server process ended before it listened: another process bound one of its ports
    between the moment they were chosen and the server's own bind."""


def tcp_sockets(
    tables: Sequence[str] = ("/proc/net/tcp", "/proc/net/tcp6"),
) -> Iterator[tuple[str, int, int, int]]:
    """``(state, local port, remote port, inode)`` of each TCP socket of this network
    namespace (state ``0A``: listening, ``01``: established; inode 0: no socket any more,
    as in TIME_WAIT)."""
    for table in tables:
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10:
                continue
            local = int(fields[1].rpartition(":")[2], 16)
            remote = int(fields[2].rpartition(":")[2], 16)
            yield fields[3], local, remote, int(fields[9])


def live_processes() -> Iterator[tuple[int, list[str]]]:
    """``(pid, the fields of /proc/PID/stat after the command's name)`` of each process that
    is not a zombie (field 0 the state, 1 the parent, 3 the session)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            yield int(entry.name), fields


def socket_inodes(pid: int) -> set[int]:
    """The inodes of the sockets process ``pid`` holds (none when it is gone)."""
    held: set[int] = set()
    try:
        descriptors = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return held
    for fd in descriptors:
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            held.add(int(target[8:-1]))
    return held


def owns_listeners(pid: int, ports: Sequence[int]) -> bool:
    """Whether process ``pid`` holds a listening socket on every one of ``ports``."""
    wanted: dict[int, set[int]] = {port: set() for port in ports}
    for state, local, _remote, inode in tcp_sockets():
        if state == "0A" and local in wanted:
            wanted[local].add(inode)
    if not all(wanted.values()):
        return False
    held = socket_inodes(pid)
    return all(inodes & held for inodes in wanted.values())


def wait_serving(
    proc: subprocess.Popen[Any], url: str, ports: Sequence[int], timeout: float = 10.0
) -> None:
    """Wait until ``proc`` itself listens on ``ports`` and ``url`` answers.  A bare
    ``wait_http`` can be answered by another process (another test's server that took the
    port first, when this one then failed to bind it and exited); this cannot.  Raises
    :class:`PortTaken` when ``proc`` ended first."""
    deadline = time.monotonic() + timeout
    answered = False
    while True:
        code = proc.poll()
        if code is not None:
            raise PortTaken(f"{proc.args!r} ended with status {code} before it listened on {ports}")
        if not answered:
            answered = _answers(url)
        if answered and owns_listeners(proc.pid, ports):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{proc.args!r} did not listen on {ports} within {timeout:g} s")
        time.sleep(0.02)


def start_server(
    argv_for: Callable[[list[int]], list[str]],
    nports: int,
    ping_for: Callable[[list[int]], str],
    *,
    first: Sequence[int] | None = None,
    attempts: int = 5,
    timeout: float = 10.0,
    **popen: Any,
) -> tuple[subprocess.Popen[bytes], list[int]]:
    """Start the server ``argv_for(ports)`` on ``nports`` fresh ports, and wait until it serves
    ``ping_for(ports)`` on them; when another process took one of the ports first, again on
    other ports.  ``first``: the ports of the first attempt (default: fresh ones).  Returns the
    process and its ports."""
    popen.setdefault("stdout", subprocess.DEVNULL)
    popen.setdefault("stderr", subprocess.DEVNULL)
    for attempt in range(attempts):
        ports = list(first) if first is not None and attempt == 0 else free_ports(nports)
        proc = subprocess.Popen(argv_for(ports), **popen)
        try:
            wait_serving(proc, ping_for(ports), ports, timeout)
            return proc, ports
        except PortTaken:
            if attempt == attempts - 1:
                raise
        except BaseException:
            proc.kill()
            proc.wait()
            raise
    raise AssertionError("unreachable")


def http(method: str, url: str, body: bytes | None = None) -> tuple[int, bytes]:
    """The status and body of one request (an HTTP error status is an answer, not raised)."""
    request = urllib.request.Request(url, data=body, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
