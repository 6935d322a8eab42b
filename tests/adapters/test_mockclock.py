"""Timer-heavy scenarios on trio's MockClock: heartbeats, backoff, reconnect delays and lookupd
polling take minutes of virtual time and run instantly.  The network is in memory (the trio
backend with its TCP connect replaced), so the autojumping clock never waits for a socket."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from nsq_client import Consumer as AsyncConsumer
from nsq_client import Producer as AsyncProducer
from nsq_emulator import (
    Cluster,
    HttpServerConnection,
    Lookupd,
    Nsqd,
    NsqdConnection,
    NsqdOptions,
)
from nsq_trio._backend import TrioBackend


class _MemStream:
    def __init__(self, net: MemNet, server: NsqdConnection | HttpServerConnection) -> None:
        self.net = net
        self.server = server
        self.closed = False

    async def send(self, data: bytes) -> None:
        if self.closed or self.server.closed:
            raise trio.BrokenResourceError("peer closed")
        self.server.receive_data(data, trio.current_time())
        self.net.changed()
        await trio.lowlevel.checkpoint()

    async def receive(self) -> bytes:
        while True:
            if self.closed:
                raise trio.ClosedResourceError
            data = self.server.data_to_send()
            if data:
                return data
            if self.server.closed:
                return b""
            await self.net.wait_change()

    async def aclose(self) -> None:
        if not self.closed:
            self.closed = True
            if isinstance(self.server, NsqdConnection):
                self.server.connection_lost(trio.current_time())
            else:
                self.server.receive_data(b"", trio.current_time())
            self.net.changed()
        await trio.lowlevel.checkpoint()


class MemNet:
    """Emulated servers reachable at made-up addresses, and the task that runs their timers."""

    def __init__(self) -> None:
        self.nsqds: dict[tuple[str, int], Nsqd] = {}
        self.lookupds: dict[tuple[str, int], Lookupd] = {}
        self._event = trio.Event()

    def add_nsqd(self, n: int, lookupd: Lookupd | None = None, **options: Any) -> Nsqd:
        nsqd = Nsqd(
            NsqdOptions(broadcast_address=f"nsqd{n}", tcp_port=4150, http_port=4151, **options),
            now=trio.current_time(),
        )
        self.nsqds[(f"nsqd{n}", 4150)] = nsqd
        if lookupd is not None:
            lookupd.register(nsqd)
        return nsqd

    def add_lookupd(self) -> Lookupd:
        lookupd = Lookupd(broadcast_address="lookupd", http_port=4161)
        self.lookupds[("lookupd", 4161)] = lookupd
        return lookupd

    def add_cluster(self, cluster: Cluster) -> Cluster:
        for node in cluster.nodes:
            self.nsqds[(node.options.broadcast_address, node.options.tcp_port)] = node
        for lookupd in cluster.lookupds:
            self.lookupds[(lookupd.broadcast_address, lookupd.http_port)] = lookupd
        return cluster

    def changed(self) -> None:
        self._event.set()
        self._event = trio.Event()

    async def wait_change(self) -> None:
        await self._event.wait()

    def connect(self, host: str, port: int) -> _MemStream:
        now = trio.current_time()
        if (host, port) in self.nsqds:
            return _MemStream(self, self.nsqds[(host, port)].accept(now))
        if (host, port) in self.lookupds:
            return _MemStream(self, self.lookupds[(host, port)].http_connection(now))
        raise ConnectionRefusedError(f"nothing listens on {host}:{port}")

    async def run_timers(self) -> None:
        while True:
            now = trio.current_time()
            for nsqd in self.nsqds.values():
                nsqd.handle_timer(now)
            self.changed()
            deadlines = [d for n in self.nsqds.values() if (d := n.next_deadline()) is not None]
            with trio.move_on_at(min(deadlines, default=now + 3600)):
                await self.wait_change()


class MemBackend(TrioBackend):
    def __init__(self, net: MemNet) -> None:
        self.net = net

    async def connect_tcp(self, host: str, port: int) -> Any:
        await trio.lowlevel.checkpoint()
        return self.net.connect(host, port)


def run(test: Any) -> None:
    trio.run(test, clock=trio.testing.MockClock(autojump_threshold=0))


async def _with_net(body: Any) -> None:
    net = MemNet()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(net.run_timers)
        await body(net, MemBackend(net))
        nursery.cancel_scope.cancel()


async def publish(backend: MemBackend, address: str, topic: str, *bodies: bytes) -> None:
    async with AsyncProducer(backend=backend, nsqd_tcp_addresses=[address]) as producer:
        await producer.publish_many(topic, list(bodies))


def test_heartbeats_keep_a_quiet_consumer_connected_for_minutes() -> None:
    async def body(net: MemNet, backend: MemBackend) -> None:
        nsqd = net.add_nsqd(1)
        async with AsyncConsumer(
            "t", "c", backend=backend, nsqd_tcp_addresses=["nsqd1:4150"]
        ) as consumer:
            start = trio.current_time()
            await trio.sleep(600)  # twenty default heartbeat intervals
            assert trio.current_time() - start >= 600
            (client,) = [s for s in nsqd.client_stats() if not s.closed]
            await publish(backend, "nsqd1:4150", "t", b"hello")
            with trio.fail_after(5):
                message = await consumer.__anext__()
            await message.finish()
            assert next(s.id for s in nsqd.client_stats() if not s.closed) == client.id

    run(lambda: _with_net(body))


def test_backoff_grows_with_failures_and_recovers() -> None:
    async def body(net: MemNet, backend: MemBackend) -> None:
        net.add_nsqd(1)
        await publish(backend, "nsqd1:4150", "t", *[b"%d" % i for i in range(6)])
        levels: list[int] = []
        results = iter([False, False, False, True, True, True, True, True, True])

        async def handler(message: Any) -> None:
            levels.append(consumer.stats()["backoff_level"])
            if not next(results, True):
                await message.requeue(delay=0.0)

        async with AsyncConsumer(
            "t", "c", backend=backend, nsqd_tcp_addresses=["nsqd1:4150"], max_in_flight=1
        ) as consumer:
            start = trio.current_time()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(consumer.run, handler, 1)
                while consumer.stats()["messages_finished"] < 6:
                    await trio.sleep(1)
                nursery.cancel_scope.cancel()
            elapsed = trio.current_time() - start
        # three failures in a row: levels 1, 2, 3 (waits of 2, 4 and 8 s), then each success
        # brings it down one level at a time
        assert levels[:4] == [0, 1, 2, 3]
        assert consumer.stats()["backoff_level"] == 0
        assert elapsed >= 2 + 4 + 8

    run(lambda: _with_net(body))


def test_reconnect_after_the_backoff_delay() -> None:
    async def body(net: MemNet, backend: MemBackend) -> None:
        nsqd = net.add_nsqd(1)
        async with AsyncConsumer(
            "t", "c", backend=backend, nsqd_tcp_addresses=["nsqd1:4150"], reconnect_jitter=0.0
        ) as consumer:
            await trio.sleep(1)
            nsqd.stop(trio.current_time())
            net.changed()
            stopped_at = trio.current_time()
            await trio.sleep(20)  # reconnects at 8 s (refused), then 16 s later
            nsqd.start(trio.current_time())
            net.changed()
            await publish(backend, "nsqd1:4150", "t", b"back")
            with trio.fail_after(60):
                message = await consumer.__anext__()
            await message.finish()
            assert message.body == b"back"
            # 8 s after the loss, then 16 s after the refused attempt
            assert trio.current_time() - stopped_at >= 8 + 16

    run(lambda: _with_net(body))


def test_lookupd_poll_finds_a_new_nsqd_within_a_jittered_interval() -> None:
    async def body(net: MemNet, backend: MemBackend) -> None:
        lookupd = net.add_lookupd()
        net.add_nsqd(1, lookupd)
        await publish(backend, "nsqd1:4150", "t", b"first")
        async with AsyncConsumer(
            "t", "c", backend=backend, lookupd_http_addresses=["lookupd:4161"], max_in_flight=4
        ) as consumer:
            with trio.fail_after(5):
                message = await consumer.__anext__()
            await message.finish()
            net.add_nsqd(2, lookupd)
            await publish(backend, "nsqd2:4150", "t", b"second")
            added = trio.current_time()
            with trio.fail_after(120):
                message = await consumer.__anext__()
            await message.finish()
            assert message.body == b"second"
            waited = trio.current_time() - added
            # the next poll comes 60 s (+ up to 30 % jitter) after the first one
            assert 50 <= waited <= 60 * 1.3 + 1

    run(lambda: _with_net(body))


@pytest.mark.parametrize("seconds", [5.0, 65.0])
def test_graceful_stop_waits_for_the_application_then_requeues(seconds: float) -> None:
    async def body(net: MemNet, backend: MemBackend) -> None:
        nsqd = net.add_nsqd(1)
        await publish(backend, "nsqd1:4150", "t", b"held")
        async with AsyncConsumer(
            "t", "c", backend=backend, nsqd_tcp_addresses=["nsqd1:4150"], stop_timeout=30.0
        ) as consumer:
            message = await consumer.__anext__()

            async def answer_late() -> None:
                await trio.sleep(seconds)
                if not message.has_responded:
                    await message.finish()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(answer_late)
                await consumer.stop()
        stats = nsqd.channel_stats("t", "c")
        if seconds < 30:
            assert (stats.depth, stats.requeue_count) == (0, 0)  # finished during the stop
        else:
            assert stats.depth == 1 and stats.requeue_count == 1  # requeued at the timeout

    run(lambda: _with_net(body))


def test_partitioned_topic_through_the_public_api() -> None:
    """Sharding keys, traced publishes and ordered consumption on the partitioned server."""

    async def body(net: MemNet, backend: MemBackend) -> None:
        cluster = net.add_cluster(Cluster(nodes=2, now=trio.current_time()))
        cluster.create_topic("orders", trio.current_time(), partitions=2, ordered=True)
        cluster.create_channel("orders", "c", trio.current_time())
        lookupd = ["127.0.0.1:4161"]
        sent: list[bytes] = []
        async with AsyncProducer(backend=backend, lookupd_http_addresses=lookupd) as producer:
            for n in range(20):
                key = f"customer-{n % 4}"
                data = f"{key}:{n}".encode()
                receipt = await producer.publish("orders", data, sharding_key=key, trace_id=n + 1)
                assert receipt is not None and receipt.trace_id == n + 1
                sent.append(data)
            await producer.publish_many("orders", [b"p1:a", b"p1:b"], partition=1)
            sent += [b"p1:a", b"p1:b"]
        got: list[Any] = []
        async with AsyncConsumer(
            "orders",
            "c",
            backend=backend,
            lookupd_http_addresses=lookupd,
            ordered=True,
            max_in_flight=8,
        ) as consumer:
            with trio.fail_after(30):
                async for message in consumer:
                    got.append(message)
                    await message.finish()
                    if len(got) == len(sent):
                        break
        assert sorted(m.body for m in got) == sorted(sent)
        for partition in (0, 1):
            bodies = [m.body for m in got if m.partition == partition]
            assert bodies == [b for b in sent if b in bodies]  # publish order per partition
        traced = {m.body: m.trace_id for m in got}
        assert traced[b"customer-1:5"] == 6
        assert traced[b"p1:a"] == 0
        by_key: dict[bytes, set[int | None]] = {}
        for m in got:
            by_key.setdefault(m.body.split(b":")[0], set()).add(m.partition)
        assert all(len(p) == 1 for p in by_key.values())

    run(lambda: _with_net(body))


def test_stop_with_a_timed_out_message_waiting_twice_in_the_inbox() -> None:
    async def body(net: MemNet, backend: MemBackend) -> None:
        nsqd = net.add_nsqd(1)
        await publish(backend, "nsqd1:4150", "t", b"slow")
        async with AsyncConsumer(
            "t", "c", backend=backend, nsqd_tcp_addresses=["nsqd1:4150"], msg_timeout=1.0
        ):
            # never taken: delivered, timed out (nsqd scans a new channel's timeouts from
            # its first 5 s refresh tick on), delivered again
            await trio.sleep(7.0)
        stats = nsqd.channel_stats("t", "c")
        assert stats.timeout_count >= 1
        assert (stats.depth, stats.in_flight_count) == (1, 0)

    run(lambda: _with_net(body))


def test_extension_headers_through_the_public_api() -> None:
    async def body(net: MemNet, backend: MemBackend) -> None:
        cluster = net.add_cluster(Cluster(nodes=1, now=trio.current_time()))
        cluster.create_topic("events", trio.current_time(), partitions=1, ext=True)
        cluster.create_channel("events", "c", trio.current_time())
        lookupd = ["127.0.0.1:4161"]
        async with AsyncProducer(backend=backend, lookupd_http_addresses=lookupd) as producer:
            receipt = await producer.publish("events", b"a", ext={"kind": "x"}, trace_id=5)
            assert receipt is not None and receipt.trace_id == 5
            assert await producer.publish_many("events", [b"b"], ext={"kind": "y"}) is None
        async with AsyncConsumer(
            "events", "c", backend=backend, lookupd_http_addresses=lookupd
        ) as c:
            got = []
            with trio.fail_after(30):
                async for message in c:
                    got.append((message.body, message.ext, message.trace_id))
                    await message.finish()
                    if len(got) == 2:
                        break
        assert sorted(got) == [
            (b"a", {"kind": "x", "##trace_id": "5"}, 5),
            (b"b", {"kind": "y"}, 0),
        ]

    run(lambda: _with_net(body))
