"""A loopback TCP relay that finds which process opened each connection before it moves one
byte: a test that must know who connects to a server (the driver or an executor of a Spark
cluster) asks the relay instead of sampling ``/proc`` and hoping to see a connection of a few
milliseconds.

The client's connection is accepted but not relayed while its owner is looked up: an NSQ
client has sent its magic and ``IDENTIFY`` and waits for the answer, so its socket is still
open however long the walk of ``/proc`` takes."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterable

from .net import live_processes, socket_inodes, tcp_sockets

__all__ = ["ConnectionGate", "below", "process_tree"]


def process_tree() -> dict[int, list[int]]:
    """pid -> its live children, from one walk of /proc."""
    children: dict[int, list[int]] = {}
    for pid, fields in live_processes():
        children.setdefault(int(fields[1]), []).append(pid)
    return children


def below(children: dict[int, list[int]], pid: int) -> set[int]:
    """``pid`` and every process below it in ``children`` (a :func:`process_tree`)."""
    found, todo = set(), [pid]
    while todo:
        p = todo.pop()
        found.add(p)
        todo.extend(children.get(p, ()))
    return found


def _client_inode(client_port: int, server_port: int) -> int | None:
    """The inode of the client end of the established connection ``client_port`` ->
    ``server_port`` (None when it is gone)."""
    for state, local, far, inode in tcp_sockets(("/proc/net/tcp",)):
        if state == "01" and local == client_port and far == server_port and inode:
            return inode
    return None


class ConnectionGate:
    """Listens on a loopback port of its own (``address``) and relays each connection to
    ``upstream`` once ``owner(pid)`` was called with the process holding its client end
    (``pid`` None when no process of ``candidates()`` holds it: gone already, or another
    one's).  ``candidates`` names the processes to look in: the last owners are looked at
    first, then all of them."""

    def __init__(
        self,
        upstream: str,
        candidates: Callable[[], Iterable[int]],
        owner: Callable[[int | None], None],
    ) -> None:
        host, _, port = upstream.rpartition(":")
        self._upstream = (host, int(port))
        self._candidates = candidates
        self._owner = owner
        self._owners: list[int] = []  # the last processes found, looked at first
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _find(self, client_port: int) -> int | None:
        inode = _client_inode(client_port, self.port)
        if inode is None:
            return None
        for pid in self._owners:
            if inode in socket_inodes(pid):
                return pid
        for pid in self._candidates():
            if inode in socket_inodes(pid):
                self._owners = [pid, *self._owners[:15]]
                return pid
        return None

    def _accept(self) -> None:
        while True:
            try:
                client, (_host, port) = self._listener.accept()
            except OSError:
                return
            try:
                pid = self._find(port)
            except OSError:  # /proc changed under the walk: the owner is not known
                pid = None
            self._owner(pid)
            try:
                server = socket.create_connection(self._upstream, timeout=10)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                if self._closed:
                    client.close()
                    server.close()
                    return
                self._open |= {client, server}
            ends = [2]  # the directions still moving
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(source, sink, ends), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, ends: list[int]) -> None:
        """Moves bytes one way until the end of the stream (passed on) or an error (both
        ways stopped); the last direction to end closes both sockets."""
        try:
            while chunk := source.recv(65536):
                sink.sendall(chunk)
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        with self._lock:
            ends[0] -= 1
            if ends[0] or not {source, sink} <= self._open:
                return
            self._open -= {source, sink}
        source.close()
        sink.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            sockets, self._open = self._open, set()
        self._listener.close()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
