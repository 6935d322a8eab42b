"""The fault proxy (``nsq_emulator.proxy.FaultProxy``) between a client and an echo server on
loopback, on asyncio and on trio: bytes and connections counted, a delay line that keeps order
and throughput, half-open, trickled bytes, resets both ends read as resets, and its command
line."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio
import anyio.abc
import pytest

from nsq_emulator.proxy import FaultProxy
from tests.support import ROOT
from tests.support.net import free_port

pytestmark = pytest.mark.anyio

#: what a busy two-core machine may add to any wait
SLACK = 2.0
RESET = (anyio.BrokenResourceError, ConnectionResetError)


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


class Echo:
    """An echo server on loopback: what each connection's end saw last is kept."""

    def __init__(self) -> None:
        self.address = ""
        #: how each connection ended, as the server read it: "eof" or "reset"
        self.endings: list[str] = []

    async def handle(self, stream: anyio.abc.SocketStream) -> None:
        async with stream:
            try:
                async for chunk in stream:
                    await stream.send(chunk)
            except RESET:
                self.endings.append("reset")
                return
            self.endings.append("eof")


@asynccontextmanager
async def echo_server() -> AsyncIterator[Echo]:
    echo = Echo()
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    echo.address = f"127.0.0.1:{listener.extra(anyio.abc.SocketAttribute.local_port)}"
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, echo.handle)
        yield echo
        tg.cancel_scope.cancel()


async def connect(address: str) -> anyio.abc.SocketStream:
    host, _, port = address.rpartition(":")
    return await anyio.connect_tcp(host, int(port))


async def receive_exactly(stream: anyio.abc.SocketStream, n: int) -> bytes:
    data = b""
    while len(data) < n:
        data += await stream.receive()
    return data


async def until(condition: Callable[[], object], timeout: float = 5.0) -> None:
    with anyio.fail_after(timeout):
        while not condition():
            await anyio.sleep(0.01)


async def test_bytes_pass_both_ways_and_connections_and_bytes_are_counted() -> None:
    async with echo_server() as echo, FaultProxy(echo.address) as proxy:
        async with await connect(proxy.address) as client:
            await client.send(b"hello")
            assert await receive_exactly(client, 5) == b"hello"
            assert proxy.open_connections == 1
        await until(lambda: proxy.open_connections == 0)
        (conn,) = proxy.connections
        assert (conn.number, conn.bytes_to_server, conn.bytes_to_client) == (1, 5, 5)
        assert (proxy.bytes_to_server, proxy.bytes_to_client) == (5, 5)
        assert conn.client_closed_at is not None and not conn.client_reset
        assert conn.reset_at is None and echo.endings == ["eof"]


async def test_a_delay_holds_every_chunk_each_way_and_keeps_order_and_throughput() -> None:
    """0.1 s each way: a round trip takes at least 0.2 s; 50 chunks sent 10 ms apart all come
    back, in order, about 0.2 s after the last (a delay line), not 50 round trips later."""
    async with echo_server() as echo, FaultProxy(echo.address) as proxy:
        proxy.delay(0.1)
        async with await connect(proxy.address) as client:
            started = anyio.current_time()
            await client.send(b"ping")
            assert await receive_exactly(client, 4) == b"ping"
            round_trip = anyio.current_time() - started
            assert 0.2 <= round_trip < 0.2 + SLACK
            chunks = [b"<%03d>" % i for i in range(50)]
            started = anyio.current_time()

            async def sender() -> None:
                for chunk in chunks:
                    await client.send(chunk)
                    await anyio.sleep(0.01)

            async with anyio.create_task_group() as tg:
                tg.start_soon(sender)
                echoed = await receive_exactly(client, sum(map(len, chunks)))
            elapsed = anyio.current_time() - started
        assert echoed == b"".join(chunks)
        assert 0.2 <= elapsed < 50 * 0.2 / 2  # stop-and-wait would take 10 s


async def test_a_delay_changed_at_run_time_applies_to_what_is_read_next() -> None:
    async with echo_server() as echo, FaultProxy(echo.address) as proxy:
        async with await connect(proxy.address) as client:
            await client.send(b"a")
            assert await receive_exactly(client, 1) == b"a"
            proxy.delay(0.15, "to_server")
            started = anyio.current_time()
            await client.send(b"b")
            assert await receive_exactly(client, 1) == b"b"
            assert 0.15 <= anyio.current_time() - started < 0.15 + SLACK


async def test_half_open_moves_no_byte_either_way_until_healed() -> None:
    async with echo_server() as echo, FaultProxy(echo.address) as proxy:
        async with await connect(proxy.address) as client:
            await client.send(b"before")
            assert await receive_exactly(client, 6) == b"before"
            proxy.half_open()
            await client.send(b"during")
            with anyio.move_on_after(0.5) as silent:
                await client.receive()
            assert silent.cancelled_caught
            (conn,) = proxy.connections
            assert conn.bytes_to_server == 6 and conn.open
            proxy.heal()
            assert await receive_exactly(client, 6) == b"during"


async def test_half_open_one_way_lets_the_other_through() -> None:
    async with echo_server() as echo, FaultProxy(echo.address) as proxy:
        async with await connect(proxy.address) as client:
            proxy.half_open("to_client")
            await client.send(b"one way")
            (conn,) = proxy.connections
            await until(lambda: conn.bytes_to_server == 7)  # the server has it
            with anyio.move_on_after(0.3) as silent:
                await client.receive()
            assert silent.cancelled_caught and conn.bytes_to_client == 0
            proxy.heal("to_client")
            assert await receive_exactly(client, 7) == b"one way"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="read from TCP_INFO")
async def test_an_end_closing_while_half_open_is_seen_at_once() -> None:
    """Nothing is read while half-open, yet the proxy sees the client close (its socket's
    state), and tells a reset from an end of stream."""
    async with echo_server() as echo, FaultProxy(echo.address) as proxy:
        client = await connect(proxy.address)
        await client.send(b"x")
        assert await receive_exactly(client, 1) == b"x"
        proxy.half_open()
        await client.send(b"unread")
        closed = anyio.current_time()
        await client.aclose()
        (conn,) = proxy.connections
        await until(lambda: conn.client_closed_at is not None)
        assert conn.client_closed_at is not None
        assert conn.client_closed_at - closed < SLACK and not conn.client_reset
        assert conn.open  # half-open: nothing passed on
        proxy.heal()
        await until(lambda: not conn.open)
        assert echo.endings == ["eof"]


async def test_trickle_writes_a_few_bytes_at_a_time() -> None:
    """3 bytes every 20 ms: 30 bytes take at least 9 intervals, and arrive whole."""
    async with echo_server() as echo, FaultProxy(echo.address) as proxy:
        async with await connect(proxy.address) as client:
            proxy.trickle(3, 0.02, "to_client")
            data = bytes(range(65, 95))
            started = anyio.current_time()
            await client.send(data)
            assert await receive_exactly(client, 30) == data
            assert anyio.current_time() - started >= 9 * 0.02


async def test_a_reset_is_read_as_a_reset_by_both_ends() -> None:
    async with echo_server() as echo, FaultProxy(echo.address) as proxy:
        async with await connect(proxy.address) as client:
            await client.send(b"x")
            assert await receive_exactly(client, 1) == b"x"
            proxy.reset()
            with pytest.raises(RESET):
                await client.receive()
        await until(lambda: echo.endings == ["reset"])
        (conn,) = proxy.connections
        await until(lambda: not conn.open)  # the proxy's own end is closed in its task
        assert conn.reset_at is not None


async def test_reset_after_lets_that_many_bytes_through_then_resets() -> None:
    """The first 5 of 20 bytes to the client pass, then the connection is reset: the client
    reads at most those 5 (a frame cut in its middle), then a reset."""
    async with echo_server() as echo, FaultProxy(echo.address) as proxy:
        async with await connect(proxy.address) as client:
            proxy.reset_after(5, "to_client")
            await client.send(b"0123456789abcdefghij")
            received = b""
            with pytest.raises(RESET):
                while True:
                    chunk = await client.receive()
                    received += chunk
        assert b"01234".startswith(received)
        (conn,) = proxy.connections
        assert conn.bytes_to_client == 5 and conn.reset_at is not None
        await until(lambda: echo.endings == ["reset"])


async def test_a_refused_upstream_resets_the_client() -> None:
    async with FaultProxy(f"127.0.0.1:{free_port()}") as proxy:
        async with await connect(proxy.address) as client:
            with pytest.raises(RESET):
                await client.receive()
        (conn,) = proxy.connections
        await until(lambda: not conn.open)
        assert conn.server_reset and conn.reset_at is not None


def test_bad_arguments_are_value_errors() -> None:
    with pytest.raises(ValueError, match="host:port"):
        FaultProxy("nsqd")
    proxy = FaultProxy("127.0.0.1:4150")
    with pytest.raises(ValueError, match="delay"):
        proxy.delay(-1.0)
    with pytest.raises(ValueError, match="trickle"):
        proxy.trickle(0)
    with pytest.raises(ValueError, match="direction"):
        proxy.half_open("up")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="nbytes"):
        proxy.reset_after(-1, "to_client")


async def test_the_command_line_serves_a_proxy_until_terminated() -> None:
    async with echo_server() as echo:
        argv = [sys.executable, "-m", "nsq_emulator.proxy", echo.address, "--delay", "0.05"]
        process = await anyio.open_process(argv, cwd=ROOT)
        async with process:
            assert process.stdout is not None
            with anyio.fail_after(30):
                line = b""
                while not line.endswith(b"\n"):
                    line += await process.stdout.receive(1)
            assert line.startswith(b"address=127.0.0.1:")
            async with await connect(line.decode().strip().partition("=")[2]) as client:
                started = anyio.current_time()
                await client.send(b"hi")
                assert await receive_exactly(client, 2) == b"hi"
                assert anyio.current_time() - started >= 0.1
            process.terminate()
            with anyio.fail_after(10):
                assert await process.wait() == 0


def test_the_command_line_refuses_a_bad_upstream() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "nsq_emulator.proxy", "nsqd"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines()[-1].endswith("upstream must be host:port, not 'nsqd'")
