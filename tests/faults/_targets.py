"""What a fault scenario runs against: real nsqd processes or the emulator on loopback, behind
one small interface (addresses, kill -9, restart, a channel's counters)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import anyio.to_thread

from nsq_emulator.loopback import EmulatorCluster
from tests.support.servers import Lookupd, Nsqd


@dataclass(frozen=True)
class Channel:
    depth: int
    in_flight_count: int
    message_count: int
    timeout_count: int


class Target(Protocol):
    label: str
    nsqd_tcp_addresses: list[str]
    lookupd_http_addresses: list[str]

    async def kill(self, i: int) -> None:
        """kill -9 nsqd ``i``: what only its memory held (messages in flight) is lost."""

    async def restart(self, i: int) -> None: ...

    def channel(self, i: int, topic: str, channel: str) -> Channel | None: ...


class RealTarget:
    label = "real nsqd"

    def __init__(self, nsqds: list[Nsqd], lookupd: Lookupd | None = None) -> None:
        self.nsqds = nsqds
        self.nsqd_tcp_addresses = [n.tcp_address for n in nsqds]
        self.lookupd_http_addresses = [] if lookupd is None else [lookupd.http_address]

    async def kill(self, i: int) -> None:
        self.nsqds[i].kill9()

    async def restart(self, i: int) -> None:
        await anyio.to_thread.run_sync(self.nsqds[i].start)

    def channel(self, i: int, topic: str, channel: str) -> Channel | None:
        c = self.nsqds[i].channel(topic, channel)
        if c is None:
            return None
        return Channel(c["depth"], c["in_flight_count"], c["message_count"], c["timeout_count"])


class EmulatedTarget:
    label = "emulator"

    def __init__(self, cluster: EmulatorCluster) -> None:
        self.cluster = cluster
        self.nsqd_tcp_addresses = cluster.nsqd_tcp_addresses
        self.lookupd_http_addresses = cluster.lookupd_http_addresses

    async def kill(self, i: int) -> None:
        # the real scenarios run nsqd with its queue on disk (--mem-queue-size=0)
        self.cluster.nsqds[i].stop(self.cluster.now(), lose_in_flight=True)
        self.cluster.kick()

    async def restart(self, i: int) -> None:
        self.cluster.nsqds[i].start(self.cluster.now())
        self.cluster.kick()

    def channel(self, i: int, topic: str, channel: str) -> Channel | None:
        try:
            c = self.cluster.nsqds[i].channel_stats(topic, channel)
        except KeyError:
            return None
        return Channel(c.depth, c.in_flight_count, c.message_count, c.timeout_count)
