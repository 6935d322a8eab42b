"""nsq_anyio on asyncio running on uvloop (``anyio.run(..., backend_options={"use_uvloop":
True})``): uvloop's transports are not ``asyncio.Transport`` subclasses; the client's own
asyncio stream must work on them all the same, TLS and snappy included."""

from __future__ import annotations

import asyncio
import ssl
import time
from typing import Any

import anyio
import pytest
import trustme

import nsq_anyio
from nsq_anyio._backend import AnyioBackend
from nsq_emulator.loopback import serve_emulator

uvloop = pytest.importorskip("uvloop")


async def round_trip(tls: bool) -> list[bytes]:
    options: dict[str, Any] = {}
    server: dict[str, Any] = {}
    if tls:
        ca = trustme.CA()
        server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ca.issue_cert("127.0.0.1").configure_cert(server_ctx)
        client_ctx = ssl.create_default_context()
        ca.configure_trust(client_ctx)
        server = {"tls_context": server_ctx}
        options = {"tls": client_ctx, "snappy": True}
    async with serve_emulator(lookupd=False, **server) as cluster:
        addresses = cluster.nsqd_tcp_addresses
        async with nsq_anyio.Producer(nsqd_tcp_addresses=addresses, **options) as producer:
            await producer.publish("t", b"one")
            await producer.publish_many("t", [b"two", b"three"])
        got: list[bytes] = []
        async with nsq_anyio.Consumer(
            "t", "c", nsqd_tcp_addresses=addresses, max_in_flight=5, **options
        ) as consumer:
            async for message in consumer:
                got.append(message.body)
                await message.finish()
                if len(got) == 3:
                    break
        return got


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls-snappy"])
def test_publish_and_consume_on_uvloop(tls: bool) -> None:
    async def main() -> list[bytes]:
        assert type(asyncio.get_running_loop()).__module__.startswith("uvloop")
        with anyio.fail_after(30):
            return await round_trip(tls)

    got = anyio.run(main, backend="asyncio", backend_options={"use_uvloop": True})
    assert sorted(got) == [b"one", b"three", b"two"]


def test_the_clock_is_the_loops_own() -> None:
    """The client reads the running loop's clock: on asyncio's own loop time.monotonic
    itself (what BaseEventLoop.time returns, without its frame), on uvloop uvloop's."""
    backend = AnyioBackend()

    async def clocks() -> tuple[Any, float, float]:
        clock = backend.clock()
        loop = asyncio.get_running_loop()
        return clock, clock(), loop.time()

    clock, read, loops = anyio.run(clocks, backend="asyncio")
    assert clock is time.monotonic and abs(read - loops) < 1.0
    clock, read, loops = anyio.run(clocks, backend="asyncio", backend_options={"use_uvloop": True})
    assert clock is not time.monotonic and abs(read - loops) < 1.0
    assert getattr(clock, "__self__", None) is not None  # uvloop's loop.time, bound
