"""The fault scenarios that need no real process, against the emulator on loopback (CI runs
these; ``test_real_faults.py`` runs the same against real nsqd): a killed and restarted nsqd,
direct and behind lookupd; producer failover; handlers slower than msg_timeout; stop and
cancellation under load.  Frozen nsqd are covered on the virtual clock in
``tests/testing/test_recovery.py``."""

from __future__ import annotations

import time
from collections import Counter
from types import ModuleType
from typing import Any

import anyio
import pytest

from nsq_anyio._server import EmulatorCluster, serve_emulator

from ._figures import report

pytestmark = pytest.mark.anyio

WAIT = 20.0


async def until(predicate: Any, timeout: float = WAIT) -> float:
    start = time.monotonic()
    with anyio.fail_after(timeout):
        while not predicate():
            await anyio.sleep(0.02)
    return time.monotonic() - start


def kill(cluster: EmulatorCluster, i: int) -> None:
    """kill -9 of an nsqd whose queue is on disk: connections drop, and the messages only
    its memory held (in flight, deferred) are gone."""
    cluster.nsqds[i].stop(cluster.now(), lose_in_flight=True)
    cluster.kick()


def restart(cluster: EmulatorCluster, i: int) -> None:
    cluster.nsqds[i].start(cluster.now())
    cluster.kick()


async def test_killed_nsqd_mid_consume_direct(lib: ModuleType, way: tuple[str, str]) -> None:
    async with serve_emulator(lookupd=False) as cluster:
        address = cluster.nsqd_tcp_addresses[0]
        before = [b"a%d" % i for i in range(1000)]
        async with lib.Producer(nsqd_tcp_addresses=[address]) as producer:
            await producer.publish_many("t", before)
        seen: Counter[bytes] = Counter()
        fresh: list[float] = []

        async def handler(message: Any) -> None:
            seen[message.body] += 1
            if message.body == b"fresh" and not fresh:
                fresh.append(time.monotonic())
            await anyio.sleep(0)

        async with lib.Consumer(
            "t",
            "c",
            nsqd_tcp_addresses=[address],
            max_in_flight=50,
            reconnect_delay=0.25,
            max_reconnect_delay=1.0,
            reconnect_jitter=0.0,
        ) as consumer:
            async with anyio.create_task_group() as tg:
                tg.start_soon(consumer.run, handler, 10)
                await until(lambda: len(seen) >= 300)
                kill(cluster, 0)
                await anyio.sleep(1.0)
                restart(cluster, 0)
                restarted = time.monotonic()
                async with lib.Producer(nsqd_tcp_addresses=[address]) as producer:
                    await producer.publish("t", b"fresh")
                await until(lambda: bool(fresh))
                stats = cluster.nsqds[0].channel_stats
                await until(lambda: stats("t", "c").depth == 0)
                await until(lambda: stats("t", "c").in_flight_count == 0)
                await consumer.stop()
        lost = [b for b in before if b not in seen]
        report(
            f"emulator: killed nsqd mid-consume, direct [{way[0]}/{way[1]}]",
            reconnect_s=fresh[0] - restarted,
            lost_in_nsqd_memory=len(lost),
        )
        assert len(lost) <= 50  # at most what was in flight when it died
        assert fresh[0] - restarted < 3.0


async def test_killed_nsqd_behind_lookupd_is_found_again_soon(
    lib: ModuleType, way: tuple[str, str]
) -> None:
    async with serve_emulator(nsqd_count=2) as cluster:
        for address in cluster.nsqd_tcp_addresses:
            async with lib.Producer(nsqd_tcp_addresses=[address]) as producer:
                await producer.publish_many("t", [b"x"] * 200)
        seen: Counter[str] = Counter()
        fresh: list[float] = []

        async def handler(message: Any) -> None:
            seen[message.nsqd_address] += 1
            if message.body == b"fresh" and not fresh:
                fresh.append(time.monotonic())

        first, second = cluster.nsqd_tcp_addresses
        async with lib.Consumer(
            "t", "c", lookupd_http_addresses=cluster.lookupd_http_addresses, max_in_flight=20
        ) as consumer:
            async with anyio.create_task_group() as tg:
                tg.start_soon(consumer.run, handler, 5)
                await until(lambda: seen[first] >= 50 and seen[second] >= 1)
                kill(cluster, 0)
                other = seen[second]
                await until(lambda: seen[second] > other + 50)  # the survivor goes on
                await anyio.sleep(2.0)
                restart(cluster, 0)
                restarted = time.monotonic()
                async with lib.Producer(nsqd_tcp_addresses=[first]) as producer:
                    await producer.publish("t", b"fresh")
                await until(lambda: bool(fresh))
                await consumer.stop()
        report(
            f"emulator: killed nsqd behind lookupd [{way[0]}/{way[1]}]",
            rediscovery_s=fresh[0] - restarted,
        )
        assert fresh[0] - restarted < 10.0  # lookupd_poll_interval is 60 s


async def test_producer_fails_over_and_loses_no_acknowledged_publish(
    lib: ModuleType, way: tuple[str, str]
) -> None:
    async with serve_emulator(nsqd_count=2, lookupd=False) as cluster:
        acked: list[bytes] = []
        failed = 0
        async with lib.Producer(
            nsqd_tcp_addresses=cluster.nsqd_tcp_addresses, reconnect_delay=0.2, publish_timeout=5.0
        ) as producer:

            async def publisher(k: int) -> None:
                nonlocal failed
                for i in range(50):
                    body = b"%d-%d" % (k, i)
                    try:
                        await producer.publish("t", body)
                    except lib.NSQError:
                        failed += 1
                    else:
                        acked.append(body)
                    if k == 0 and i == 10:
                        kill(cluster, 0)

            async with anyio.create_task_group() as tg:
                for k in range(10):
                    tg.start_soon(publisher, k)
        restart(cluster, 0)
        seen: Counter[bytes] = Counter()
        async with lib.Consumer(
            "t", "c", nsqd_tcp_addresses=cluster.nsqd_tcp_addresses, max_in_flight=100
        ) as consumer:
            with anyio.move_on_after(WAIT):
                async for message in consumer:
                    seen[message.body] += 1
                    await message.finish()
                    if all(b in seen for b in acked):
                        break
        report(
            f"emulator: producer failover [{way[0]}/{way[1]}]",
            acked=len(acked),
            failed=failed,
            duplicates=sum(n - 1 for n in seen.values()),
        )
        assert all(b in seen for b in acked)
        assert len(acked) >= 450


@pytest.mark.parametrize("touch", [False, True])
async def test_handlers_slower_than_msg_timeout(
    lib: ModuleType, way: tuple[str, str], touch: bool
) -> None:
    async with serve_emulator(lookupd=False) as cluster:
        address = cluster.nsqd_tcp_addresses[0]
        async with lib.Producer(nsqd_tcp_addresses=[address]) as producer:
            await producer.publish_many("t", [b"%d" % i for i in range(5)])
        attempts: list[int] = []

        async def handler(message: Any) -> None:
            attempts.append(message.attempts)
            if message.attempts == 1:
                for _ in range(6):
                    await anyio.sleep(0.25)
                    if touch:
                        await message.touch()

        stats = cluster.nsqds[0].channel_stats
        async with lib.Consumer(
            "t", "c", nsqd_tcp_addresses=[address], max_in_flight=10, msg_timeout=1.0
        ) as consumer:
            async with anyio.create_task_group() as tg:
                tg.start_soon(consumer.run, handler, 10)
                await until(lambda: len(attempts) >= 5)
                await until(
                    lambda: stats("t", "c").in_flight_count == 0 and stats("t", "c").depth == 0
                )
                await anyio.sleep(0.3)
                tg.cancel_scope.cancel()
            state = [s["state"] for s in consumer.stats()["connections"]]
        assert state == ["SUBSCRIBED"]
        if touch:
            assert sorted(attempts) == [1] * 5 and stats("t", "c").timeout_count == 0
        else:
            assert sorted(attempts) == [1] * 5 + [2] * 5 and stats("t", "c").timeout_count == 5


@pytest.mark.parametrize("how", ["stop", "cancel"])
async def test_stop_under_load(lib: ModuleType, way: tuple[str, str], how: str) -> None:
    async with serve_emulator(lookupd=False) as cluster:
        address = cluster.nsqd_tcp_addresses[0]
        bodies = [b"%d" % i for i in range(1500)]
        async with lib.Producer(nsqd_tcp_addresses=[address]) as producer:
            await producer.publish_many("t", bodies)
        finished: Counter[bytes] = Counter()
        running = peak = 0

        async def handler(message: Any) -> None:
            nonlocal running, peak
            running += 1
            peak = max(peak, running)
            try:
                await anyio.sleep(0.01)
            finally:
                running -= 1
            finished[message.body] += 1

        async with lib.Consumer(
            "t", "c", nsqd_tcp_addresses=[address], max_in_flight=200, stop_timeout=5.0
        ) as consumer:
            with anyio.CancelScope() as scope:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(consumer.run, handler, 50)
                    await until(lambda: len(finished) >= 300)
                    stopping = time.monotonic()
                    if how == "stop":
                        await consumer.stop()
                    else:
                        scope.cancel()
        stop_s = time.monotonic() - stopping
        rest: Counter[bytes] = Counter()
        async with lib.Consumer(
            "t", "c", nsqd_tcp_addresses=[address], max_in_flight=500
        ) as consumer:
            with anyio.move_on_after(WAIT):
                async for message in consumer:
                    rest[message.body] += 1
                    await message.finish()
                    if set(finished) | set(rest) >= set(bodies):
                        break
        report(
            f"emulator: {how} under load [{way[0]}/{way[1]}]", peak_concurrency=peak, stop_s=stop_s
        )
        assert peak == 50
        assert stop_s < 5.0
        assert set(finished) | set(rest) == set(bodies)
