"""Serve the :mod:`nsq_emulator` on loopback TCP with anyio (asyncio or trio; the ``anyio``
extra).

The emulator decides everything; this host only accepts connections, moves bytes both ways,
runs the server side of TLS when a connection asks for it, and calls the emulator's timers on
the loop's clock.  ``python -m nsq_emulator`` serves it from a shell.

.. code-block:: python

    async with serve_emulator(nsqd_count=2, lookupd=True) as cluster:
        cluster.nsqd_tcp_addresses      # ["127.0.0.1:40123", ...]
        cluster.lookupd_http_addresses  # ["127.0.0.1:40125"]
        cluster.nsqds[0].channel_stats("topic", "channel")
"""

from __future__ import annotations

import contextlib
import functools
import math
import ssl
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from typing import Any

import anyio
import anyio.abc
from anyio.streams.tls import TLSStream

from ._http import HttpServerConnection
from ._lookupd import Lookupd
from ._nsqd import Nsqd
from ._options import NsqdOptions
from ._protocol import NsqdConnection

__all__ = ["EmulatorCluster", "serve_emulator"]

_IO_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    ssl.SSLError,
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
    anyio.EndOfStream,
)


@dataclass(eq=False)
class _Client:
    conn: NsqdConnection
    stream: anyio.abc.ByteStream
    read_scope: anyio.CancelScope | None = None
    upgrading: bool = False
    done: bool = False


@dataclass
class EmulatorCluster:
    """The emulated servers and where they listen."""

    nsqds: list[Nsqd]
    lookupds: list[Lookupd]
    nsqd_tcp_addresses: list[str] = field(default_factory=list)
    nsqd_http_addresses: list[str] = field(default_factory=list)
    lookupd_http_addresses: list[str] = field(default_factory=list)
    _wake: Callable[[], None] = field(default=lambda: None, repr=False)

    def now(self) -> float:
        return anyio.current_time()

    def kick(self) -> None:
        """Flush output after a change made directly on an emulator (fault injection...)."""
        self._wake()


class _Host:
    def __init__(self, cluster: EmulatorCluster, tls_context: ssl.SSLContext | None) -> None:
        self.cluster = cluster
        self.tls_context = tls_context
        self.clients: dict[NsqdConnection, _Client] = {}
        self._wake_event = anyio.Event()

    def wake(self) -> None:
        self._wake_event.set()

    async def flusher(self) -> None:
        while True:
            self._wake_event = anyio.Event()
            now = anyio.current_time()
            for nsqd in self.cluster.nsqds:
                nsqd.handle_timer(now)
            await self._flush()
            deadlines = [d for n in self.cluster.nsqds if (d := n.next_deadline()) is not None]
            if self._wake_event.is_set():
                continue
            deadline = min(deadlines, default=math.inf)
            with anyio.CancelScope(deadline=deadline):
                await self._wake_event.wait()

    async def _flush(self) -> None:
        for client in list(self.clients.values()):
            if client.done or client.upgrading:
                continue
            data = client.conn.data_to_send()
            if data:
                try:
                    await client.stream.send(data)
                except _IO_ERRORS:
                    await self._drop(client)
                    continue
            if client.conn.tls_requested and self.tls_context is not None:
                client.upgrading = True
                if client.read_scope is not None:
                    client.read_scope.cancel()
            elif client.conn.closed:
                await self._drop(client)

    async def _drop(self, client: _Client) -> None:
        if client.done:
            return
        client.done = True
        self.clients.pop(client.conn, None)
        if client.read_scope is not None:
            client.read_scope.cancel()
        with anyio.CancelScope(shield=True), contextlib.suppress(*_IO_ERRORS):
            await client.stream.aclose()
        client.conn.connection_lost(anyio.current_time())
        self.wake()

    async def serve_tcp(self, nsqd: Nsqd, stream: anyio.abc.SocketStream) -> None:
        try:
            remote = stream.extra(anyio.abc.SocketAttribute.remote_address)
            address = f"{remote[0]}:{remote[1]}" if isinstance(remote, tuple) else str(remote)
            conn = nsqd.accept(anyio.current_time(), remote_address=address)
        except ConnectionRefusedError:
            await stream.aclose()
            return
        client = _Client(conn, stream)
        self.clients[conn] = client
        self.wake()
        try:
            await self._client_loop(nsqd, conn, client)
        finally:
            if not client.done:
                await self._drop(client)

    async def _client_loop(self, nsqd: Nsqd, conn: NsqdConnection, client: _Client) -> None:
        while not client.done:
            if client.upgrading:
                assert self.tls_context is not None
                try:
                    client.stream = await TLSStream.wrap(
                        client.stream,
                        server_side=True,
                        ssl_context=self.tls_context,
                        standard_compatible=False,
                    )
                except _IO_ERRORS:
                    await self._drop(client)
                    return
                client.upgrading = False
                conn.tls_established(anyio.current_time())
                self.wake()
                continue
            with anyio.CancelScope() as scope:
                client.read_scope = scope
                try:
                    data = await client.stream.receive(256 * 1024)
                except anyio.EndOfStream:
                    conn.receive_data(b"", anyio.current_time())
                    await self._drop(client)
                    return
                except _IO_ERRORS:
                    await self._drop(client)
                    return
                finally:
                    client.read_scope = None
                conn.receive_data(data, anyio.current_time())
                self.wake()

    async def serve_http(
        self, make: Callable[[float], HttpServerConnection], stream: anyio.abc.SocketStream
    ) -> None:
        async with stream:
            try:
                http = make(anyio.current_time())
            except ConnectionRefusedError:
                return
            while not http.closed:
                try:
                    data = await stream.receive(256 * 1024)
                except anyio.EndOfStream:
                    data = b""
                except _IO_ERRORS:
                    return
                http.receive_data(data, anyio.current_time())
                out = http.data_to_send()
                self.wake()  # a /pub may have messages to deliver
                if out:
                    try:
                        await stream.send(out)
                    except _IO_ERRORS:
                        return
                if not data:
                    return


async def _listen(host: str, port: int) -> anyio.abc.SocketListener:
    multi = await anyio.create_tcp_listener(local_host=host, local_port=port)
    listener = multi.listeners[0]
    assert isinstance(listener, anyio.abc.SocketListener)
    return listener


def _port(listener: anyio.abc.SocketListener) -> int:
    return int(listener.extra(anyio.abc.SocketAttribute.local_port))


@contextlib.asynccontextmanager
async def serve_emulator(
    *,
    nsqd_count: int = 1,
    lookupd: bool = True,
    host: str = "127.0.0.1",
    tcp_ports: list[int] | None = None,
    http_ports: list[int] | None = None,
    lookupd_http_port: int = 0,
    tls_context: ssl.SSLContext | None = None,
    nsqd_options: dict[str, Any] | None = None,
) -> AsyncIterator[EmulatorCluster]:
    """Run ``nsqd_count`` emulated nsqd (and one lookupd they register with) on loopback.

    ``tls_context`` is a server-side context (the emulated nsqd then offers TLS);
    ``nsqd_options`` are :class:`nsq_emulator.NsqdOptions` fields.
    """
    listeners: list[anyio.abc.SocketListener] = []
    nsqds: list[Nsqd] = []
    lookupds: list[Lookupd] = []
    cluster = EmulatorCluster(nsqds, lookupds)
    host_obj = _Host(cluster, tls_context)
    cluster._wake = host_obj.wake
    now = anyio.current_time()
    try:
        lookupd_listener = None
        if lookupd:
            lookupd_listener = await _listen(host, lookupd_http_port)
            listeners.append(lookupd_listener)
            lk = Lookupd(broadcast_address=host, http_port=_port(lookupd_listener))
            lk.set_wall_clock(time.time(), anyio.current_time())
            lookupds.append(lk)
            cluster.lookupd_http_addresses.append(f"{host}:{_port(lookupd_listener)}")
        pairs = []
        for i in range(nsqd_count):
            tcp = await _listen(host, tcp_ports[i] if tcp_ports else 0)
            http = await _listen(host, http_ports[i] if http_ports else 0)
            listeners += [tcp, http]
            options = NsqdOptions(**(nsqd_options or {}))
            options = replace(
                options,
                broadcast_address=host,
                tcp_port=_port(tcp),
                http_port=_port(http),
                tls=tls_context is not None or options.tls,
            )
            nsqd = Nsqd(options, now=now)
            # (read together: the listeners took time since ``now``)
            nsqd.set_wall_clock(time.time(), anyio.current_time())  # unless options fix it
            for lk in lookupds:
                lk.register(nsqd)
            nsqds.append(nsqd)
            pairs.append((nsqd, tcp, http))
            cluster.nsqd_tcp_addresses.append(f"{host}:{_port(tcp)}")
            cluster.nsqd_http_addresses.append(f"{host}:{_port(http)}")
        async with anyio.create_task_group() as tg:
            tg.start_soon(host_obj.flusher)
            for nsqd, tcp, http in pairs:
                tg.start_soon(_serve, tcp, functools.partial(host_obj.serve_tcp, nsqd))
                tg.start_soon(
                    _serve, http, functools.partial(host_obj.serve_http, nsqd.http_connection)
                )
            if lookupd_listener is not None:
                tg.start_soon(
                    _serve,
                    lookupd_listener,
                    functools.partial(host_obj.serve_http, lookupds[0].http_connection),
                )
            try:
                yield cluster
            finally:
                tg.cancel_scope.cancel()
    finally:
        for listener in listeners:
            with contextlib.suppress(*_IO_ERRORS):
                await listener.aclose()


async def _serve(listener: anyio.abc.SocketListener, handler: Callable[[Any], Any]) -> None:
    async with anyio.create_task_group() as tg:
        while True:
            try:
                stream = await listener.accept()
            except _IO_ERRORS:
                return
            tg.start_soon(handler, stream)
