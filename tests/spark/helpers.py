"""Helpers of the Spark tests: the emulator driven from test threads, polling."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from anyio.from_thread import BlockingPortal

import nsq_anyio
from nsq_emulator import ChannelStats, MessageInfo, TopicStats
from nsq_emulator.loopback import EmulatorCluster

T = TypeVar("T")


class Emulator:
    """The emulated nsqd, driven from test threads through the portal of its loop."""

    def __init__(self, portal: BlockingPortal, cluster: EmulatorCluster) -> None:
        self.portal = portal
        self.cluster = cluster
        self.address = cluster.nsqd_tcp_addresses[0]
        self.http_address = cluster.nsqd_http_addresses[0]
        self.nsqd = cluster.nsqds[0]

    def on_loop(self, func: Callable[..., T], *args: Any) -> T:
        async def run() -> T:
            return func(*args)

        return self.portal.call(run)

    def stop_nsqd(self) -> None:
        """Stop the nsqd (its connections closed, its queues kept as on disk)."""

        def stop() -> None:
            self.nsqd.stop(self.cluster.now())
            self.cluster.kick()

        self.on_loop(stop)

    def start_nsqd(self) -> None:
        """Start the stopped nsqd again, on the same port."""

        def start() -> None:
            self.nsqd.start(self.cluster.now())
            self.cluster.kick()

        self.on_loop(start)

    def publish(self, topic: str, bodies: list[bytes]) -> None:
        async def run() -> None:
            async with nsq_anyio.Producer(nsqd_tcp_addresses=[self.address]) as producer:
                for i in range(0, len(bodies), 100):
                    await producer.publish_many(topic, bodies[i : i + 100])

        self.portal.call(run)

    def consume(self, topic: str, channel: str, n: int, timeout: float = 20.0) -> list[Any]:
        """Take (and FIN) ``n`` messages."""
        import anyio

        async def run() -> list[Any]:
            got: list[Any] = []
            async with nsq_anyio.Consumer(
                topic, channel, nsqd_tcp_addresses=[self.address], max_in_flight=100
            ) as consumer:
                with anyio.fail_after(timeout):
                    async for message in consumer:
                        got.append(message)
                        await message.finish()
                        if len(got) == n:
                            break
            return got

        return self.portal.call(run)

    def channel_stats(self, topic: str, channel: str) -> ChannelStats:
        return self.on_loop(self.nsqd.channel_stats, topic, channel)

    def topic_stats(self, topic: str) -> TopicStats:
        return self.on_loop(self.nsqd.topic_stats, topic)

    def channel_messages(self, topic: str, channel: str) -> list[MessageInfo]:
        return self.on_loop(self.nsqd.channel_messages, topic, channel)


def wait_for(what: Callable[[], Any], timeout: float = 60.0, interval: float = 0.2) -> Any:
    """Poll until ``what()`` is truthy; return its value."""
    deadline = time.monotonic() + timeout
    while True:
        value = what()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def run_available_now(df: Any, out: Any, checkpoint: Any, timeout: float = 180.0) -> Any:
    """Run ``df`` (a stream) into parquet at ``out`` with ``availableNow`` until it ends
    (failing the test if it does not, or fails); the query."""
    query = (
        df.writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(timeout), "availableNow did not end"
    finally:
        query.stop()
    assert query.exception() is None
    return query


def write_available_now(df: Any, out: Any, checkpoint: Any, timeout: float = 180.0) -> list[Any]:
    """:func:`run_available_now`, then every row written at ``out`` (by this run and
    earlier ones)."""
    run_available_now(df, out, checkpoint, timeout)
    return list(df.sparkSession.read.parquet(str(out)).collect())
