"""``stop()`` called by a handler of ``run()``: it cannot wait for its own caller, so it
starts the stop and returns at once; the caller's message is answered by the handler's
outcome, ``run()`` returns, and nothing is delivered twice (async on every way, and the
blocking API from a handler thread)."""

from __future__ import annotations

import time
from collections import Counter
from types import ModuleType
from typing import Any

import anyio
import pytest

from nsq_anyio.blocking import Consumer as BlockingConsumer
from nsq_anyio.blocking import Message as BlockingMessage
from nsq_emulator.loopback import EmulatorCluster
from tests.support.served import server
from tests.support.servers import channel_stats

__all__ = ["server"]

pytestmark = pytest.mark.anyio

BODIES = [b"%d" % i for i in range(20)]


@pytest.mark.nsq_emulator(lookupd=False)
async def test_stop_from_a_handler_returns_at_once_and_finishes_the_callers_message(
    lib: ModuleType, nsq_emulator: EmulatorCluster
) -> None:
    cluster = nsq_emulator
    addresses = cluster.nsqd_tcp_addresses
    async with lib.Producer(nsqd_tcp_addresses=addresses) as producer:
        await producer.publish_many("t", BODIES)
    handled: Counter[bytes] = Counter()
    stop_took: list[float] = []

    async def handler(message: Any) -> None:
        handled[message.body] += 1
        if message.body == b"5":
            started = time.monotonic()
            await consumer.stop()
            stop_took.append(time.monotonic() - started)

    started = time.monotonic()
    with anyio.fail_after(20):
        async with lib.Consumer(
            "t", "c", nsqd_tcp_addresses=addresses, max_in_flight=4, stop_timeout=30.0
        ) as consumer:
            await consumer.run(handler, concurrency=4)
            run_took = time.monotonic() - started
    stats = cluster.nsqds[0].channel_stats("t", "c")
    # a second consumer gets exactly what the first did not finish
    rest: Counter[bytes] = Counter()
    async with lib.Consumer("t", "c", nsqd_tcp_addresses=addresses) as second:
        with anyio.move_on_after(2):
            async for message in second:
                rest[message.body] += 1
                await message.finish()
    assert stop_took and stop_took[0] < 1.0  # not stop_timeout
    assert run_took < 5.0
    assert handled[b"5"] == 1 and b"5" not in rest  # the caller's message was finished
    assert not set(handled) & set(rest)  # nothing handled was delivered again
    assert set(handled) | set(rest) == set(BODIES)
    assert stats.in_flight_count == 0


def test_stop_from_a_blocking_handler_thread_returns_at_once(server: dict[str, str]) -> None:
    nsqd, http = server["nsqd TCP"], server["nsqd HTTP"]
    topic = f"stop_from_handler_{time.monotonic_ns()}"
    from nsq_anyio.blocking import Producer

    with Producer(nsqd_tcp_addresses=[nsqd]) as producer:
        producer.publish_many(topic, BODIES)
    handled: Counter[bytes] = Counter()
    stop_took: list[float] = []

    with BlockingConsumer(
        topic, "c", nsqd_tcp_addresses=[nsqd], max_in_flight=4, stop_timeout=30.0
    ) as consumer:

        def handler(message: BlockingMessage) -> None:
            handled[message.body] += 1
            if message.body == b"5":
                started = time.monotonic()
                consumer.stop()
                stop_took.append(time.monotonic() - started)

        started = time.monotonic()
        consumer.run(handler, threads=4)
        run_took = time.monotonic() - started
    stats = channel_stats(http, topic, "c")
    assert stop_took and stop_took[0] < 1.0  # not stop_timeout
    assert run_took < 5.0
    assert handled[b"5"] == 1
    assert stats["in_flight_count"] == 0
    # what was handled was finished, the rest requeued: nothing handled is queued again
    assert stats["depth"] == len(BODIES) - len(handled)


def test_stop_from_the_body_of_a_blocking_loop_returns_at_once(server: dict[str, str]) -> None:
    nsqd, http = server["nsqd TCP"], server["nsqd HTTP"]
    topic = f"stop_from_loop_{time.monotonic_ns()}"
    from nsq_anyio.blocking import Producer

    with Producer(nsqd_tcp_addresses=[nsqd]) as producer:
        producer.publish_many(topic, BODIES)
    seen: list[bytes] = []
    started = time.monotonic()
    with BlockingConsumer(
        topic, "c", nsqd_tcp_addresses=[nsqd], max_in_flight=4, stop_timeout=30.0
    ) as consumer:
        for message in consumer:
            seen.append(message.body)
            if len(seen) == 3:
                consumer.stop()
            message.finish()
    took = time.monotonic() - started
    stats = channel_stats(http, topic, "c")
    assert took < 5.0  # not stop_timeout
    assert stats["in_flight_count"] == 0
    assert stats["depth"] == len(BODIES) - len(seen)
