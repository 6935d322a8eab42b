"""The stream nsq_anyio uses on asyncio, straight on a transport: reads, the end of the
stream, a reset, and flow control both ways, against a loopback peer."""

from __future__ import annotations

import asyncio
import socket
import ssl
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
import trio

import nsq_client
import nsq_client._backend
from nsq_anyio._asyncio_stream import AsyncioStream, LoopEvent, connect
from nsq_anyio._backend import AnyioBackend

pytestmark = pytest.mark.anyio

Peer = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@asynccontextmanager
async def peer(handler: Peer) -> AsyncIterator[int]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    async with server:
        yield server.sockets[0].getsockname()[1]


async def read_all(stream: AsyncioStream) -> bytes:
    chunks = []
    while chunk := await stream.receive():
        chunks.append(chunk)
    return b"".join(chunks)


async def test_a_read_gets_what_arrived_and_the_end_of_the_stream_is_empty_bytes() -> None:
    async def talk(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"one")
        writer.write(b"two")
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.close()

    async with peer(talk) as port:
        stream = await connect("127.0.0.1", port)
        assert await read_all(stream) == b"onetwo"
        assert await stream.receive() == b""  # and again
        await stream.aclose()


async def test_a_reader_that_falls_behind_stops_the_socket_and_loses_nothing() -> None:
    data = bytes(range(256)) * (40 * 1024)  # 10 MiB, over the 4 MiB kept unread

    async def flood(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(data)
        await writer.drain()
        writer.close()

    async with peer(flood) as port:
        stream = await connect("127.0.0.1", port)
        protocol = stream._protocol
        for _ in range(200):  # let it arrive until the stream stops reading
            if protocol.reading_paused:
                break
            await asyncio.sleep(0.01)
        assert protocol.reading_paused
        assert 4 * 1024 * 1024 < protocol.buffered < len(data)
        assert await read_all(stream) == data
        await stream.aclose()


class SlowPeer:
    """A peer that reads nothing until released, then everything until the end."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.done = asyncio.Event()
        self.received = bytearray()

    async def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self.release.wait()
        while chunk := await reader.read(1 << 20):
            self.received.extend(chunk)
        writer.close()
        await writer.wait_closed()
        self.done.set()


async def test_a_peer_that_does_not_read_holds_the_writer_back() -> None:
    slow = SlowPeer()
    block = b"x" * (64 * 1024 * 1024)
    async with peer(slow) as port:
        stream = await connect("127.0.0.1", port)
        send = asyncio.ensure_future(stream.send(block))
        await asyncio.sleep(0.3)
        assert not send.done()  # waiting for the peer, not buffering 64 MiB in memory
        slow.release.set()
        await asyncio.wait_for(send, 30)
        await stream.aclose()
        await asyncio.wait_for(slow.done.wait(), 30)
        assert len(slow.received) == len(block)


async def test_send_nowait_writes_at_once_until_the_peer_falls_behind() -> None:
    slow = SlowPeer()
    async with peer(slow) as port:
        stream = await connect("127.0.0.1", port)
        written = 0
        block = b"y" * (1024 * 1024)
        for _ in range(256):  # until the socket and the transport's buffer are full
            if not stream.send_nowait(block):
                break
            written += len(block)
        else:
            pytest.fail("256 MiB taken without waiting: no flow control")
        assert written > 0
        # refused: nothing of it was written; send waits for the peer instead
        assert not stream.send_nowait(b"z")
        slow.release.set()
        await asyncio.wait_for(stream.send(b"z"), 30)
        assert stream.send_nowait(b"!")
        await stream.aclose()
        await asyncio.wait_for(slow.done.wait(), 30)
        assert len(slow.received) == written + 2
        assert slow.received[-2:] == b"z!"


async def test_send_nowait_after_the_stream_is_closed_is_a_connection_error() -> None:
    done = asyncio.Event()

    async def idle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(100)
        writer.close()
        await writer.wait_closed()
        done.set()

    async with peer(idle) as port:
        stream = await connect("127.0.0.1", port)
        await stream.aclose()
        with pytest.raises(ConnectionResetError, match="closed"):
            stream.send_nowait(b"NOP\n")
        await asyncio.wait_for(done.wait(), 10)


async def test_a_reset_is_an_os_error_for_the_reader_and_the_writer() -> None:
    async def reset(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(100)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()  # closed with a linger of 0: RST

    async with peer(reset) as port:
        stream = await connect("127.0.0.1", port)
        await stream.send(b"hello")
        with pytest.raises(OSError):
            await read_all(stream)
        with pytest.raises(ConnectionResetError, match=r"connection was lost|is closed"):
            await stream.send(b"more")
        await stream.aclose()


async def test_bytes_before_the_tls_handshake_are_refused() -> None:
    done = asyncio.Event()

    async def early(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"not a TLS record")
        await writer.drain()
        await reader.read(100)
        writer.close()
        await writer.wait_closed()
        done.set()

    async with peer(early) as port:
        stream = await connect("127.0.0.1", port)
        for _ in range(200):
            if stream._protocol.chunks:
                break
            await asyncio.sleep(0.01)
        context = ssl.create_default_context()
        with pytest.raises(ConnectionError, match="before the TLS handshake"):
            await stream.start_tls(context, "localhost")
        await stream.aclose()
        await asyncio.wait_for(done.wait(), 5)


class Ends:
    """An ``on_end`` callback that keeps what it was told."""

    def __init__(self) -> None:
        self.errors: list[BaseException | None] = []
        self.ended = asyncio.Event()

    def __call__(self, error: BaseException | None) -> None:
        self.errors.append(error)
        self.ended.set()


async def test_pushing_hands_over_what_waited_then_each_read_then_the_end_once() -> None:
    go_on = asyncio.Event()
    done = asyncio.Event()

    async def talk(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"one")
        await writer.drain()
        await go_on.wait()
        writer.write(b"two")
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(b"three")
        writer.close()
        await writer.wait_closed()
        done.set()

    async with peer(talk) as port:
        stream = await connect("127.0.0.1", port)
        while not stream._protocol.chunks:  # "one" arrived, nobody read it
            await asyncio.sleep(0.01)
        got: list[bytes] = []
        ends = Ends()
        stream.start_pushing(got.append, ends)
        assert got == [b"one"]  # at once, from the call
        go_on.set()
        await asyncio.wait_for(ends.ended.wait(), 10)
        assert b"".join(got) == b"onetwothree" and len(got) >= 2
        assert ends.errors == [None]  # a clean end, told once (the transport closing is not)
        await stream.aclose()
        await asyncio.wait_for(done.wait(), 10)


async def test_after_stop_pushing_what_arrives_waits_for_a_read() -> None:
    go_on = asyncio.Event()

    async def talk(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"pushed")
        await writer.drain()
        await go_on.wait()
        writer.write(b"kept")
        writer.close()
        await writer.wait_closed()

    async with peer(talk) as port:
        stream = await connect("127.0.0.1", port)
        got: list[bytes] = []
        ends: list[BaseException | None] = []
        stream.start_pushing(got.append, ends.append)
        while not got:
            await asyncio.sleep(0.01)
        stream.stop_pushing()
        go_on.set()
        assert await read_all(stream) == b"kept"
        assert got == [b"pushed"] and ends == []
        # pushing again at the end of the stream tells the end at once
        stream.start_pushing(got.append, ends.append)
        assert ends == [None] and got == [b"pushed"]
        await stream.aclose()


async def test_a_reset_while_pushing_ends_with_the_error() -> None:
    async def reset(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(100)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()

    async with peer(reset) as port:
        stream = await connect("127.0.0.1", port)
        ends = Ends()
        stream.start_pushing(lambda data: None, ends)
        await stream.send(b"hello")
        await asyncio.wait_for(ends.ended.wait(), 10)
        assert len(ends.errors) == 1 and isinstance(ends.errors[0], OSError)
        await stream.aclose()


def _loop_event() -> LoopEvent:
    return LoopEvent(asyncio.get_running_loop())


@pytest.mark.parametrize("make", [asyncio.Event, _loop_event], ids=["asyncio.Event", "LoopEvent"])
def test_the_loop_event_behaves_as_asyncio_event(make: Callable[[], Any]) -> None:
    """Set before or after the waits, several waiters, one cancelled alone, set twice: the
    same outcome as asyncio.Event's (the test runs on both)."""

    async def main() -> list[str]:
        seen: list[str] = []
        early = make()
        early.set()
        assert early.is_set() and await early.wait() is True
        event = make()

        async def wait(name: str) -> None:
            await event.wait()
            seen.append(name)

        tasks = [asyncio.create_task(wait(name)) for name in ("a", "b", "c")]
        await asyncio.sleep(0)
        tasks[1].cancel()
        await asyncio.sleep(0)
        assert not event.is_set() and seen == []
        event.set()
        event.set()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert isinstance(results[1], asyncio.CancelledError)
        assert event.is_set() and await event.wait() is True
        return seen

    assert asyncio.run(main()) == ["a", "c"]


@pytest.mark.parametrize("library", ["asyncio", "trio"])
def test_the_backends_event_factory_makes_events_of_the_running_loop(library: str) -> None:
    """What the client makes its per-publish and per-wait events with, once the loop runs:
    events of that loop, as ``event()`` makes them, in each of two runs in one thread."""
    backend = AnyioBackend()
    assert isinstance(backend, nsq_client.EventFactory)
    loops: list[object] = []

    async def main() -> None:
        make = nsq_client._backend.event_factory(backend)
        event = make()
        if library == "trio":
            assert isinstance(event, trio.Event)  # what anyio's wraps there, made directly
        else:
            assert type(event) is type(backend.event())
        if isinstance(event, LoopEvent):
            loops.append(asyncio.get_running_loop())
            assert event._loop is loops[-1]
        got: list[str] = []

        async def wait() -> None:
            await event.wait()
            got.append("woken")

        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            await anyio.sleep(0.01)
            assert got == [] and not event.is_set()
            event.set()
        assert got == ["woken"]

    anyio.run(main, backend=library)
    anyio.run(main, backend=library)
    assert len(loops) == (2 if library == "asyncio" else 0)
    assert library == "trio" or loops[0] is not loops[1]


@pytest.mark.parametrize("library", ["asyncio", "trio"])
def test_the_backends_scope_factory_makes_scopes_that_end_at_their_deadline_and_shield(
    library: str,
) -> None:
    """What the client makes its per-read, per-write and per-pass scopes with, once the loop
    runs: a scope that ends its block at its deadline (a wait then stops there), and a shielded
    one that keeps the cancellation of an enclosing anyio scope out until its block ends."""
    backend = AnyioBackend()
    assert isinstance(backend, nsq_client.ScopeFactory)
    seen: list[object] = []

    async def main() -> None:
        make = nsq_client._backend.scope_factory(backend)
        clock = backend.clock()  # (on trio, trio's own: the clock deadlines are on)
        assert abs(clock() - anyio.current_time()) < 0.5
        started = anyio.current_time()
        with make(deadline=started + 0.05) as scope:
            await anyio.sleep(5)
        caught = getattr(scope, "cancelled_caught", None)  # (not part of ScopeLike)
        seen.append(("deadline", caught, anyio.current_time() - started < 2))
        with anyio.CancelScope() as outer:
            outer.cancel()
            with make(deadline=anyio.current_time() + 5, shield=True):
                await anyio.sleep(0.01)  # not cancelled: shielded
                seen.append("shielded sleep done")
            await anyio.sleep(5)  # the outer cancellation lands here
            seen.append("not reached")
        seen.append(("outer", outer.cancelled_caught))

    anyio.run(main, backend=library)
    assert seen == [("deadline", True, True), "shielded sleep done", ("outer", True)]
