"""The fault scenarios, each written once and run against a real target
(``test_real_faults.py``) and an emulated one (``test_emulated_faults.py``).  Each asserts
what a user sees and reports its figures."""

from __future__ import annotations

import time
from collections import Counter
from types import ModuleType
from typing import Any

import anyio

from tests.support.load import CpuPressure

from ._figures import report
from ._targets import Target

WAIT = 30.0


async def until(predicate: Any, timeout: float = WAIT, step: float = 0.02) -> float:
    """Wait for ``predicate()``; returns how long it took."""
    start = time.monotonic()
    with anyio.fail_after(timeout):
        while not predicate():
            await anyio.sleep(step)
    return time.monotonic() - start


async def until_still(
    predicate: Any, progress: Any, stall: float = WAIT, step: float = 0.02
) -> float:
    """Wait for ``predicate()`` as long as ``progress()`` changes at least once every
    ``stall`` seconds (a busy machine is slow, not stuck); returns how long it took."""
    start = moved = time.monotonic()
    last = progress()
    while not predicate():
        await anyio.sleep(step)
        now = progress()
        if now != last:
            last, moved = now, time.monotonic()
        elif time.monotonic() - moved > stall:
            raise TimeoutError(f"nothing moved for {stall} s: still {last!r}")
    return time.monotonic() - start


def _name(target: Target, what: str, way: tuple[str, str]) -> str:
    return f"{target.label}: {what} [{way[0]}/{way[1]}]"


async def publish_all(lib: ModuleType, address: str, topic: str, bodies: list[bytes]) -> None:
    async with lib.Producer(nsqd_tcp_addresses=[address]) as producer:
        for i in range(0, len(bodies), 200):
            await producer.publish_many(topic, bodies[i : i + 200])


def drained(target: Target, i: int, topic: str) -> bool:
    c = target.channel(i, topic, "c")
    return c is not None and c.depth == 0 and c.in_flight_count == 0


async def kill_mid_consume(
    lib: ModuleType, way: tuple[str, str], target: Target, topic: str
) -> None:
    """kill -9 of the only nsqd while a handler consumes; it comes back on the same port.

    The reconnection is timed from the restart to the first message of a new connection: a
    message published after the restart comes behind what nsqd kept on disk, so its arrival
    also measures how fast the machine drains that backlog (seconds on a starved machine)."""
    address = target.nsqd_tcp_addresses[0]
    before = [b"a%d" % i for i in range(1500)]
    await publish_all(lib, address, topic, before)
    pressure = CpuPressure()
    seen: Counter[bytes] = Counter()
    old_connections: set[int] = set()
    restarted: list[float] = []
    reconnected: list[float] = []

    async def handler(message: Any) -> None:
        seen[message.body] += 1
        if not restarted:
            old_connections.add(message.conn_id)
        elif not reconnected and message.conn_id not in old_connections:
            reconnected.append(time.monotonic())
        await anyio.sleep(0)

    async with lib.Consumer(
        topic,
        "c",
        nsqd_tcp_addresses=[address],
        max_in_flight=50,
        reconnect_delay=0.25,
        max_reconnect_delay=1.0,
        reconnect_jitter=0.0,
    ) as consumer:
        async with anyio.create_task_group() as tg:
            tg.start_soon(consumer.run, handler, 10)
            await until(lambda: len(seen) >= 400)
            await target.kill(0)
            await anyio.sleep(1.0)
            await target.restart(0)
            restarted.append(time.monotonic())
            await publish_all(lib, address, topic, [b"fresh"])
            await until_still(lambda: b"fresh" in seen, lambda: len(seen), stall=30.0)
            await until(lambda: drained(target, 0, topic))  # what nsqd still had arrives too
            await consumer.stop()
    lost = [b for b in before if b not in seen]
    reconnect_s = reconnected[0] - restarted[0]
    report(
        _name(target, "kill -9 mid-consume, direct", way),
        reconnect_s=reconnect_s,
        lost_in_nsqd_memory=len(lost),
        duplicates=sum(n - 1 for n in seen.values()),
    )
    # kill -9 loses what nsqd held in memory only: at most the messages in flight
    assert len(lost) <= 52
    # reconnected within a few of its delays (at most 1 s each), however busy the machine
    assert reconnect_s < 5.0, pressure.against_goal("reconnection", reconnect_s, 5.0)


async def kill_behind_lookupd(
    lib: ModuleType, way: tuple[str, str], target: Target, topic: str
) -> None:
    """kill -9 one of two nsqd behind lookupd: the other goes on; the first is found again
    soon after it restarts, not at the next poll (60 s)."""
    for address in target.nsqd_tcp_addresses:
        await publish_all(lib, address, topic, [b"x"] * 400)
    await anyio.sleep(0.3)  # registrations reach lookupd
    seen: Counter[str] = Counter()
    fresh: list[float] = []

    async def handler(message: Any) -> None:
        seen[message.nsqd_address] += 1
        if message.body == b"fresh" and not fresh:
            fresh.append(time.monotonic())

    first, second = target.nsqd_tcp_addresses
    async with lib.Consumer(
        topic, "c", lookupd_http_addresses=target.lookupd_http_addresses, max_in_flight=20
    ) as consumer:
        async with anyio.create_task_group() as tg:
            tg.start_soon(consumer.run, handler, 5)
            await until(lambda: seen[first] >= 50 and seen[second] >= 1)
            await target.kill(0)
            other = seen[second]
            await until(lambda: seen[second] > other + 50)  # the survivor goes on
            await anyio.sleep(2.0)
            await target.restart(0)
            restarted = time.monotonic()
            await publish_all(lib, first, topic, [b"fresh"])
            await until(lambda: bool(fresh))
            await consumer.stop()
    report(
        _name(target, "kill -9 one of two nsqd behind lookupd", way),
        rediscovery_s=fresh[0] - restarted,
    )
    assert fresh[0] - restarted < 10.0


async def producer_failover(
    lib: ModuleType, way: tuple[str, str], target: Target, topic: str
) -> None:
    """20 tasks publish through one producer over two nsqd; one nsqd is killed meanwhile:
    every acknowledged publish is there afterwards."""
    acked: list[bytes] = []
    failed = 0
    async with lib.Producer(
        nsqd_tcp_addresses=target.nsqd_tcp_addresses, reconnect_delay=0.2, publish_timeout=5.0
    ) as producer:

        async def publisher(k: int) -> None:
            nonlocal failed
            for i in range(60):
                body = b"%d-%d" % (k, i)
                try:
                    await producer.publish(topic, body)
                except lib.NSQError:
                    failed += 1
                else:
                    acked.append(body)
                if k == 0 and i == 15:
                    await target.kill(0)

        async with anyio.create_task_group() as tg:
            for k in range(20):
                tg.start_soon(publisher, k)
    await target.restart(0)
    seen: Counter[bytes] = Counter()
    async with lib.Consumer(
        topic, "c", nsqd_tcp_addresses=target.nsqd_tcp_addresses, max_in_flight=200
    ) as consumer:
        with anyio.move_on_after(WAIT):
            async for message in consumer:
                seen[message.body] += 1
                await message.finish()
                if all(b in seen for b in acked):
                    break
    missing = [b for b in acked if b not in seen]
    report(
        _name(target, "producer failover, kill -9 one of two", way),
        acked=len(acked),
        failed=failed,
        duplicates=sum(n - 1 for n in seen.values()),
        missing=len(missing),
    )
    assert not missing
    assert len(acked) >= 1100


async def slow_handlers(
    lib: ModuleType, way: tuple[str, str], target: Target, topic: str, touch: bool
) -> None:
    """Handlers slower than msg_timeout (1 s).  Without TOUCH, each handler holds its message
    until nsqd has delivered it again, and both copies are answered harmlessly; with TOUCH
    every 0.25 s for 7 s (past nsqd's 5 s queue-scan refresh, from which a new channel's
    timeouts fire), nothing is delivered twice."""
    address = target.nsqd_tcp_addresses[0]
    await publish_all(lib, address, topic, [b"%d" % i for i in range(5)])
    attempts: list[int] = []
    deliveries: list[tuple[bytes, int]] = []

    async def handler(message: Any) -> None:
        attempts.append(message.attempts)
        deliveries.append((message.body, message.attempts))
        if message.attempts == 1:
            if touch:
                for _ in range(28):
                    await anyio.sleep(0.25)
                    await message.touch()
            else:
                await until(lambda: (message.body, 2) in deliveries, timeout=15.0)

    async with lib.Consumer(
        topic, "c", nsqd_tcp_addresses=[address], max_in_flight=10, msg_timeout=1.0
    ) as consumer:
        async with anyio.create_task_group() as tg:
            tg.start_soon(consumer.run, handler, 10)
            await until(lambda: len(attempts) >= 5)
            await until(lambda: drained(target, 0, topic))
            await anyio.sleep(0.3)
            tg.cancel_scope.cancel()
        state = [s["state"] for s in consumer.stats()["connections"]]
    channel = target.channel(0, topic, "c")
    assert channel is not None
    report(
        _name(target, f"handlers past msg_timeout, touch={touch}", way),
        deliveries=len(attempts),
        timeouts=channel.timeout_count,
    )
    assert state == ["SUBSCRIBED"]  # no connection lost on the way
    if touch:
        assert sorted(attempts) == [1] * 5 and channel.timeout_count == 0
    else:
        assert sorted(attempts) == [1] * 5 + [2] * 5 and channel.timeout_count == 5


async def stop_under_load(
    lib: ModuleType, way: tuple[str, str], target: Target, topic: str, how: str
) -> None:
    """100 handlers at once, nsqd sending as fast as they answer; in the middle a graceful
    stop, a cancellation of ``run()`` (``"cancel"``), or of the scope around the consumer's
    ``async with`` (``"cancel-block"``: Ctrl-C, ``move_on_after`` around a service).  The stop
    is quick; once the block is left nsqd holds nothing in flight for this client (a closed
    connection's messages would otherwise wait for msg_timeout), everything a handler did not
    finish is back in the queue, and a second consumer gets the rest.

    The first handlers wait until 100 run at once (rather than sleeping 10 ms and counting on
    100 deliveries within those 10 ms, which a busy machine does not give); the waits after the
    stop last as long as nsqd's counters or the second consumer move."""
    address = target.nsqd_tcp_addresses[0]
    bodies = [b"%d" % i for i in range(5000)]
    await publish_all(lib, address, topic, bodies)
    pressure = CpuPressure()
    finished: Counter[bytes] = Counter()
    running = peak = 0
    all_running = anyio.Event()
    began = time.monotonic()
    reached_s = -1.0

    async def handler(message: Any) -> None:
        nonlocal running, peak, reached_s
        running += 1
        peak = max(peak, running)
        try:
            if running == CONCURRENCY and not all_running.is_set():
                reached_s = time.monotonic() - began
                all_running.set()
            with anyio.move_on_after(WAIT):
                await all_running.wait()
            all_running.set()  # if never reached, the others wait no more: the peak fails below
            await anyio.sleep(0.01)
        finally:
            running -= 1
        finished[message.body] += 1

    stopping = 0.0
    with anyio.CancelScope() as outer:
        async with lib.Consumer(
            topic, "c", nsqd_tcp_addresses=[address], max_in_flight=1000, stop_timeout=STOP_TIMEOUT
        ) as consumer:
            with anyio.CancelScope() as scope:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(consumer.run, handler, CONCURRENCY)
                    # (longer than the handlers wait for one another: a consumer that never runs 100
                    # at once fails on its peak below)
                    await until_still(
                        lambda: len(finished) >= 1000, lambda: len(finished), stall=2 * WAIT
                    )
                    stopping = time.monotonic()
                    if how == "stop":
                        await consumer.stop()
                    elif how == "cancel":
                        scope.cancel()
                    else:
                        outer.cancel()
                        await anyio.sleep_forever()
    stop_s = time.monotonic() - stopping
    handled = sum(finished.values())
    # what nsqd shows once the client is gone: nothing in flight (well before msg_timeout), the
    # rest queued again (an nsqd with its queue on disk copies a new channel's backlog at its
    # own pace: the wait lasts as long as its counters move)
    settled = await until(lambda: _in_flight(target, topic) == 0, timeout=SETTLE_BOUND + 5)
    await until_still(
        lambda: _depth(target, topic) == len(bodies) - handled,
        lambda: target.channel(0, topic, "c"),
    )
    rest: Counter[bytes] = Counter()
    left = set(bodies) - set(finished)
    async with lib.Consumer(topic, "c", nsqd_tcp_addresses=[address], max_in_flight=500) as c:
        # as long as messages keep coming
        moved = time.monotonic()
        with anyio.CancelScope() as reading:

            async def watchdog() -> None:
                while time.monotonic() - moved < WAIT:
                    await anyio.sleep(0.1)
                reading.cancel()

            async with anyio.create_task_group() as watch:
                watch.start_soon(watchdog)
                async for message in c:
                    moved = time.monotonic()
                    rest[message.body] += 1
                    await message.finish()
                    left.discard(message.body)
                    if not left:
                        break
                watch.cancel_scope.cancel()
    late = [
        line
        for line in (
            pressure.against_goal("stop", stop_s, STOP_GOAL),
            pressure.against_goal("nothing in flight after", settled, SETTLE_GOAL),
        )
        if line
    ]
    report(
        _name(target, f"{how} under load, concurrency 100", way),
        peak_concurrency=peak,
        all_running_after_s=reached_s,
        stop_s=stop_s,
        in_flight_zero_after_s=settled,
        **({"note": "; ".join(late)} if late else {}),
    )
    assert peak == CONCURRENCY, f"at most {peak} handlers ran at once ({pressure.describe()})"
    # a stop that finishes the handlers running and takes no more: not the stop_timeout
    assert stop_s < STOP_TIMEOUT / 2, "; ".join(late)
    assert settled < SETTLE_BOUND, "; ".join(late)  # not nsqd's msg_timeout (60 s)
    again = set(finished) & set(rest)
    assert not again, f"finished by a handler, then delivered again: {sorted(again)[:10]}"
    missing = set(bodies) - set(finished) - set(rest)
    assert not missing, (  # nothing lost
        f"{len(missing)} never delivered again (e.g. {sorted(missing)[:10]}): {handled} "
        f"handled before the {how}, {len(rest)} read by the second consumer, which got none "
        f"in its last {WAIT} s; nsqd's channel now: {target.channel(0, topic, 'c')}"
    )


#: the stop-under-load scenario: handlers at once; the stop's timeout, and the stop's figure
#: at most half of it (a stop that waited for it is a failure); what the stop and nsqd's
#: in-flight count should take on an idle machine (a figure above is reported, with how
#: starved the machine was); the bound on the latter, well below nsqd's msg_timeout (60 s)
CONCURRENCY = 100
STOP_TIMEOUT = 20.0
STOP_GOAL = 0.5
SETTLE_GOAL = 0.5
SETTLE_BOUND = 30.0


def _in_flight(target: Target, topic: str) -> int | None:
    c = target.channel(0, topic, "c")
    return None if c is None else c.in_flight_count


def _depth(target: Target, topic: str) -> int | None:
    c = target.channel(0, topic, "c")
    return None if c is None else c.depth
