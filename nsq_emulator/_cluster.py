"""A cluster of emulated partitioned nsqd with their nsqlookupd.

Topics are created with a number of partitions and replicas; each partition has one leader
node, which holds its messages and serves PUB, SUB and FIN.  The other replicas know the
partition (so PUB/SUB there do not get ``E_TOPIC_NOT_EXIST``) but answer
``E_FAILED_ON_NOT_LEADER``.  Nothing is created on demand.  Lookups answer from the
cluster's metadata: ``/lookup?topic=..&access=r|w&metainfo=true`` lists each partition's
leader, ``/listlookup`` the lookupd nodes.

Fault injection: :meth:`Cluster.move_leader` hands a partition (with its messages) to
another replica; consumers of the old leader stop receiving it and their FIN becomes fatal
``E_FAILED_ON_NOT_LEADER``.  :meth:`Cluster.stop_node` stops a node (optionally failing its
partitions over to running replicas) and :meth:`Cluster.start_node` brings it back.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field
from typing import Any

from nsq_proto.wire import is_valid_channel_name, is_valid_topic_name

from ._http import HttpError, Request
from ._lookupd import Lookupd
from ._nsqd import Nsqd
from ._options import NsqdOptions
from ._protocol import NsqdConnection
from ._store import Topic

__all__ = ["Cluster", "PartitionedTopic"]

#: the partitioned cluster's internal ids of partition p start at p << COMMIT_LOG_ID_BITS
COMMIT_LOG_ID_BITS = 50


@dataclass
class PartitionedTopic:
    """A partitioned topic as the cluster's coordinator describes it: its partitions, their
    leaders and replicas.  Not :class:`nsq_proto.TopicMeta`, the ``meta`` object of a lookup
    answer as a client parses it (this one is what the lookupd builds that answer from)."""

    name: str
    partition_num: int
    replica: int
    ordered: bool = False
    ext: bool = False
    multi_part: bool = False
    disable_channel_auto_create: bool = False
    #: node index of each partition's leader
    leaders: list[int] = field(default_factory=list)
    #: node indexes holding each partition (the leader included)
    replicas: list[list[int]] = field(default_factory=list)


class Cluster:
    """``nodes`` partitioned nsqd (node ``i`` on ``tcp_port + 100*i``, ``http_port + 100*i``)
    and ``lookupds`` nsqlookupd (HTTP on 4161, 4261, ...), all on one clock."""

    def __init__(
        self,
        nodes: int = 3,
        *,
        options: NsqdOptions | None = None,
        lookupds: int = 1,
        rng: random.Random | None = None,
        now: float = 0.0,
        allow_write_without_channels: bool = False,
    ) -> None:
        if nodes < 1 or lookupds < 1:
            raise ValueError("a cluster needs at least one node and one lookupd")
        base = options if options is not None else NsqdOptions(partitioned=True)
        self.nodes: list[Nsqd] = []
        for i in range(nodes):
            opts = dataclasses.replace(
                base,
                partitioned=True,
                tcp_port=base.tcp_port + 100 * i,
                http_port=base.http_port + 100 * i,
                https_port=base.https_port + 100 * i,
                node_id=(base.node_id + i + 1) % 1024,
                hostname=f"{base.hostname}-{i}",
            )
            node = Nsqd(opts, rng=rng, now=now)
            node.cluster = self
            self.nodes.append(node)
        self.lookupds: list[Lookupd] = []
        for j in range(lookupds):
            lookupd = Lookupd(
                broadcast_address=base.broadcast_address,
                hostname=f"lookupd-{j}",
                tcp_port=4160 + 100 * j,
                http_port=4161 + 100 * j,
                rpc_port=4162 + 100 * j,
                partitioned=True,
                wall_clock_offset=base.wall_clock_offset,
            )
            lookupd.cluster = self
            for node in self.nodes:
                lookupd.register(node)
            self.lookupds.append(lookupd)
        self.allow_write_without_channels = allow_write_without_channels
        self.meta: dict[str, PartitionedTopic] = {}
        self._topics: dict[tuple[str, int], Topic] = {}
        self._now = now

    def __repr__(self) -> str:
        return f"<Cluster nodes={len(self.nodes)} topics={sorted(self.meta)}>"

    @property
    def lookupd(self) -> Lookupd:
        """The first (leader) lookupd."""
        return self.lookupds[0]

    # -- topology -----------------------------------------------------------------------------

    def create_topic(
        self,
        name: str,
        now: float,
        *,
        partitions: int = 2,
        replicas: int = 1,
        ordered: bool = False,
        ext: bool = False,
        disable_channel_auto_create: bool = False,
        leaders: list[int] | None = None,
        writable: bool = True,
    ) -> PartitionedTopic:
        """``POST /topic/create`` on the lookupd leader: partition ``p`` is led by node
        ``leaders[p]`` (default ``p % nodes``) and replicated on the next nodes.

        Internal ids of partition ``p`` count from the commit log's start, ``p << 50``, as in
        the real cluster.  With ``writable=False`` the topic refuses publishes with the
        non-fatal ``E_FAILED_ON_NOT_LEADER`` (as the real one answers) until :meth:`enable_writes`, as a new topic
        of the real cluster does until its write check has run (up to minutes)."""
        if not is_valid_topic_name(name):
            raise ValueError(f"invalid topic name {name!r}")
        if name in self.meta:
            raise ValueError(f"topic {name!r} exists")
        n = len(self.nodes)
        if not 1 <= replicas <= n or partitions < 1:
            raise ValueError("need 1 <= replicas <= nodes and at least one partition")
        chosen = leaders if leaders is not None else [p % n for p in range(partitions)]
        if len(chosen) != partitions:
            raise ValueError("one leader per partition")
        meta = PartitionedTopic(
            name,
            partitions,
            replicas,
            ordered=ordered,
            ext=ext,
            multi_part=ordered,
            disable_channel_auto_create=disable_channel_auto_create,
            leaders=list(chosen),
            replicas=[[(chosen[p] + k) % n for k in range(replicas)] for p in range(partitions)],
        )
        self.meta[name] = meta
        for p in range(partitions):
            node = self.nodes[chosen[p]]
            topic = Topic(name, node.options.node_id, p)
            topic.ordered = ordered
            topic.ext = ext
            topic.disable_channel_auto_create = disable_channel_auto_create
            topic.next_internal_id = (p << COMMIT_LOG_ID_BITS) + 2  # nLogID + 1
            topic.write_disabled = not writable
            self._topics[(name, p)] = topic
            node.begin_call(now)
            node.topics[(name, p)] = topic
            node.end_call(now)
        return meta

    def enable_writes(self, topic: str, enabled: bool = True) -> None:
        """Let ``topic`` take publishes (or, with ``enabled=False``, refuse them)."""
        self._meta(topic)
        for (name, _), data in self._topics.items():
            if name == topic:
                data.write_disabled = not enabled

    def create_channel(self, topic: str, channel: str, now: float) -> None:
        """Create ``channel`` on every partition (``/channel/create`` on the lookupd)."""
        if not is_valid_channel_name(channel):
            raise ValueError(f"invalid channel name {channel!r}")
        meta = self._meta(topic)
        for p in range(meta.partition_num):
            node = self.nodes[meta.leaders[p]]
            node.begin_call(now)
            try:
                node.get_channel(self._topics[(topic, p)], channel, now)
            finally:
                node.end_call(now)

    def _meta(self, topic: str) -> PartitionedTopic:
        meta = self.meta.get(topic)
        if meta is None:
            raise KeyError(f"no topic {topic!r} in the cluster")
        return meta

    def leader(self, topic: str, partition: int) -> Nsqd | None:
        meta = self.meta.get(topic)
        if meta is None or not 0 <= partition < meta.partition_num:
            return None
        return self.nodes[meta.leaders[partition]]

    def topic(self, topic: str, partition: int) -> Topic:
        return self._topics[(topic, partition)]

    def node_index(self, node: object) -> int:
        """The index of ``node`` in :attr:`nodes` (``ValueError`` if it is not one)."""
        for index, candidate in enumerate(self.nodes):
            if candidate is node:
                return index
        raise ValueError(f"{node!r} is not in list")

    # -- asked by nodes (the Placement protocol) -----------------------------------------------

    def replica_topic(self, node: object, name: str, partition: int) -> Topic | None:
        """The partition's data if ``node`` holds a replica of it, else None."""
        meta = self.meta.get(name)
        if meta is None or not 0 <= partition < meta.partition_num:
            return None
        if self.node_index(node) not in meta.replicas[partition]:
            return None
        return self._topics[(name, partition)]

    def default_partition(self, node: object, name: str) -> int:
        """The first partition of ``name`` that ``node`` leads (-1: none)."""
        meta = self.meta.get(name)
        if meta is None:
            return -1
        index = self.node_index(node)
        for p, leader in enumerate(meta.leaders):
            if leader == index:
                return p
        return -1

    # -- faults ---------------------------------------------------------------------------------

    def move_leader(self, topic: str, partition: int, to_node: int, now: float) -> None:
        """Make node ``to_node`` the leader of ``topic`` partition ``partition``.  Messages in
        flight to consumers of the old leader go back to the queue; those consumers stay
        connected but get nothing more, and their FIN is fatal ``E_FAILED_ON_NOT_LEADER``."""
        meta = self._meta(topic)
        old = self.nodes[meta.leaders[partition]]
        new = self.nodes[to_node]
        if old is new:
            return
        key = (topic, partition)
        data = self._topics[key]
        old.begin_call(now)
        try:
            for channel in data.channels.values():
                for cid, client in list(channel.clients.items()):
                    channel.requeue_client(cid)
                    del channel.clients[cid]
                    if isinstance(client, NsqdConnection):
                        client.in_flight_count = 0
            old.topics.pop(key, None)
        finally:
            old.end_call(now)
        meta.leaders[partition] = to_node
        if to_node not in meta.replicas[partition]:
            meta.replicas[partition].append(to_node)
        new.begin_call(now)
        try:
            new.topics[key] = data
            for channel in data.channels.values():
                new.dirty_channel(channel)
        finally:
            new.end_call(now)

    def stop_node(
        self, index: int, now: float, *, lose_messages: bool = False, failover: bool = True
    ) -> None:
        """Stop node ``index``; with ``failover`` each partition it led moves to the first
        running replica (if any)."""
        node = self.nodes[index]
        node.stop(now, lose_messages=lose_messages)
        if not failover:
            return
        for meta in self.meta.values():
            for p, leader in enumerate(meta.leaders):
                if leader != index:
                    continue
                for candidate in meta.replicas[p]:
                    if candidate != index and self.nodes[candidate].running:
                        self.move_leader(meta.name, p, candidate, now)
                        break

    def start_node(self, index: int, now: float) -> None:
        self.nodes[index].start(now)

    # -- clock ------------------------------------------------------------------------------------

    def next_deadline(self) -> float | None:
        deadlines = [d for d in (n.next_deadline() for n in self.nodes) if d is not None]
        return min(deadlines) if deadlines else None

    def handle_timer(self, now: float) -> None:
        for node in self.nodes:
            node.handle_timer(now)
        self._now = max(self._now, now)

    # -- asked by lookupds (the Coordinator protocol) ---------------------------------------------

    def has_topic(self, topic: str) -> bool:
        return topic in self.meta

    def topic_names(self) -> list[str]:
        return list(self.meta)

    def topic_channels(self, topic: str) -> set[str]:
        """The channels of every partition of ``topic`` (none if it is unknown)."""
        meta = self.meta.get(topic)
        names: set[str] = set()
        if meta is not None:
            for p in range(meta.partition_num):
                names.update(self._topics[(topic, p)].channels)
        return names

    def _peer(self, lookupd: Lookupd, node: Nsqd) -> dict[str, Any]:
        peer = lookupd.register(node)
        o = node.options
        return {
            "id": peer.remote_address,
            "remote_address": peer.remote_address,
            "hostname": o.hostname,
            "broadcast_address": o.broadcast_address,
            "tcp_port": o.tcp_port,
            "http_port": o.http_port,
            "version": o.server_version,
            "distributed_id": f"{o.broadcast_address}:{o.tcp_port + 20}:{o.tcp_port}:{o.node_id}",
        }

    def node_info(self, node: Nsqd) -> dict[str, Any]:
        """What ``/nodes`` adds about ``node``: its distributed id."""
        o = node.options
        return {
            "distributed_id": f"{o.broadcast_address}:{o.tcp_port + 20}:{o.tcp_port}:{o.node_id}"
        }

    def lookup(self, lookupd: Lookupd, req: Request, topic: str, now: float) -> dict[str, Any]:
        """``/lookup?topic=&access=r|w&partition=&metainfo=``: each partition's leader."""
        access = req.get("access") or "r"
        if access not in ("r", "w"):
            raise HttpError(400, "INVALID_ACCESS_MODE")
        wanted = req.get("partition") or "*"
        meta = self.meta.get(topic)
        channels: set[str] = set()
        partitions: dict[str, Any] = {}
        producers: dict[int, dict[str, Any]] = {}
        filtered = False
        if meta is None:
            if access == "w":
                raise HttpError(404, "Key not found")
        else:
            for p in range(meta.partition_num):
                if wanted != "*" and wanted != str(p):
                    continue
                data = self._topics[(topic, p)]
                channels.update(data.channels)
                index = meta.leaders[p]
                node = self.nodes[index]
                if not node.running:
                    continue
                if access == "w" and not data.channels and not self.allow_write_without_channels:
                    filtered = True
                    continue
                peer = self._peer(lookupd, node)
                partitions[str(p)] = peer
                producers.setdefault(index, peer)
            if filtered and not partitions:
                # the real nsqlookupd answers this with status 500
                raise HttpError(
                    500, "Topic has no channel, should init at least one for the new topic"
                )
        result: dict[str, Any] = {"channels": sorted(channels)}
        if req.get("metainfo") and meta is not None:
            result["meta"] = {
                "disable_channel_auto_create": meta.disable_channel_auto_create,
                "extend_support": meta.ext,
                "multi_part": meta.multi_part,
                "ordered": meta.ordered,
                "partition_num": meta.partition_num,
                "replica": meta.replica,
            }
        result["partitions"] = partitions
        result["producers"] = list(producers.values())
        return result

    def listlookup(self) -> dict[str, Any]:
        """``/listlookup``: the lookupd nodes and their leader (the first running one)."""

        def entry(lookupd: Lookupd) -> dict[str, Any]:
            return {
                "ID": f"{lookupd.broadcast_address}:{lookupd.rpc_port}:{lookupd.tcp_port}:nsqlookup",
                "NodeIP": lookupd.broadcast_address,
                "TcpPort": str(lookupd.tcp_port),
                "HttpPort": str(lookupd.http_port),
                "RpcPort": str(lookupd.rpc_port),
                "Epoch": 0,
            }

        running = [entry(lk) for lk in self.lookupds if lk.running]
        leader = next((lk for lk in self.lookupds if lk.running), None)
        empty = {"ID": "", "NodeIP": "", "TcpPort": "", "HttpPort": "", "RpcPort": "", "Epoch": 0}
        return {"lookupdleader": entry(leader) if leader else empty, "lookupdnodes": running}
