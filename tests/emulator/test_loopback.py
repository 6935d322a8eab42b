"""The emulator's loopback host (``nsq_emulator.loopback``: ``serve_emulator``, ``python -m
nsq_anyio serve``) runs on the wall clock: message timestamps and ``/stats``'s ``start_time``
are those of now."""

from __future__ import annotations

import json
import time
import urllib.request
from types import ModuleType

import anyio
import pytest

from nsq_emulator.loopback import serve_emulator
from tests.support.backends import anyio_backend, lib, way

__all__ = ["anyio_backend", "lib", "way"]

pytestmark = pytest.mark.anyio

#: how far from time.time() a timestamp taken during the test may be
SLACK = 60.0


async def test_message_timestamps_and_start_time_are_now(lib: ModuleType) -> None:
    async with serve_emulator() as cluster:
        addresses = cluster.nsqd_tcp_addresses
        async with lib.Producer(nsqd_tcp_addresses=addresses) as producer:
            await producer.publish("t", b"now")
        async with lib.Consumer("t", "c", nsqd_tcp_addresses=addresses) as consumer:
            with anyio.fail_after(20):
                async for message in consumer:
                    await message.finish()
                    break
        assert abs(message.timestamp / 1e9 - time.time()) < SLACK
        url = f"http://{cluster.nsqd_http_addresses[0]}/stats?format=json"
        body = await anyio.to_thread.run_sync(lambda: urllib.request.urlopen(url).read())
        assert abs(json.loads(body)["start_time"] - time.time()) < SLACK


async def test_a_fixed_offset_is_kept(lib: ModuleType) -> None:
    async with serve_emulator(nsqd_options={"wall_clock_offset": 0.0}) as cluster:
        async with lib.Producer(nsqd_tcp_addresses=cluster.nsqd_tcp_addresses) as producer:
            await producer.publish("t", b"then")
        async with lib.Consumer("t", "c", nsqd_tcp_addresses=cluster.nsqd_tcp_addresses) as c:
            with anyio.fail_after(20):
                async for message in c:
                    await message.finish()
                    break
        assert message.timestamp / 1e9 == pytest.approx(anyio.current_time(), abs=SLACK)
