"""A loopback TCP proxy that puts network faults between a client and a server (anyio: asyncio
or trio; the ``anyio`` extra).

It sits between a client and any nsqd, real or emulated, and moves bytes both ways; each
direction can be changed while connections are open:

.. code-block:: python

    async with FaultProxy("127.0.0.1:4150") as proxy:
        client = Producer(nsqd_tcp_addresses=[proxy.address])
        proxy.delay(0.025)                 # 25 ms each way: a 50 ms round trip
        proxy.half_open()                  # no byte moves either way; sockets stay open
        proxy.trickle(3, 0.01)             # 3 bytes at a time, every 10 ms
        proxy.heal()                       # a plain pipe again (held bytes go on)
        proxy.reset()                      # RST every open connection, on both sides
        proxy.reset_after(20, "to_client") # 20 more bytes to the client, then RST (mid-frame)

``direction`` is ``"to_server"``, ``"to_client"`` or None (both).  A delay is a delay line, not
a stop-and-wait: every chunk read is written ``seconds`` later, in order, while the next ones
are read meanwhile, so the throughput stays what the two ends allow.  Half-open stops reading
and writing in that direction: the other end's writes fill the kernel's buffers, as with a
frozen host.  A reset closes both sockets with ``SO_LINGER`` 0: each end reads
``ECONNRESET``, not an end of stream.  ``proxy.connections`` holds a
:class:`ProxiedConnection` per connection accepted, with its bytes and when each end closed
(seen even while half-open, on Linux).

``python -m nsq_emulator.proxy UPSTREAM [--delay SECONDS] [--port PORT]`` runs one from a
shell until stopped; its first line of output is ``address=HOST:PORT``.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import signal
import socket
import struct
import sys
from dataclasses import dataclass, field
from types import TracebackType
from typing import Literal, Self

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

__all__ = ["Direction", "FaultProxy", "ProxiedConnection", "main"]

Direction = Literal["to_server", "to_client"]
_DIRECTIONS: tuple[Direction, Direction] = ("to_server", "to_client")

_IO_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
)
_READ_SIZE = 64 * 1024
#: chunks a direction holds (read, not yet written) before it stops reading
_MAX_CHUNKS = 1024
#: how often a half-open direction looks whether the end it does not read closed
_WATCH_INTERVAL = 0.02
#: Linux TCP states (``tcpi_state``) of a socket whose peer closed or reset it
_TCP_CLOSE = 7
_PEER_CLOSED = frozenset({6, _TCP_CLOSE, 8, 9, 11})


class _End:
    """What a direction's reader read last: the end of the stream, or a reset."""

    def __init__(self, reset: bool) -> None:
        self.reset = reset


#: what a direction's reader hands its writer: when it is due, and the bytes (or the end)
_Chunk = tuple[float, bytes | _End]


@dataclass
class _Faults:
    """One direction's faults."""

    delay: float = 0.0
    halted: bool = False
    trickle: tuple[int, float] | None = None
    #: bytes still allowed through before a reset (None: no reset armed)
    reset_after: int | None = None


@dataclass(eq=False)
class ProxiedConnection:
    """One connection through the proxy, for inspection (times on the loop's clock)."""

    #: 1 for the first connection accepted, 2 for the next...
    number: int
    opened_at: float
    bytes_to_server: int = 0
    bytes_to_client: int = 0
    #: when the proxy saw the client's end close (end of stream or reset), and whether reset
    client_closed_at: float | None = None
    client_reset: bool = False
    #: the same for the server's end (a refused connection to the server is a reset)
    server_closed_at: float | None = None
    server_reset: bool = False
    #: when the proxy reset it (:meth:`reset`, :meth:`FaultProxy.reset_after`, or one end's
    #: reset passed on to the other)
    reset_at: float | None = None
    #: when both sockets were closed
    closed_at: float | None = None
    _scope: anyio.CancelScope | None = field(default=None, repr=False)
    _resetting: bool = field(default=False, repr=False)

    @property
    def open(self) -> bool:
        return self.closed_at is None

    def reset(self) -> None:
        """Reset this connection now: both ends read ``ECONNRESET``."""
        if self.closed_at is None:
            self._resetting = True
            if self._scope is not None:
                self._scope.cancel()

    def _closed(self, end: str, now: float, reset: bool) -> None:
        if end == "client" and self.client_closed_at is None:
            self.client_closed_at, self.client_reset = now, reset
        elif end == "server" and self.server_closed_at is None:
            self.server_closed_at, self.server_reset = now, reset

    def _count(self, direction: Direction, n: int) -> None:
        if direction == "to_server":
            self.bytes_to_server += n
        else:
            self.bytes_to_client += n


class FaultProxy:
    """A TCP proxy on ``host:port`` (0: a free port) to ``upstream`` (``host:port``).

    ``async with`` it to serve; :attr:`address` is where clients connect.  The fault
    methods are called from the proxy's event loop, and apply at once to open connections
    and to those accepted later.
    """

    def __init__(self, upstream: str, *, host: str = "127.0.0.1", port: int = 0) -> None:
        upstream_host, sep, upstream_port = upstream.rpartition(":")
        if not sep or not upstream_host or not upstream_port.isdigit():
            raise ValueError(f"upstream must be host:port, not {upstream!r}")
        self.upstream = upstream
        self._upstream = (upstream_host.strip("[]"), int(upstream_port))
        self._host = host
        self._port = port
        self._faults = {d: _Faults() for d in _DIRECTIONS}
        self._changed: anyio.Event | None = None
        self._exit: contextlib.AsyncExitStack | None = None
        #: every connection accepted, in order
        self.connections: list[ProxiedConnection] = []
        #: ``host:port`` clients connect to (once serving)
        self.address = ""

    # ------------------------------------------------------------------ faults

    def delay(self, seconds: float, direction: Direction | None = None) -> None:
        """Write every chunk ``seconds`` after it was read (0: at once)."""
        if not seconds >= 0 or math.isinf(seconds):
            raise ValueError(f"the delay must be a finite number of seconds >= 0, not {seconds}")
        for faults in self._select(direction):
            faults.delay = float(seconds)
        self._notify()

    def half_open(self, direction: Direction | None = None) -> None:
        """Move no byte (read nothing, write nothing); the sockets stay open."""
        for faults in self._select(direction):
            faults.halted = True
        self._notify()

    def trickle(
        self, nbytes: int = 3, interval: float = 0.01, direction: Direction | None = None
    ) -> None:
        """Write at most ``nbytes`` at a time, ``interval`` seconds apart."""
        if nbytes < 1 or not interval >= 0:
            raise ValueError(
                f"trickle takes nbytes >= 1 and interval >= 0, not {nbytes}, {interval}"
            )
        for faults in self._select(direction):
            faults.trickle = (nbytes, float(interval))
        self._notify()

    def reset_after(self, nbytes: int, direction: Direction) -> None:
        """Let ``nbytes`` more bytes through in ``direction`` (over every connection), then
        reset the connection the next byte would have gone on (once)."""
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, not {nbytes}")
        self._faults[direction].reset_after = nbytes
        self._notify()

    def reset(self) -> None:
        """Reset every open connection now (both ends read ``ECONNRESET``)."""
        for conn in self.connections:
            conn.reset()

    def heal(self, direction: Direction | None = None) -> None:
        """A plain pipe again: no delay, no half-open, no trickle, no reset armed (what was
        held goes on, in order)."""
        for faults in self._select(direction):
            faults.delay, faults.halted, faults.trickle, faults.reset_after = 0.0, False, None, None
        self._notify()

    # ------------------------------------------------------------------ counters

    @property
    def open_connections(self) -> int:
        return sum(1 for conn in self.connections if conn.open)

    @property
    def bytes_to_server(self) -> int:
        return sum(conn.bytes_to_server for conn in self.connections)

    @property
    def bytes_to_client(self) -> int:
        return sum(conn.bytes_to_client for conn in self.connections)

    # ------------------------------------------------------------------ serving

    async def __aenter__(self) -> Self:
        async with contextlib.AsyncExitStack() as stack:
            multi = await anyio.create_tcp_listener(local_host=self._host, local_port=self._port)
            stack.push_async_callback(multi.aclose)
            port = multi.extra(anyio.abc.SocketAttribute.local_port)
            host = f"[{self._host}]" if ":" in self._host else self._host
            self.address = f"{host}:{port}"
            self._changed = anyio.Event()
            tg = await stack.enter_async_context(anyio.create_task_group())
            tg.start_soon(multi.serve, self._handle)
            stack.callback(tg.cancel_scope.cancel)
            self._exit = stack.pop_all()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        assert self._exit is not None
        exit_stack, self._exit = self._exit, None
        return await exit_stack.__aexit__(exc_type, exc, tb)

    def _select(self, direction: Direction | None) -> list[_Faults]:
        if direction is None:
            return list(self._faults.values())
        if direction not in self._faults:
            raise ValueError(
                f"direction must be 'to_server', 'to_client' or None, not {direction!r}"
            )
        return [self._faults[direction]]

    def _notify(self) -> None:
        """Wake every direction waiting for a change."""
        if self._changed is not None:
            self._changed.set()
            self._changed = anyio.Event()

    async def _changes(self, timeout: float = math.inf) -> None:
        """Return at the next change of a fault (or after ``timeout``)."""
        assert self._changed is not None
        with anyio.move_on_after(timeout):
            await self._changed.wait()

    async def _handle(self, client: anyio.abc.SocketStream) -> None:
        now = anyio.current_time()
        conn = ProxiedConnection(number=len(self.connections) + 1, opened_at=now)
        self.connections.append(conn)
        try:
            server: anyio.abc.SocketStream = await anyio.connect_tcp(*self._upstream)
        except OSError:
            conn._closed("server", anyio.current_time(), True)
            conn.reset_at = anyio.current_time()
            await _close(client, reset=True)
            conn.closed_at = anyio.current_time()
            return
        lines: list[MemoryObjectSendStream[_Chunk] | MemoryObjectReceiveStream[_Chunk]] = []
        try:
            async with anyio.create_task_group() as tg:
                conn._scope = tg.cancel_scope
                if conn._resetting:
                    tg.cancel_scope.cancel()
                ways: list[tuple[Direction, anyio.abc.SocketStream, anyio.abc.SocketStream]] = [
                    ("to_server", client, server),
                    ("to_client", server, client),
                ]
                for direction, source, sink in ways:
                    # the direction's delay line: (when due, what was read)
                    send, receive = anyio.create_memory_object_stream[_Chunk](_MAX_CHUNKS)
                    lines += [send, receive]
                    tg.start_soon(self._read, conn, direction, source, send)
                    tg.start_soon(self._write, conn, direction, receive, sink)
        finally:
            for line in lines:
                line.close()
            reset = conn._resetting
            if reset and conn.reset_at is None:
                conn.reset_at = anyio.current_time()
            with anyio.CancelScope(shield=True):
                await _close(client, reset=reset)
                await _close(server, reset=reset)
            conn.closed_at = anyio.current_time()

    async def _read(
        self,
        conn: ProxiedConnection,
        direction: Direction,
        source: anyio.abc.SocketStream,
        chunks: MemoryObjectSendStream[_Chunk],
    ) -> None:
        """Read ``source`` into the direction's delay line, until its end or a reset."""
        end = "client" if direction == "to_server" else "server"
        faults = self._faults[direction]
        async with chunks:
            while True:
                while faults.halted:
                    # read nothing; but see the end close (the kernel's TCP state, on Linux)
                    await self._changes(_WATCH_INTERVAL)
                    state = _tcp_state(source)
                    if state in _PEER_CLOSED:
                        conn._closed(end, anyio.current_time(), state == _TCP_CLOSE)
                item: bytes | _End
                try:
                    item = await source.receive(_READ_SIZE)
                except anyio.EndOfStream:
                    item = _End(reset=False)
                except _IO_ERRORS:
                    item = _End(reset=True)
                now = anyio.current_time()
                if isinstance(item, _End):
                    conn._closed(end, now, item.reset)
                await chunks.send((now + faults.delay, item))
                if isinstance(item, _End):
                    return

    async def _write(
        self,
        conn: ProxiedConnection,
        direction: Direction,
        chunks: MemoryObjectReceiveStream[_Chunk],
        sink: anyio.abc.SocketStream,
    ) -> None:
        """Write the direction's delay line to ``sink``, each chunk once it is due."""
        faults = self._faults[direction]
        end = "server" if direction == "to_server" else "client"
        async with chunks:
            async for due, item in chunks:
                await anyio.sleep_until(due)
                while faults.halted:
                    await self._changes()
                if isinstance(item, _End):
                    if item.reset:
                        conn.reset()
                        return
                    with contextlib.suppress(*_IO_ERRORS):
                        await sink.send_eof()
                    return
                data = item
                while data:
                    while faults.halted:
                        await self._changes()
                    piece = data
                    if faults.trickle is not None:
                        piece = piece[: faults.trickle[0]]
                    armed = faults.reset_after
                    if armed is not None:
                        if armed == 0:
                            faults.reset_after = None
                            conn.reset()
                            return
                        piece = piece[:armed]
                        faults.reset_after = armed - len(piece)
                    try:
                        await sink.send(piece)
                    except _IO_ERRORS:
                        conn._closed(end, anyio.current_time(), True)
                        conn.reset()
                        return
                    conn._count(direction, len(piece))
                    data = data[len(piece) :]
                    if faults.trickle is not None and data:
                        await anyio.sleep(faults.trickle[1])


async def _close(stream: anyio.abc.SocketStream, *, reset: bool) -> None:
    if reset:
        with contextlib.suppress(OSError):
            raw = stream.extra(anyio.abc.SocketAttribute.raw_socket)
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(*_IO_ERRORS):
        await stream.aclose()


def _tcp_state(stream: anyio.abc.SocketStream) -> int | None:
    """The socket's TCP state on Linux (``tcpi_state``); None where it cannot be read."""
    tcp_info = getattr(socket, "TCP_INFO", None)
    if tcp_info is None or not sys.platform.startswith("linux"):
        return None
    try:
        raw = stream.extra(anyio.abc.SocketAttribute.raw_socket)
        return raw.getsockopt(socket.IPPROTO_TCP, tcp_info, 1)[0]
    except (OSError, anyio.TypedAttributeLookupError):
        return None


def main(argv: list[str] | None = None) -> int:
    """``python -m nsq_emulator.proxy``: one proxy until SIGINT or SIGTERM."""
    parser = argparse.ArgumentParser(
        prog="python -m nsq_emulator.proxy", description="A loopback TCP proxy with a delay."
    )
    parser.add_argument("upstream", help="host:port to proxy to")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: a free port")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds each way")
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    args = parser.parse_args(argv)

    try:
        proxy = FaultProxy(args.upstream, host=args.host, port=args.port)
        proxy.delay(args.delay)
    except ValueError as exc:
        parser.error(str(exc))

    async def serve() -> None:
        async with proxy:
            print(f"address={proxy.address}", flush=True)
            with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for _ in signals:
                    return

    anyio.run(serve, backend=args.backend)
    return 0


if __name__ == "__main__":
    sys.exit(main())
