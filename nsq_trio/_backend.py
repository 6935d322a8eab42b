"""The trio backend of the shared async client: trio's own streams, SSLStream, nurseries and
clock (so ``trio.testing.MockClock`` drives every timer)."""

from __future__ import annotations

import contextlib
import math
import socket
import struct
from collections.abc import Callable
from typing import Any

import trio
import trio.lowlevel

from nsq_client import Backend, BackendBase, Stream, TaskGroupContext

__all__ = ["TrioBackend", "TrioStream", "BACKEND"]

_READ_SIZE = 256 * 1024


class TrioStream:
    __slots__ = ("raw",)

    def __init__(self, raw: trio.abc.Stream) -> None:
        self.raw = raw

    async def send(self, data: bytes) -> None:
        await self.raw.send_all(data)

    async def receive(self) -> bytes:
        return bytes(await self.raw.receive_some(_READ_SIZE))

    async def aclose(self) -> None:
        await self.raw.aclose()

    async def abort(self) -> None:
        """Close now (:class:`nsq_client.AbortStream`): the socket is reset and closed, what
        was not sent dropped; a TLS stream sends no close_notify (it could wait on the peer),
        its socket is closed below it."""
        raw = self.raw
        transport = raw.transport_stream if isinstance(raw, trio.SSLStream) else raw
        if not isinstance(transport, trio.SocketStream):
            await raw.aclose()
            return
        with contextlib.suppress(OSError):  # closed already
            transport.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        await transport.aclose()


class TrioBackend(BackendBase):
    io_errors: tuple[type[BaseException], ...] = (
        *BackendBase.io_errors,
        trio.BrokenResourceError,
        trio.ClosedResourceError,
    )

    def current_time(self) -> float:
        return trio.current_time()

    def clock(self) -> Callable[[], float]:
        return trio.current_time

    def event(self) -> trio.Event:
        return trio.Event()

    def cancel_scope(self, *, deadline: float = math.inf, shield: bool = False) -> trio.CancelScope:
        return trio.CancelScope(deadline=deadline, shield=shield)

    def task_group(self) -> TaskGroupContext:
        return trio.open_nursery()

    def cancelled_exc_class(self) -> type[BaseException]:
        return trio.Cancelled

    async def checkpoint(self) -> None:
        await trio.lowlevel.checkpoint()

    async def connect_tcp(self, host: str, port: int) -> TrioStream:
        return TrioStream(await trio.open_tcp_stream(host, port))

    async def start_tls(self, stream: Stream, ssl_context: Any, hostname: str | None) -> TrioStream:
        assert isinstance(stream, TrioStream)
        tls = trio.SSLStream(
            stream.raw, ssl_context, server_hostname=hostname, https_compatible=True
        )
        await tls.do_handshake()
        return TrioStream(tls)


BACKEND: Backend = TrioBackend()
