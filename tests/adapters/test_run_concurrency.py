"""``run(handler, concurrency=N)`` runs N handlers at once: it raises a max_in_flight the user
did not set to N, and keeps one the user set."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import anyio
import pytest

from nsq_emulator.loopback import serve_emulator

TIMEOUT = 20


async def _peak_of_run(lib: ModuleType, n: int, **options: Any) -> tuple[int, Any]:
    """Run ``n`` handlers over ``2 * n`` messages, each holding its message until ``n`` run at
    once (or a while has passed); the most that ran at once, and the consumer's stats."""
    async with serve_emulator(lookupd=False) as cluster:
        addresses = cluster.nsqd_tcp_addresses
        async with lib.Producer(nsqd_tcp_addresses=addresses) as producer:
            await producer.publish_many("t", [b"%d" % i for i in range(2 * n)])
        running = peak = done = 0
        all_running = anyio.Event()
        async with lib.Consumer("t", "c", nsqd_tcp_addresses=addresses, **options) as consumer:
            with anyio.fail_after(TIMEOUT):
                async with anyio.create_task_group() as tg:

                    async def handler(message: Any) -> None:
                        nonlocal running, peak, done
                        running += 1
                        peak = max(peak, running)
                        if running == n:
                            all_running.set()
                        with anyio.move_on_after(2):
                            await all_running.wait()
                        running -= 1
                        done += 1
                        if done == 2 * n:
                            tg.cancel_scope.cancel()

                    tg.start_soon(consumer.run, handler, n)
            stats = consumer.stats()
    return peak, stats


@pytest.mark.anyio
async def test_run_raises_max_in_flight_to_its_concurrency(lib: ModuleType) -> None:
    peak, stats = await _peak_of_run(lib, 4)
    assert peak == 4
    assert stats["max_in_flight"] == 4


@pytest.mark.anyio
async def test_run_keeps_a_max_in_flight_the_user_chose(lib: ModuleType) -> None:
    peak, stats = await _peak_of_run(lib, 3, max_in_flight=2)
    assert peak <= 2
    assert stats["max_in_flight"] == 2
