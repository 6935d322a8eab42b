"""Helpers of the Spark tests: the emulator driven from test threads, polling, a real nsqd
addressed as the Spark options name it, the processes below a driver."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from anyio.from_thread import BlockingPortal

import nsq_anyio
from nsq_emulator import ChannelStats, MessageInfo, TopicStats
from nsq_emulator.loopback import EmulatorCluster
from tests.support.gate import below, process_tree
from tests.support.servers import Nsqd

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


NSQD = os.environ.get("NSQD") or shutil.which("nsqd")


CHANNEL = "spark"


@dataclass
class Counts:
    depth: int
    in_flight: int
    requeues: int


class RealNSQD:
    """A real nsqd on loopback (``tests/support/servers.Nsqd``), addressed as the Spark
    options name it: ``address`` (TCP) and ``http``, each ``host:port``."""

    def __init__(self, data: str | Path) -> None:
        """An nsqd keeping its messages in ``data``, on ports chosen when it starts."""
        self.server = Nsqd(data=str(data), durable=False)

    @property
    def address(self) -> str:
        return self.server.tcp_address

    @property
    def http(self) -> str:
        return f"127.0.0.1:{self.server.http}"

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        return self.server.proc

    def start(self) -> None:
        self.server.start()

    def stop(self) -> None:
        self.server.stop(timeout=30.0)

    def restart(self) -> None:
        self.stop()
        self.start()

    def publish(self, topic: str, bodies: list[bytes]) -> None:
        for i in range(0, len(bodies), 500):
            request = urllib.request.Request(
                f"http://{self.http}/mpub?topic={topic}",
                data=b"\n".join(bodies[i : i + 500]),
                method="POST",
            )
            with urllib.request.urlopen(request, timeout=10) as response:
                assert response.status == 200

    def counts(self, topic: str) -> Counts | None:
        url = f"http://{self.http}/stats?format=json&topic={topic}&channel={CHANNEL}"
        with urllib.request.urlopen(url, timeout=5) as response:
            data: dict[str, Any] = json.load(response)
        for t in data["topics"]:
            for c in t["channels"]:
                if c["channel_name"] == CHANNEL:
                    return Counts(
                        c["depth"] + c["deferred_count"], c["in_flight_count"], c["requeue_count"]
                    )
        return None


def descendants(pid: int) -> set[int]:
    """``pid`` and every live process below it (Linux /proc)."""
    return below(process_tree(), pid)


def alive(pids: set[int]) -> set[int]:
    alive = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            alive.add(pid)
    return alive
