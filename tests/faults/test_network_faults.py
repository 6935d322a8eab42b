"""Network faults between the client and a real nsqd, through ``nsq_emulator.proxy.FaultProxy``
on loopback, on every adapter: a half-open nsqd (no byte moves, the sockets stay open) while
consuming and while publishing, a delay, bytes trickled a few at a time, a reset in the middle
of a frame, failover to the other nsqd.  Each asserts what a user sees: the dead connection
dropped within two heartbeats and its socket closed at once, nothing acknowledged lost, no
``publish()`` waiting past ``publish_timeout``.  Runs when ``NSQD`` and ``NSQLOOKUPD`` point at
the binaries; skipped otherwise, with the reason."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import anyio
import pytest

from nsq_emulator.proxy import FaultProxy
from tests.support.servers import MISSING, NSQD, NSQLOOKUPD, Nsqd

from ._figures import report
from ._scenarios import WAIT, until

pytestmark = [
    pytest.mark.real_nsqd,
    pytest.mark.anyio,
    pytest.mark.skipif(not (NSQD and NSQLOOKUPD), reason=MISSING),
]

#: the heartbeat interval asked for: nsqd sends one a second, so a connection is judged dead
#: after two seconds without a byte
HEARTBEAT = 1.0
DEAD_AFTER = 2 * HEARTBEAT
#: what a busy two-core machine may add to any wait
SLACK = 3.0
PUBLISH_TIMEOUT = 3.0


@pytest.fixture
def topic(way: tuple[str, str]) -> str:
    return f"n_{way[0]}_{way[1]}_{uuid.uuid4().hex[:8]}"


@pytest.fixture
def nsqd() -> Iterator[Nsqd]:
    server = Nsqd()
    server.start()
    yield server
    server.cleanup()


@pytest.fixture
def nsqds() -> Iterator[list[Nsqd]]:
    servers = [Nsqd(), Nsqd()]
    try:
        for server in servers:
            server.start()
        yield servers
    finally:
        for server in servers:
            server.cleanup()


def now() -> float:
    return anyio.current_time()


async def eventually(predicate: Callable[[], object], timeout: float) -> bool:
    """Whether ``predicate()`` came true within ``timeout`` seconds (the test goes on either
    way, to report what it measured before it asserts)."""
    with anyio.move_on_after(timeout):
        while not predicate():
            await anyio.sleep(0.02)
        return True
    return False


async def publish_direct(lib: ModuleType, address: str, topic: str, bodies: list[bytes]) -> None:
    async with lib.Producer(nsqd_tcp_addresses=[address]) as producer:
        for i in range(0, len(bodies), 100):
            await producer.publish_many(topic, bodies[i : i + 100])


async def consume_direct(
    lib: ModuleType, addresses: list[str], topic: str, wanted: set[bytes]
) -> Counter[bytes]:
    """What nsqd holds for ``topic`` (channel ``check``), read until ``wanted`` is all there
    (or ``WAIT`` seconds passed)."""
    seen: Counter[bytes] = Counter()
    if not wanted:
        return seen
    async with lib.Consumer(
        topic, "check", nsqd_tcp_addresses=addresses, max_in_flight=100
    ) as consumer:
        with anyio.move_on_after(WAIT):
            async for message in consumer:
                seen[message.body] += 1
                await message.finish()
                if wanted <= seen.keys():
                    break
    return seen


@dataclass
class Outcome:
    body: bytes
    started: float
    ended: float
    error: BaseException | None


class Publishers:
    """``n`` tasks, each publishing one message at a time in a loop until stopped, every
    publish's outcome kept."""

    def __init__(self, producer: Any, topic: str, size: int) -> None:
        self.producer = producer
        self.topic = topic
        self.pad = b"." * max(0, size - 16)
        self.outcomes: list[Outcome] = []
        self.stopping = False

    async def run(self, k: int, errors: tuple[type[BaseException], ...]) -> None:
        i = 0
        while not self.stopping:
            body = b"%d-%d:" % (k, i) + self.pad
            i += 1
            started = now()
            error: BaseException | None = None
            try:
                await self.producer.publish(self.topic, body)
            except errors as exc:
                error = exc
                await anyio.sleep(0.05)
            self.outcomes.append(Outcome(body, started, now(), error))

    def acked(self, since: float = -1.0) -> list[bytes]:
        return [o.body for o in self.outcomes if o.error is None and o.started >= since]

    def failed(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.error is not None]

    def longest(self) -> float:
        return max(o.ended - o.started for o in self.outcomes)


# ---------------------------------------------------------------------------------- half-open


async def test_half_open_mid_consume(
    nsqd: Nsqd, lib: ModuleType, way: tuple[str, str], topic: str
) -> None:
    """nsqd goes silent mid-consume (the proxy moves no byte, its sockets stay open): the
    consumer drops the connection within two heartbeats and closes its socket at once; once
    the network heals it reconnects and every message is consumed."""
    bodies = [b"%d" % i for i in range(300)]
    await publish_direct(lib, nsqd.tcp_address, topic, bodies)
    seen: Counter[bytes] = Counter()

    async def handler(message: Any) -> None:
        seen[message.body] += 1
        await anyio.sleep(0.01)

    async with FaultProxy(nsqd.tcp_address) as proxy:
        async with lib.Consumer(
            topic,
            "c",
            nsqd_tcp_addresses=[proxy.address],
            heartbeat_interval=HEARTBEAT,
            handshake_timeout=2.0,
            max_in_flight=10,
            reconnect_delay=0.5,
            max_reconnect_delay=1.0,
            msg_timeout=3.0,  # what nsqd had sent into the silence comes back soon after
        ) as consumer:
            async with anyio.create_task_group() as tg:
                tg.start_soon(consumer.run, handler, 5)
                await until(lambda: len(seen) >= 50)
                first = proxy.connections[0]
                proxy.half_open()
                halted = now()
                await until(lambda: consumer.stats()["last_error"] is not None)
                judged = now()
                error = consumer.stats()["last_error"]
                await eventually(lambda: first.client_closed_at is not None, DEAD_AFTER + SLACK)
                proxy.heal()
                healed = now()
                await until(lambda: seen.keys() >= set(bodies))
                done = now()
                tg.cancel_scope.cancel()
    closed_after = None if first.client_closed_at is None else first.client_closed_at - halted
    report(
        f"real nsqd: half-open mid-consume [{way[0]}/{way[1]}]",
        dropped_after_s=judged - halted,
        socket_closed_after_s=closed_after,
        all_consumed_after_heal_s=done - healed,
        redelivered=sum(n - 1 for n in seen.values()),
    )
    assert error is not None and f"nothing received from nsqd for {DEAD_AFTER} s" in error
    assert judged - halted < DEAD_AFTER + SLACK
    # its socket closed at once, not when the dead peer lets it
    assert closed_after is not None and closed_after < DEAD_AFTER + SLACK
    assert first.client_closed_at is not None and first.client_closed_at <= judged + 1.0


@pytest.mark.parametrize("size", [200, 512 * 1024], ids=["200B", "512KiB"])
async def test_half_open_mid_publish(
    nsqd: Nsqd, lib: ModuleType, way: tuple[str, str], topic: str, size: int
) -> None:
    """nsqd goes silent while 40 tasks publish (40 bodies of 512 KiB in flight fill the socket
    buffers towards it, and a write waits): every publish returns or raises within ``publish_timeout``, the connection is
    dropped within two heartbeats and its socket closed at once; once the network heals
    publishing goes on, and every acknowledged message is in nsqd."""
    async with FaultProxy(nsqd.tcp_address) as proxy:
        async with lib.Producer(
            nsqd_tcp_addresses=[proxy.address],
            heartbeat_interval=HEARTBEAT,
            handshake_timeout=2.0,
            publish_timeout=PUBLISH_TIMEOUT,
            reconnect_delay=0.5,
            max_reconnect_delay=1.0,
            max_outstanding=40,
        ) as producer:
            publishers = Publishers(producer, topic, size)
            with anyio.fail_after(WAIT + 30):
                async with anyio.create_task_group() as tg:
                    for k in range(40):
                        tg.start_soon(publishers.run, k, (lib.NSQError,))
                    await until(lambda: len(publishers.acked()) >= 20)
                    first = proxy.connections[0]
                    proxy.half_open()
                    halted = now()
                    await eventually(lambda: first.client_closed_at is not None, DEAD_AFTER + SLACK)
                    await until(lambda: len(publishers.failed()) >= 1)
                    proxy.heal()
                    healed = now()
                    await until(lambda: len(publishers.acked(since=healed)) >= 20)
                    publishers.stopping = True
    acked = publishers.acked()
    seen = await consume_direct(lib, [nsqd.tcp_address], topic, set(acked))
    closed_after = None if first.client_closed_at is None else first.client_closed_at - halted
    report(
        f"real nsqd: half-open mid-publish, {size} B bodies [{way[0]}/{way[1]}]",
        socket_closed_after_s=closed_after,
        longest_publish_s=publishers.longest(),
        acked=len(acked),
        failed=len(publishers.failed()),
    )
    # its socket closed at once, not when the dead peer lets it (never, with full buffers)
    assert closed_after is not None and closed_after < DEAD_AFTER + SLACK
    assert publishers.longest() < PUBLISH_TIMEOUT + SLACK
    for outcome in publishers.failed():
        assert isinstance(outcome.error, lib.ConnectionClosedError | lib.PublishTimeout), (
            outcome.error
        )
    missing = [b[:12] for b in acked if b not in seen]
    assert not missing, f"{len(missing)} acknowledged, not in nsqd: {missing[:5]}"
