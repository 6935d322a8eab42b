"""What users meet in their first week, on every adapter against the emulator on loopback:
handlers that await, many at once; redelivered messages; failures that retrying cannot heal."""

from __future__ import annotations

import time
from types import ModuleType
from typing import Any

import anyio
import pytest

from nsq_anyio._server import serve_emulator

pytestmark = pytest.mark.anyio

TIMEOUT = 15


async def test_run_runs_n_awaiting_handlers_at_once_and_returns_on_stop(lib: ModuleType) -> None:
    n_messages, concurrency = 200, 20
    async with serve_emulator(lookupd=False) as cluster:
        addresses = cluster.nsqd_tcp_addresses
        async with lib.Producer(nsqd_tcp_addresses=addresses) as producer:
            await producer.publish_many("t", [b"%d" % i for i in range(n_messages)])
        running = peak = done = 0

        async def handler(message: Any) -> None:
            nonlocal running, peak, done
            running += 1
            peak = max(peak, running)
            try:
                await anyio.sleep(0.05)
            finally:
                running -= 1
            done += 1

        async with lib.Consumer(
            "t", "c", nsqd_tcp_addresses=addresses, max_in_flight=n_messages
        ) as consumer:
            returned_after: float | None = None
            with anyio.fail_after(TIMEOUT):
                async with anyio.create_task_group() as tg:

                    async def run() -> None:
                        nonlocal returned_after
                        await consumer.run(handler, concurrency=concurrency)
                        returned_after = time.monotonic()

                    tg.start_soon(run)
                    while done < n_messages:
                        await anyio.sleep(0.01)
                    stop_at = time.monotonic()
                    await consumer.stop()
            assert returned_after is not None
            assert returned_after - stop_at < 2.0
        assert peak == concurrency
        stats = cluster.nsqds[0].channel_stats("t", "c")
        assert (stats.depth, stats.in_flight_count, stats.message_count) == (0, 0, n_messages)


async def test_run_returns_when_stopped_while_idle(lib: ModuleType) -> None:
    async with serve_emulator(lookupd=False) as cluster:
        addresses = cluster.nsqd_tcp_addresses

        async def handler(message: Any) -> None:
            raise AssertionError("no message was published")

        async with lib.Consumer("t", "c", nsqd_tcp_addresses=addresses) as consumer:
            with anyio.fail_after(5):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(consumer.run, handler, 10)
                    await anyio.sleep(0.2)
                    await consumer.stop()


async def test_a_handler_slower_than_msg_timeout_sees_a_redelivery_and_nothing_breaks(
    lib: ModuleType,
) -> None:
    # nsqd times the first delivery out and delivers the message again while the first
    # handler still runs: both copies get answered; neither answer may raise or drop the link
    async with serve_emulator(lookupd=False) as cluster:
        addresses = cluster.nsqd_tcp_addresses
        async with lib.Producer(nsqd_tcp_addresses=addresses) as producer:
            await producer.publish_many("t", [b"a", b"b", b"c"])
        seen: list[tuple[bytes, int]] = []

        async def handler(message: Any) -> None:
            seen.append((message.body, message.attempts))
            if message.attempts == 1:
                await anyio.sleep(1.6)  # past msg_timeout: nsqd redelivers meanwhile
            if message.body == b"c" and message.attempts == 1:
                raise RuntimeError("the stale copy fails, the newer one succeeds")

        async with lib.Consumer(
            "t",
            "c",
            nsqd_tcp_addresses=addresses,
            max_in_flight=10,
            msg_timeout=1.0,
            backoff=False,
        ) as consumer:
            with anyio.move_on_after(4.0):
                await consumer.run(handler, concurrency=10)
            assert [s["state"] for s in consumer.stats()["connections"]] == ["SUBSCRIBED"]
        assert sorted(seen) == [(b"a", 1), (b"a", 2), (b"b", 1), (b"b", 2), (b"c", 1), (b"c", 2)]
        stats = cluster.nsqds[0].channel_stats("t", "c")
        assert (stats.depth, stats.in_flight_count, stats.deferred_count) == (0, 0, 0)
        assert stats.timeout_count == 3
        # nothing was requeued: the failing stale copy of c did not undo its newer delivery
        assert stats.requeue_count == 0
