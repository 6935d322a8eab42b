"""The anyio backend of the shared async client: TCP, TLS, events, scopes, the loop clock."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import socket
import struct
import time
from collections.abc import Callable
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel
from anyio.streams.tls import TLSStream

from nsq_client import Backend, BackendBase, EventLike, Stream

from . import _asyncio_stream as asyncio_stream
from ._asyncio_stream import AsyncioStream, LoopEvent

__all__ = ["AnyioBackend", "AnyioStream"]

_READ_SIZE = 256 * 1024


def _asyncio_loop() -> asyncio.AbstractEventLoop | None:
    """The running asyncio loop; None on trio (through anyio)."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class AnyioStream:
    __slots__ = ("raw",)

    def __init__(self, raw: anyio.abc.ByteStream) -> None:
        self.raw = raw

    async def send(self, data: bytes) -> None:
        await self.raw.send(data)

    async def receive(self) -> bytes:
        try:
            return await self.raw.receive(_READ_SIZE)
        except anyio.EndOfStream:
            return b""

    async def aclose(self) -> None:
        await self.raw.aclose()

    async def abort(self) -> None:
        """Close now (:class:`nsq_client.AbortStream`): the socket is reset, what was not
        sent dropped (a TLS stream's close_notify too)."""
        with contextlib.suppress(OSError, anyio.TypedAttributeLookupError):  # closed, not TCP
            raw = self.raw.extra(anyio.abc.SocketAttribute.raw_socket)
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        await self.raw.aclose()  # without waiting for the peer (TLS: standard_compatible=False)


class AnyioBackend(BackendBase):
    io_errors: tuple[type[BaseException], ...] = (
        *BackendBase.io_errors,
        anyio.BrokenResourceError,
        anyio.ClosedResourceError,
        anyio.EndOfStream,
    )

    def current_time(self) -> float:
        return anyio.current_time()

    def clock(self) -> Callable[[], float]:
        """The running loop's clock as a plain callable (what anyio.current_time reads, without
        looking the event loop up on every call)."""
        loop = _asyncio_loop()
        if loop is None:
            import trio  # anyio runs on trio: its clock, which anyio's finds again on each call

            return trio.current_time
        if type(loop).time is asyncio.BaseEventLoop.time:
            # asyncio's own clock is time.monotonic() behind a Python method: the function
            # itself, one frame fewer on every message and publish
            return time.monotonic
        return loop.time  # another loop's own clock (uvloop's)

    def event(self) -> anyio.Event | LoopEvent:
        """On asyncio, an event of the loop's own futures (anyio's wraps asyncio's, four times
        the cost of one, and asyncio's costs more than a future: one on every publish and
        every write); on trio, anyio's (trio's)."""
        loop = _asyncio_loop()
        return anyio.Event() if loop is None else LoopEvent(loop)

    def event_factory(self) -> Callable[[], EventLike]:
        """What :meth:`event` makes, as a callable that looks the loop up once: asking for
        the running loop is a system call on CPython 3.11 (``getpid``), and on trio a
        ``RuntimeError`` raised and caught (there, trio's own event: anyio's wraps one)."""
        loop = _asyncio_loop()
        if loop is None:
            import trio  # anyio runs on trio: the event anyio's wraps, found once

            return trio.Event
        return functools.partial(LoopEvent, loop)

    def cancel_scope(
        self, *, deadline: float = math.inf, shield: bool = False
    ) -> anyio.CancelScope:
        return anyio.CancelScope(deadline=deadline, shield=shield)

    def scope_factory(self) -> Callable[..., Any]:
        """What :meth:`cancel_scope` makes, as a callable that looks the loop up once: on
        trio, trio's own scope (anyio's on trio wraps one, and finds the running library
        again for each); on asyncio, anyio's."""
        if _asyncio_loop() is not None:
            return anyio.CancelScope
        import trio  # anyio runs on trio: the scope anyio's wraps, found once

        return trio.CancelScope

    def task_group(self) -> anyio.abc.TaskGroup:
        return anyio.create_task_group()

    def cancelled_exc_class(self) -> type[BaseException]:
        return anyio.get_cancelled_exc_class()

    async def checkpoint(self) -> None:
        await anyio.lowlevel.checkpoint()

    async def connect_tcp(self, host: str, port: int) -> AnyioStream | AsyncioStream:
        if _asyncio_loop() is not None:
            # straight on the transport: no loop iteration before each write (see the module)
            return await asyncio_stream.connect(host, port)
        return AnyioStream(await anyio.connect_tcp(host, port))

    async def start_tls(
        self, stream: Stream, ssl_context: Any, hostname: str | None
    ) -> AnyioStream | AsyncioStream:
        if isinstance(stream, AsyncioStream):
            return await stream.start_tls(ssl_context, hostname)
        assert isinstance(stream, AnyioStream)
        tls = await TLSStream.wrap(
            stream.raw,
            hostname=hostname,
            server_side=False,
            ssl_context=ssl_context,
            standard_compatible=False,
        )
        return AnyioStream(tls)


BACKEND: Backend = AnyioBackend()
