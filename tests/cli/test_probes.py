"""The worker's HTTP endpoint (nsq_cli._probes) on its own: what a failing accept or a flood
of connections does to it."""

from __future__ import annotations

import errno
import socket
from typing import Any

import anyio
import anyio.abc
import pytest

from nsq_cli import _probes

pytestmark = pytest.mark.anyio


def _get(port: int, path: str) -> tuple[int, bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        data = b""
        while chunk := sock.recv(4096):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


class _FailingAccepts(anyio.abc.Listener[anyio.abc.SocketStream]):
    """A real listener whose first ``failures`` accepts fail as a process out of descriptors
    sees them fail."""

    def __init__(self, inner: anyio.abc.Listener[anyio.abc.SocketStream], failures: int) -> None:
        self.inner = inner
        self.failures = failures

    async def accept(self) -> anyio.abc.SocketStream:
        if self.failures:
            self.failures -= 1
            raise OSError(errno.EMFILE, "Too many open files")
        return await self.inner.accept()  # type: ignore[attr-defined,no-any-return]

    async def serve(self, handler: Any, task_group: Any = None) -> None:
        raise AssertionError("the probes accept one by one")

    async def aclose(self) -> None:
        await self.inner.aclose()

    @property
    def extra_attributes(self) -> Any:
        return self.inner.extra_attributes


async def test_a_failing_accept_is_logged_and_the_probes_go_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    listener = await _probes.listen("127.0.0.1", 0)
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    probes = _probes.Probes(lambda: (True, "ok"), None)
    async with anyio.create_task_group() as tg:
        tg.start_soon(probes.serve, _FailingAccepts(listener.listeners[0], 3))  # type: ignore[attr-defined]
        status, body = await anyio.to_thread.run_sync(_get, port, "/healthz")
        tg.cancel_scope.cancel()
    assert (status, body) == (200, b"ok\n")
    failures = [r for r in caplog.records if "accepting" in r.getMessage()]
    assert failures and "Too many open files" in failures[0].getMessage()
    assert len(failures) == 1  # said once, not once per failure


async def test_connections_over_the_limit_are_closed_and_the_rest_answered() -> None:
    listener = await _probes.listen("127.0.0.1", 0)
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    probes = _probes.Probes(lambda: (True, "ok"), None)
    silent: list[socket.socket] = []
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(probes.serve, listener)
            # silent clients up to the limit and beyond: each holds a connection open
            for _ in range(_probes.MAX_CONNECTIONS + 20):
                silent.append(socket.create_connection(("127.0.0.1", port), timeout=10))
            with anyio.fail_after(30):
                while probes.open < _probes.MAX_CONNECTIONS:
                    await anyio.sleep(0.01)

            def closed_at_once(sock: socket.socket) -> bool:
                sock.settimeout(5)
                try:
                    return sock.recv(1) == b""
                except (TimeoutError, ConnectionResetError):
                    return False

            # those over the limit were closed at once; the worker holds no more than its limit
            over = await anyio.to_thread.run_sync(lambda: closed_at_once(silent[-1]))
            assert over
            assert probes.open == _probes.MAX_CONNECTIONS
            # once the silent ones go, the probes answer again
            for sock in silent:
                sock.close()
            with anyio.fail_after(30):
                while probes.open:
                    await anyio.sleep(0.01)
            status, body = await anyio.to_thread.run_sync(_get, port, "/healthz")
            tg.cancel_scope.cancel()
    finally:
        for sock in silent:
            sock.close()
    assert (status, body) == (200, b"ok\n")
