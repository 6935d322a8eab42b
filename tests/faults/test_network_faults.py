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
    buffers towards it, and a write waits): every publish returns or raises within
    ``publish_timeout``, the connection is dropped within two heartbeats and its socket
    closed at once; once the network heals publishing goes on, and every acknowledged
    message is in nsqd."""
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


async def test_no_publish_waits_past_publish_timeout_for_a_write_to_a_silent_nsqd(
    nsqd: Nsqd, lib: ModuleType, way: tuple[str, str], topic: str
) -> None:
    """nsqd goes silent with the default heartbeat (30 s: the connection is not judged dead
    for a minute) while 40 bodies of 512 KiB fill the socket buffers towards it: a write then
    waits on the peer, and each publish still returns or raises within ``publish_timeout``
    (3 s, below the write timeout of 10 s), not when the write gives up."""
    outcomes: list[tuple[str, float]] = []
    async with FaultProxy(nsqd.tcp_address) as proxy:
        async with lib.Producer(
            nsqd_tcp_addresses=[proxy.address],
            publish_timeout=PUBLISH_TIMEOUT,
            max_outstanding=40,
        ) as producer:
            await producer.publish(topic, b"connected")
            proxy.half_open()

            async def publish() -> None:
                started = now()
                try:
                    await producer.publish(topic, b"y" * 512 * 1024)
                    outcomes.append(("ok", now() - started))
                except lib.NSQError as exc:
                    outcomes.append((type(exc).__name__, now() - started))

            with anyio.fail_after(WAIT + 30):
                async with anyio.create_task_group() as tg:
                    for _ in range(40):
                        tg.start_soon(publish)
    longest = max(seconds for _, seconds in outcomes)
    report(
        f"real nsqd: silent mid-publish, default heartbeat [{way[0]}/{way[1]}]",
        longest_publish_s=longest,
        outcomes=sorted(Counter(kind for kind, _ in outcomes).items()),
    )
    assert len(outcomes) == 40
    assert longest < PUBLISH_TIMEOUT + SLACK, sorted(outcomes, key=lambda o: o[1])[-3:]


# ---------------------------------------------------------------------------------- delay


async def test_a_round_trip_delay(
    nsqd: Nsqd, lib: ModuleType, way: tuple[str, str], topic: str
) -> None:
    """100 ms each way (a tenth of the heartbeat interval): ten tasks publish and a consumer
    consumes through it for three heartbeats; no connection is lost, every publish takes at
    least the round trip, and every message is consumed."""
    seen: Counter[bytes] = Counter()

    async def handler(message: Any) -> None:
        seen[message.body] += 1

    async with FaultProxy(nsqd.tcp_address) as proxy:
        proxy.delay(0.1)
        async with (
            lib.Producer(
                nsqd_tcp_addresses=[proxy.address],
                heartbeat_interval=HEARTBEAT,
                publish_timeout=PUBLISH_TIMEOUT + SLACK,
            ) as producer,
            lib.Consumer(
                topic,
                "c",
                nsqd_tcp_addresses=[proxy.address],
                heartbeat_interval=HEARTBEAT,
                max_in_flight=50,
            ) as consumer,
        ):
            publishers = Publishers(producer, topic, 200)
            async with anyio.create_task_group() as tg:
                tg.start_soon(consumer.run, handler, 10)
                async with anyio.create_task_group() as publishing:
                    for k in range(10):
                        publishing.start_soon(publishers.run, k, (lib.NSQError,))
                    await anyio.sleep(3 * HEARTBEAT)
                    publishers.stopping = True
                acked = publishers.acked()
                await until(lambda: seen.keys() >= set(acked))
                tg.cancel_scope.cancel()
            consumer_error = consumer.stats()["last_error"]
    shortest = min(o.ended - o.started for o in publishers.outcomes)
    report(
        f"real nsqd: 200 ms round trip [{way[0]}/{way[1]}]",
        published=len(acked),
        shortest_publish_s=shortest,
        longest_publish_s=publishers.longest(),
    )
    assert not publishers.failed()
    assert consumer_error is None  # the consumer lost no connection
    assert shortest >= 0.2
    assert len(proxy.connections) == 2  # one each, never replaced


async def test_a_cancelled_consumer_reads_on_while_nsqd_still_sends_across_a_slow_path(
    nsqd: Nsqd, lib: ModuleType, way: tuple[str, str], topic: str
) -> None:
    """750 ms each way, messages arriving steadily (one handler of 5 ms at a time), and the
    consumer's block cancelled: nsqd reads the CLS 750 ms later and its CLOSE_WAIT comes back
    after 1.5 s, more than REQUEUE_GRACE, while what it sent meanwhile keeps arriving.  The
    consumer reads on as long as bytes come, requeueing each message, so that once the block
    is left nsqd holds nothing in flight for it (not until msg_timeout) and every message not
    finished is queued again."""
    count = 3000
    await publish_direct(lib, nsqd.tcp_address, topic, [b"%d" % i for i in range(count)])
    finished: set[bytes] = set()

    async def handler(message: Any) -> None:
        await anyio.sleep(0.005)
        finished.add(message.body)

    async with FaultProxy(nsqd.tcp_address) as proxy:
        proxy.delay(0.75)
        with anyio.CancelScope() as outer:
            async with lib.Consumer(
                topic, "c", nsqd_tcp_addresses=[proxy.address], max_in_flight=400
            ) as consumer:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(consumer.run, handler, 1)
                    # a round trip and a half of steady flow (FINs, then what they freed)
                    await until(lambda: len(finished) >= 300)
                    cancelled = now()
                    outer.cancel()
                    await anyio.sleep_forever()
        stop_s = now() - cancelled

        def settled() -> bool:
            c = nsqd.channel(topic, "c")
            return c is not None and c["in_flight_count"] == 0

        quiet = await eventually(settled, SLACK)
        channel = nsqd.channel(topic, "c")
    report(
        f"real nsqd: cancelled across 1.5 s round trip [{way[0]}/{way[1]}]",
        stop_s=stop_s,
        in_flight_after=channel and channel["in_flight_count"],
    )
    assert channel is not None
    assert quiet, f"{channel['in_flight_count']} messages left in flight at nsqd"
    assert channel["depth"] == count - len(finished)
    # it waited for the CLOSE_WAIT (a round trip), not for the stop timeout
    assert 1.5 <= stop_s < 1.5 + SLACK


# ---------------------------------------------------------------------------------- trickle


async def test_bytes_trickled_a_few_at_a_time(
    nsqd: Nsqd, lib: ModuleType, way: tuple[str, str], topic: str
) -> None:
    """Every byte both ways in pieces of 3, 1 ms apart (frames arrive cut anywhere, the
    handshake's too): publishing and consuming work, and every message arrives whole."""
    bodies = [b"%03d:" % i + bytes(range(32, 127)) for i in range(20)]
    seen: list[bytes] = []
    async with FaultProxy(nsqd.tcp_address) as proxy:
        proxy.trickle(3, 0.001)
        async with lib.Producer(
            nsqd_tcp_addresses=[proxy.address], heartbeat_interval=HEARTBEAT
        ) as producer:
            for body in bodies:
                await producer.publish(topic, body)
        async with lib.Consumer(
            topic, "c", nsqd_tcp_addresses=[proxy.address], heartbeat_interval=HEARTBEAT
        ) as consumer:
            with anyio.fail_after(WAIT):
                async for message in consumer:
                    seen.append(message.body)
                    await message.finish()
                    if len(seen) == len(bodies):
                        break
            error = consumer.stats()["last_error"]
    report(
        f"real nsqd: bytes trickled 3 at a time [{way[0]}/{way[1]}]",
        bytes_to_client=proxy.bytes_to_client,
        bytes_to_server=proxy.bytes_to_server,
    )
    assert sorted(seen) == sorted(bodies)
    assert error is None and len(proxy.connections) == 2


# ---------------------------------------------------------------------------------- resets


async def test_a_reset_in_the_middle_of_a_message_frame(
    nsqd: Nsqd, lib: ModuleType, way: tuple[str, str], topic: str
) -> None:
    """The connection is reset 100 bytes into a 1,000-byte message frame: the consumer sees
    a reset (not a protocol error), connects again, and gets the message whole once nsqd
    gives it again (at the message's timeout: nsqd keeps a gone client's messages in flight
    until then)."""
    body = bytes(range(256)) * 4
    got: list[Any] = []

    async def handler(message: Any) -> None:
        got.append(message)

    async with FaultProxy(nsqd.tcp_address) as proxy:
        async with lib.Consumer(
            topic,
            "c",
            nsqd_tcp_addresses=[proxy.address],
            heartbeat_interval=30.0,  # no heartbeat comes first
            msg_timeout=2.0,
            reconnect_delay=0.2,
            max_reconnect_delay=0.5,
        ) as consumer:
            async with anyio.create_task_group() as tg:
                tg.start_soon(consumer.run, handler, 1)
                await until(lambda: consumer.stats()["total_rdy"] > 0)
                proxy.reset_after(100, "to_client")
                await publish_direct(lib, nsqd.tcp_address, topic, [body])
                await until(lambda: bool(got))
                tg.cancel_scope.cancel()
            error = consumer.stats()["last_error"]
    first = proxy.connections[0]
    report(
        f"real nsqd: reset mid-frame [{way[0]}/{way[1]}]",
        error=error,
        bytes_before_the_reset=first.bytes_to_client,
    )
    assert first.reset_at is not None and len(proxy.connections) >= 2
    assert error is not None and "reset" in error.lower(), error
    assert got[0].body == body and got[0].attempts == 2


async def test_a_reset_in_the_middle_of_a_publish(
    nsqd: Nsqd, lib: ModuleType, way: tuple[str, str], topic: str
) -> None:
    """The connection is reset 50 bytes into a PUB of 1,000 bytes: that publish returns
    (tried again on a new connection) or raises, the next ones go through, and nsqd holds
    each acknowledged message once."""
    body = b"p" * 1000
    async with FaultProxy(nsqd.tcp_address) as proxy:
        async with lib.Producer(
            nsqd_tcp_addresses=[proxy.address], reconnect_delay=0.2, publish_timeout=10.0
        ) as producer:
            await producer.publish(topic, b"first")
            proxy.reset_after(50, "to_server")
            error: BaseException | None = None
            with anyio.fail_after(WAIT):
                try:
                    await producer.publish(topic, b"cut:" + body)
                except lib.NSQError as exc:
                    error = exc
                await producer.publish(topic, b"after")
    wanted = {b"first", b"after"} | ({b"cut:" + body} if error is None else set())
    seen = await consume_direct(lib, [nsqd.tcp_address], topic, wanted)
    report(f"real nsqd: reset mid-publish [{way[0]}/{way[1]}]", cut_publish_raised=error)
    assert proxy.connections[0].reset_at is not None
    assert error is None or isinstance(error, lib.ConnectionClosedError), error
    assert {b: n for b, n in seen.items() if b in wanted} == dict.fromkeys(wanted, 1)


# ---------------------------------------------------------------------------------- failover


async def test_a_half_open_nsqd_of_two_fails_over(
    nsqds: list[Nsqd], lib: ModuleType, way: tuple[str, str], topic: str
) -> None:
    """Ten tasks publish through one producer given two nsqd, each behind a proxy; the first
    goes silent: publishing goes on through the second within two heartbeats and a few
    seconds, no publish waits past publish_timeout, and every acknowledged message is in
    one of them."""
    async with FaultProxy(nsqds[0].tcp_address) as silent, FaultProxy(nsqds[1].tcp_address) as ok:
        async with lib.Producer(
            nsqd_tcp_addresses=[silent.address, ok.address],
            heartbeat_interval=HEARTBEAT,
            handshake_timeout=2.0,
            publish_timeout=PUBLISH_TIMEOUT,
            reconnect_delay=0.5,
            max_reconnect_delay=1.0,
        ) as producer:
            publishers = Publishers(producer, topic, 200)
            async with anyio.create_task_group() as tg:
                for k in range(10):
                    tg.start_soon(publishers.run, k, (lib.NSQError,))
                await until(lambda: silent.bytes_to_client > 0 and len(publishers.acked()) >= 50)
                silent.half_open()
                halted = now()
                over = DEAD_AFTER + SLACK
                await until(lambda: len(publishers.acked(since=halted + over)) >= 100)
                publishers.stopping = True
    acked = publishers.acked()
    addresses = [n.tcp_address for n in nsqds]
    seen = await consume_direct(lib, addresses, topic, set(acked))
    report(
        f"real nsqd: half-open nsqd of two, producer failover [{way[0]}/{way[1]}]",
        acked=len(acked),
        failed=len(publishers.failed()),
        longest_publish_s=publishers.longest(),
    )
    assert publishers.longest() < PUBLISH_TIMEOUT + SLACK
    missing = [b[:12] for b in acked if b not in seen]
    assert not missing, f"{len(missing)} acknowledged, not in nsqd: {missing[:5]}"


async def test_a_consumer_of_two_nsqd_goes_on_with_the_other_when_one_goes_silent(
    nsqds: list[Nsqd], lib: ModuleType, way: tuple[str, str], topic: str
) -> None:
    """A consumer of two nsqd (each behind a proxy); the first goes silent: its connection is
    dropped within two heartbeats, and what is published to the second meanwhile is consumed
    without waiting for the first."""
    seen: Counter[bytes] = Counter()

    async def handler(message: Any) -> None:
        seen[message.body] += 1

    async with FaultProxy(nsqds[0].tcp_address) as silent, FaultProxy(nsqds[1].tcp_address) as ok:
        async with lib.Consumer(
            topic,
            "c",
            nsqd_tcp_addresses=[silent.address, ok.address],
            heartbeat_interval=HEARTBEAT,
            handshake_timeout=2.0,
            max_in_flight=20,
            reconnect_delay=0.5,
            max_reconnect_delay=1.0,
        ) as consumer:
            async with anyio.create_task_group() as tg:
                tg.start_soon(consumer.run, handler, 5)
                for i, nsqd in enumerate(nsqds):
                    await publish_direct(lib, nsqd.tcp_address, topic, [b"before-%d" % i])
                await until(lambda: len(seen) == 2)
                silent.half_open()
                halted = now()
                during = [b"during-%d" % i for i in range(100)]
                await publish_direct(lib, nsqds[1].tcp_address, topic, during)
                await until(lambda: seen.keys() >= set(during))
                consumed = now()
                await until(lambda: consumer.stats()["last_error"] is not None)
                dropped = now()
                tg.cancel_scope.cancel()
    report(
        f"real nsqd: half-open nsqd of two, consumer [{way[0]}/{way[1]}]",
        other_consumed_after_s=consumed - halted,
        dropped_after_s=dropped - halted,
    )
    assert dropped - halted < DEAD_AFTER + SLACK
