"""The emulated nsqd: topics, channels, client connections, timers, HTTP and faults.

Everything runs on the caller's clock: each entry point takes ``now`` (seconds), first runs
whatever timer fell due before ``now`` (in time order, each at its own deadline), then does
its work.  :meth:`Nsqd.next_deadline` tells the adapter when to call
:meth:`Nsqd.handle_timer` next.

Besides its own API, :class:`Nsqd` is what its parts see of it: the
:class:`~._node.PartitionedNode` its connections use, the :class:`~._nsqd_http.HttpNode`
its HTTP API answers for.  It sees its cluster and its nsqlookupd only as a
:class:`~._node.Placement` and :class:`~._node.Registry`.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from nsq_proto.wire import is_valid_channel_name, is_valid_topic_name

from ._http import HttpError, HttpResponse, HttpServerConnection
from ._node import Placement, Registry
from ._nsqd_http import handle_request, stats_object
from ._options import FIXED_EPOCH, NsqdOptions
from ._partitioned import PartitionedConnection
from ._protocol import NsqdConnection
from ._store import Channel, StoredMessage, Topic
from ._wire import ClientError, ClientState

__all__ = ["Nsqd", "ChannelStats", "TopicStats", "ClientStats", "MessageInfo", "NsqdStopped"]

_MAX_TIMER_STEPS = 1_000_000


class NsqdStopped(ConnectionRefusedError):
    """The emulated nsqd is stopped: connections and HTTP requests are refused."""


@dataclass(frozen=True, slots=True)
class ChannelStats:
    """One channel of the emulated nsqd, as :meth:`Nsqd.channel_stats` tells it, with the
    counters of nsqd's ``/stats``: ``depth`` (queued), in flight, deferred, messages that
    reached it, requeued, timed out, its clients (``partition``: -1 outside a partitioned
    topic)."""

    topic: str
    channel: str
    depth: int
    in_flight_count: int
    deferred_count: int
    message_count: int
    requeue_count: int
    timeout_count: int
    client_count: int
    paused: bool
    partition: int = -1


@dataclass(frozen=True, slots=True)
class TopicStats:
    """One topic of the emulated nsqd, as :meth:`Nsqd.topic_stats` tells it: ``depth``
    (queued before any channel takes them), messages and bytes it received, its channels'
    names (``partition``: -1 outside a partitioned topic)."""

    topic: str
    depth: int
    message_count: int
    message_bytes: int
    paused: bool
    channels: tuple[str, ...]
    partition: int = -1


@dataclass(frozen=True, slots=True)
class ClientStats:
    """A client as the server sees it (the RDY bookkeeping is nsqd's, not the client's)."""

    id: int
    client_id: str
    hostname: str
    remote_address: str
    state: ClientState
    ready_count: int
    in_flight_count: int
    message_count: int
    finish_count: int
    requeue_count: int
    subscription: tuple[str, str] | None
    closed: bool


@dataclass(frozen=True, slots=True)
class MessageInfo:
    """One message held by a channel: ``state`` is ``"queued"``, ``"in_flight"`` or
    ``"deferred"``; ``client`` is the connection id holding it in flight."""

    id: bytes
    body: bytes
    attempts: int
    timestamp: int
    state: str
    client: int | None = None
    deadline: float | None = None


@dataclass(frozen=True, slots=True)
class _Injection:
    command: bytes | None
    error: ClientError


class Nsqd:
    """A sans-IO nsqd.  ``rng`` (optional) drives sampling and picks among ready
    subscribers; without it subscribers are served round-robin and sampling uses a private
    ``random.Random(0)``."""

    def __init__(
        self,
        options: NsqdOptions | None = None,
        *,
        rng: random.Random | None = None,
        now: float = 0.0,
    ) -> None:
        self.options = options if options is not None else NsqdOptions()
        self._rng = rng
        self._sample_rng = rng if rng is not None else random.Random(0)
        self.topics: dict[tuple[str, int], Topic] = {}
        self._conns: dict[int, NsqdConnection] = {}
        self._draining: set[NsqdConnection] = set()
        self._next_client_id = 1
        self._next_port = 50000
        self._unflushed: set[NsqdConnection] = set()
        self._attention: dict[NsqdConnection, None] = {}
        self._dirty: dict[Channel, None] = {}
        self._injections: list[_Injection] = []
        self._default_output_delay = 0.0
        self._running = True
        self._now = now
        #: ``now`` when the process started (``start_time`` in ``/stats`` and ``/info``)
        self.started_at = now
        #: added to ``now`` to get the Unix time: ``options.wall_clock_offset``; when that is
        #: None, the host sets it from its wall clock (see :meth:`set_wall_clock`)
        self.wall_clock_offset: float | None = self.options.wall_clock_offset
        self._depth = 0
        #: the nsqlookupd this nsqd is registered with (see ``Lookupd.register``)
        self.lookupds: list[Registry] = []
        #: the cluster this (partitioned) nsqd belongs to, if any
        self.cluster: Placement | None = None

    def __repr__(self) -> str:
        o = self.options
        return f"<Nsqd {o.broadcast_address}:{o.tcp_port} v{o.server_version} topics={len(self.topics)}>"

    # -- clock -----------------------------------------------------------------------------

    def set_wall_clock(self, unix_time: float, now: float) -> None:
        """The host's wall clock reads ``unix_time`` at ``now``: timestamps follow it, unless
        ``options.wall_clock_offset`` fixes them."""
        if self.options.wall_clock_offset is None:
            self.wall_clock_offset = unix_time - now

    def unix_time(self, now: float) -> float:
        """The Unix time (s) that ``now`` stands for."""
        offset = self.wall_clock_offset
        return (FIXED_EPOCH if offset is None else offset) + now

    def unix_ns(self, now: float) -> int:
        """The Unix time in ns that ``now`` stands for (message timestamps)."""
        offset = self.wall_clock_offset
        return int((FIXED_EPOCH if offset is None else offset) * 1e9) + round(now * 1e9)

    def next_deadline(self) -> float | None:
        """The earliest time :meth:`handle_timer` has work to do, or ``None``."""
        best: float | None = None
        for conn in self._conns.values():
            d = conn.next_deadline()
            if d is not None and (best is None or d < best):
                best = d
        for conn in self._draining:
            d = conn.next_deadline()
            if d is not None and (best is None or d < best):
                best = d
        for topic in self.topics.values():
            for channel in topic.channels.values():
                d = channel.next_deadline()
                if d is not None and (best is None or d < best):
                    best = d
        return best

    def handle_timer(self, now: float) -> None:
        """Run heartbeats, read timeouts, message timeouts and deferred messages due by
        ``now`` (an early call does nothing, a late one catches up in order)."""
        self.begin_call(now)
        self.end_call(now)

    def begin_call(self, now: float) -> None:
        """Enter a call at ``now``: run the timers due by then first (the outermost call
        only; calls nest)."""
        self._depth += 1
        if self._depth > 1:
            return
        steps = 0
        try:
            while True:
                d = self.next_deadline()
                if d is None or d > now:
                    break
                self._fire(max(d, self._now))
                steps += 1
                if steps > _MAX_TIMER_STEPS:  # pragma: no cover - a bug guard
                    raise RuntimeError("timer loop does not advance")
        except BaseException:
            self._depth -= 1
            raise
        self._now = max(self._now, now)

    def end_call(self, now: float) -> None:
        """Leave a call: the outermost one delivers what became deliverable and flushes."""
        self._depth -= 1
        if self._depth:
            return
        self.pump(now)
        self._flush_all()

    def _fire(self, t: float) -> None:
        self._now = t
        for topic in list(self.topics.values()):
            for channel in list(topic.channels.values()):
                if channel.expire(t):
                    self._dirty[channel] = None
        for conn in list(self._conns.values()) + list(self._draining):
            d = conn.next_deadline()
            if d is not None and d <= t:
                conn.fire(t)
            if conn in self._draining and not conn.output_held:
                self._draining.discard(conn)
        self.pump(t)
        self._flush_all()

    def _flush_all(self) -> None:
        for conn in list(self._unflushed):
            conn.flush()
        self._unflushed.clear()

    # -- connections ---------------------------------------------------------------------------

    def pending(self) -> list[NsqdConnection]:
        """Connections that got bytes to send, or closed, since the last call (any call may
        queue output on other connections: a PUB delivers to subscribers, a timer fires).
        An adapter calls this after every call into the emulator and serves each one."""
        out = list(self._attention)
        self._attention.clear()
        return out

    @property
    def running(self) -> bool:
        return self._running

    @property
    def connections(self) -> list[NsqdConnection]:
        """Open client connections, oldest first."""
        return list(self._conns.values())

    def accept(self, now: float, *, remote_address: str | None = None) -> NsqdConnection:
        """A client connected; feed its bytes to the returned connection."""
        if not self._running:
            raise NsqdStopped(
                f"nsqd {self.options.broadcast_address}:{self.options.tcp_port} is stopped"
            )
        self.begin_call(now)
        try:
            if remote_address is None:
                remote_address = f"127.0.0.1:{self._next_port}"
                self._next_port += 1
            conn = self._new_connection(self._next_client_id, now, remote_address)
            self._next_client_id += 1
            self._conns[conn.id] = conn
            return conn
        finally:
            self.end_call(now)

    def _new_connection(self, client_id: int, now: float, remote_address: str) -> NsqdConnection:
        if self.options.partitioned:
            return PartitionedConnection(self, client_id, now, remote_address)
        return NsqdConnection(self, client_id, now, remote_address)

    # -- what connections report (the Node protocol) ----------------------------------------

    @property
    def output_delay(self) -> float:
        """How long a new connection holds each write (set by :meth:`delay_output`)."""
        return self._default_output_delay

    def output_ready(self, conn: NsqdConnection) -> None:
        """``conn`` has bytes to send, or closed: :meth:`pending` lists it."""
        self._attention[conn] = None

    def output_buffered(self, conn: NsqdConnection) -> None:
        """``conn`` wrote a message frame: flush it at the end of the call."""
        self._unflushed.add(conn)

    def output_flushed(self, conn: NsqdConnection) -> None:
        self._unflushed.discard(conn)

    def connection_closed(self, conn: NsqdConnection, now: float) -> None:
        """``conn`` closed: forget it (once its held output is out) and leave its channel."""
        self._conns.pop(conn.id, None)
        self._unflushed.discard(conn)
        if conn.output_held:
            self._draining.add(conn)
        channel = conn.channel
        if channel is not None:
            channel.clients.pop(conn.id, None)
            self._on_client_left(conn, channel, now)

    def _on_client_left(self, conn: NsqdConnection, channel: Channel, now: float) -> None:
        if self.options.partitioned and channel.requeue_client(conn.id):
            self._dirty[channel] = None
        if channel.ephemeral and not channel.clients:
            self.remove_channel(channel)

    # -- topics and channels -------------------------------------------------------------------

    def get_topic(self, name: str, now: float) -> Topic:
        """The standard server's topic ``name``, created (and registered) on first use."""
        key = (name, -1)
        topic = self.topics.get(key)
        if topic is None:
            topic = Topic(name, self.options.node_id)
            self.topics[key] = topic
            self._notify_lookupds(name, None, True)
        return topic

    def _notify_lookupds(self, topic: str, channel: str | None, added: bool) -> None:
        for lookupd in self.lookupds:
            lookupd.nsqd_changed(self, topic, channel, added)

    def http_topic(self, name: str, now: float, partition: int = -1) -> Topic:
        """The topic an HTTP publish or ``/topic/create`` names (created on demand, except
        on the partitioned server)."""
        if self.options.partitioned:
            if partition < 0:
                partition = self.default_partition(name)
            topic = self.existing_partition(name, partition)
            if topic is None or not self.is_leader(name, partition):
                raise HttpError(404, "TOPIC_NOT_FOUND")
            return topic
        return self.get_topic(name, now)

    def http_existing_topic(self, name: str, partition: int = -1) -> Topic | None:
        """The topic an HTTP request names, if it exists (the partitioned server: its
        default partition unless ``partition``)."""
        if self.options.partitioned:
            if partition < 0:
                partition = self.default_partition(name)
            return self.topics.get((name, partition))
        return self.topics.get((name, -1))

    def get_channel(self, topic: Topic, name: str, now: float) -> Channel:
        """``topic``'s channel ``name``, created (and registered) on first use."""
        channel, created = topic.get_channel(name, now)
        if created:
            self._dirty[channel] = None
            refresh = self.options.queue_scan_refresh_interval
            if refresh > 0:
                ticks = int((now - self.started_at) // refresh) + 1
                channel.scan_from = self.started_at + ticks * refresh
            self._notify_lookupds(topic.name, name, True)
        return channel

    def remove_channel(self, channel: Channel) -> None:
        """Delete ``channel``: its clients are disconnected; an ephemeral topic left with
        no channel goes too."""
        topic = channel.topic
        if topic.channels.get(channel.name) is not channel:
            return
        del topic.channels[channel.name]
        channel.deleted = True
        self._notify_lookupds(topic.name, channel.name, False)
        for client in list(channel.clients.values()):
            if isinstance(client, NsqdConnection):
                client.shutdown("channel deleted")
        channel.clients.clear()
        if topic.ephemeral and not topic.channels:
            self.remove_topic(topic)

    def remove_topic(self, topic: Topic) -> None:
        """Delete ``topic`` and its channels: their clients are disconnected."""
        key = (topic.name, topic.partition)
        if self.topics.get(key) is not topic:
            return
        del self.topics[key]
        topic.deleted = True
        self._notify_lookupds(topic.name, None, False)
        for channel in list(topic.channels.values()):
            channel.deleted = True
            for client in list(channel.clients.values()):
                if isinstance(client, NsqdConnection):
                    client.shutdown("topic deleted")
        topic.channels.clear()

    def new_message(self, topic: Topic, body: bytes, now: float) -> StoredMessage:
        """A message for ``topic`` with a new id (not yet published: see :meth:`put`)."""
        if self.options.partitioned:
            return self.new_partition_message(topic, body, now)
        unix_ns = self.unix_ns(now)
        return StoredMessage(topic.ids.new_id(unix_ns), bytes(body), unix_ns)

    def put(self, topic: Topic, msg: StoredMessage, now: float) -> None:
        """Publish ``msg`` to ``topic`` (its channels deliver at the next pump)."""
        topic.put(msg, now)
        for channel in topic.channels.values():
            self._dirty[channel] = None

    # -- partitioned server ---------------------------------------------------------------------

    def create_partition(
        self,
        topic: str,
        partition: int,
        now: float,
        *,
        ordered: bool = False,
        ext: bool = False,
        disable_channel_auto_create: bool = False,
    ) -> None:
        """Create one partition of a topic on a standalone partitioned nsqd (what
        ``INTERNAL_CREATE_TOPIC`` does).  In a :class:`Cluster`, use its ``create_topic``."""
        if not self.options.partitioned:
            raise ValueError("create_partition needs NsqdOptions(partitioned=True)")
        if not is_valid_topic_name(topic) or partition < 0:
            raise ValueError(f"invalid topic {topic!r} or partition {partition}")
        self.begin_call(now)
        try:
            key = (topic, partition)
            t = self.topics.get(key)
            if t is None:
                t = Topic(topic, self.options.node_id, partition)
                self.topics[key] = t
                self._notify_lookupds(topic, None, True)
            t.ordered = t.ordered or ordered
            t.ext = t.ext or ext
            t.disable_channel_auto_create = disable_channel_auto_create
        finally:
            self.end_call(now)

    @property
    def in_cluster(self) -> bool:
        return self.cluster is not None

    def default_partition(self, name: str) -> int:
        """The partition a request naming none goes to: the first this node leads in its
        cluster, else the lowest it has (-1: none)."""
        if self.cluster is not None:
            return self.cluster.default_partition(self, name)
        parts = sorted(p for n, p in self.topics if n == name)
        return parts[0] if parts else -1

    def existing_partition(self, name: str, partition: int) -> Topic | None:
        """The partition's data, if this node holds (a replica of) it."""
        if self.cluster is not None:
            return self.cluster.replica_topic(self, name, partition)
        return self.topics.get((name, partition))

    def is_leader(self, name: str, partition: int) -> bool:
        """Whether this node leads the partition (serves its PUB, SUB and FIN)."""
        if self.cluster is not None:
            return self.cluster.leader(name, partition) is self
        return (name, partition) in self.topics

    def new_partition_message(
        self,
        topic: Topic,
        body: bytes,
        now: float,
        *,
        trace_id: int = 0,
        ext_version: int | None = None,
        ext_data: bytes = b"",
    ) -> StoredMessage:
        """A message for a partition: the next internal id, the trace id, and its place
        in the partition's log (kept for start positions)."""
        internal_id = topic.next_internal_id
        topic.next_internal_id += 1
        raw_size = 4 + 26 + len(body)
        if topic.ext:
            raw_size += 1 + (2 + len(ext_data) if ext_version else 0)
        msg_id = internal_id.to_bytes(8, "big") + (trace_id & ((1 << 64) - 1)).to_bytes(8, "big")
        msg = StoredMessage(
            msg_id,
            bytes(body),
            self.unix_ns(now),
            internal_id=internal_id,
            trace_id=trace_id,
            queue_offset=topic.next_offset,
            raw_size=raw_size,
            ext_version=ext_version if topic.ext else None,
            ext_data=ext_data if topic.ext else b"",
            key=msg_id[:8],
        )
        topic.next_offset += raw_size
        topic.log.append(msg.copy())
        return msg

    def set_channel_offset(self, channel: Channel, start: tuple[str, int]) -> str | None:
        """Apply a SUB_ADVANCED start position; returns the error text, or None."""
        kind, value = start
        topic = channel.topic
        if kind == "special":
            if value != -1:
                return "not supported offset type"
            position = topic.next_offset
        elif self.cluster is None:
            return "Not supported while coordinator disabled"
        elif kind == "virtual_queue":
            position = value
        elif kind == "timestamp":
            position = next(
                (m.queue_offset for m in topic.log if m.timestamp >= value * 1_000_000_000),
                topic.next_offset,
            )
        else:  # msgcount: the value-th message (the real server searches for count value - 1)
            index = max(value - 1, 0)
            position = (
                topic.log[index].queue_offset if index < len(topic.log) else topic.next_offset
            )
        busy = set(channel.in_flight) | set(channel.deferred)
        channel.queue.clear()
        channel.queue.extend(
            m.copy() for m in topic.log if m.queue_offset >= position and m.key not in busy
        )
        self._dirty[channel] = None
        return None

    # -- delivery ------------------------------------------------------------------------------

    def dirty_channel(self, channel: Channel) -> None:
        """``channel`` may deliver again: the next :meth:`pump` looks at it."""
        self._dirty[channel] = None

    def pump(self, now: float) -> None:
        """Deliver, channel by channel, what the channels marked dirty can deliver."""
        while self._dirty:
            channel = next(iter(self._dirty))
            del self._dirty[channel]
            if not channel.deleted:
                self._pump_channel(channel, now)

    def _pump_channel(self, channel: Channel, now: float) -> None:
        if channel.paused:
            return
        while channel.queue:
            if channel.ordered and (channel.in_flight or channel.owed):
                return
            client = self._pick_client(channel)
            if client is None:
                return
            msg = channel.queue.popleft()
            if client.sampled_out(self._sample_rng):
                continue
            if client.filters_out(msg, ext_topic=channel.topic.ext):
                continue  # filtered out: finished for the whole channel, as the server does
            client.deliver(msg, now)

    def _pick_client(self, channel: Channel) -> NsqdConnection | None:
        ready = [
            c for c in channel.clients.values() if isinstance(c, NsqdConnection) and c.is_ready
        ]
        if not ready:
            return None
        if self._rng is not None:
            return self._rng.choice(ready)
        # round-robin: the first ready client after the last one served
        for conn in ready:
            if conn.id > channel.rr:
                channel.rr = conn.id
                return conn
        channel.rr = ready[0].id
        return ready[0]

    # -- fault injection ---------------------------------------------------------------------

    def fail_next(
        self,
        *,
        code: str,
        description: str = "",
        fatal: bool = True,
        command: str | None = None,
    ) -> None:
        """Answer the next command (or the next ``command``, e.g. ``"PUB"``) on any connection
        with the error frame ``code description`` instead of executing it.  Its body, if any,
        is read and discarded first.  Queue several to fail several commands."""
        cmd = None if command is None else command.encode()
        self._injections.append(_Injection(cmd, ClientError(code, description, fatal=fatal)))

    def take_injected(self, command: bytes) -> ClientError | None:
        """The error queued by :meth:`fail_next` for ``command``, if any (it is used up)."""
        for i, inj in enumerate(self._injections):
            if inj.command is None or inj.command == command:
                del self._injections[i]
                return inj.error
        return None

    def delay_output(self, seconds: float) -> None:
        """Hold every write of every connection (current and future) for ``seconds``."""
        self._default_output_delay = max(0.0, seconds)
        for conn in self._conns.values():
            conn.delay_output(seconds)

    def drop_connections(self, now: float) -> None:
        """Simulate a network failure on every client connection."""
        for conn in list(self._conns.values()):
            conn.drop(now)

    def stop(
        self, now: float, *, lose_messages: bool = False, lose_in_flight: bool = False
    ) -> None:
        """Stop the process: every connection is closed (pending output lost), ephemeral
        topics and channels vanish, and unless ``lose_messages`` the in-flight and deferred
        messages are kept as queued messages, as nsqd persists them on a clean shutdown.

        A kill -9 loses what nsqd held in memory: every message with ``lose_messages`` (the
        default in-memory queue), only the in-flight and deferred ones with
        ``lose_in_flight`` (``--mem-queue-size=0``: the queue is on disk)."""
        self.begin_call(now)
        try:
            for conn in list(self._conns.values()):
                conn.abort("nsqd stopped")
            self._draining.clear()
            self._lose_on_stop(lose_messages=lose_messages, lose_in_flight=lose_in_flight)
            self._running = False
            self._on_stop()
        finally:
            self.end_call(now)

    def _lose_on_stop(self, *, lose_messages: bool, lose_in_flight: bool) -> None:
        """Ephemeral topics and channels vanish; messages are kept, requeued or lost."""
        for topic in list(self.topics.values()):
            if topic.ephemeral:
                self.remove_topic(topic)
                continue
            for channel in list(topic.channels.values()):
                if channel.ephemeral:
                    self.remove_channel(channel)
                    continue
                if lose_messages:
                    channel.empty()
                elif lose_in_flight:
                    channel.drop_in_memory()
                else:
                    channel.flush_to_queue()
            if lose_messages:
                topic.queue.clear()

    def _on_stop(self) -> None:
        for lookupd in self.lookupds:
            lookupd.nsqd_stopped(self)

    def start(self, now: float) -> None:
        """Start a stopped nsqd again (its topics and kept messages come back)."""
        if self._running:
            return
        self._running = True
        self._now = max(self._now, now)
        self.started_at = now
        self._on_start()
        for topic in self.topics.values():
            for channel in topic.channels.values():
                channel.scan_from = float("-inf")
                self._dirty[channel] = None

    def _on_start(self) -> None:
        for topic in self.topics.values():
            # the GUID factory keeps its state: a real restart takes time, so a new process
            # never repeats an id; here virtual time may not have moved at all
            if self.options.partitioned and self.cluster is None:
                # standalone: the id counter lives in memory, so it starts over
                topic.next_internal_id = 1
        for lookupd in self.lookupds:
            lookupd.nsqd_started(self)

    # -- direct API (no client connection needed) -----------------------------------------------

    def publish(
        self, topic: str, body: bytes, now: float, *, delay: float = 0.0, partition: int = -1
    ) -> bytes:
        """Publish as ``POST /pub`` would; returns the message id.  On the partitioned
        server the partition must exist and be led by this node (-1: its default one)."""
        if not is_valid_topic_name(topic):
            raise ValueError(f"invalid topic name {topic!r}")
        self.begin_call(now)
        try:
            if self.options.partitioned:
                part = partition if partition >= 0 else self.default_partition(topic)
                found = self.existing_partition(topic, part)
                if found is None or not self.is_leader(topic, part):
                    raise KeyError(f"this node does not lead {topic!r} partition {part}")
                t = found
            else:
                t = self.get_topic(topic, now)
            msg = self.new_message(t, body, now)
            msg.deferred = max(0.0, delay)
            self.put(t, msg, now)
            return msg.id
        finally:
            self.end_call(now)

    def create_topic(self, topic: str, now: float) -> None:
        if not is_valid_topic_name(topic):
            raise ValueError(f"invalid topic name {topic!r}")
        self.begin_call(now)
        try:
            self.get_topic(topic, now)
        finally:
            self.end_call(now)

    def create_channel(self, topic: str, channel: str, now: float) -> None:
        if not is_valid_topic_name(topic) or not is_valid_channel_name(channel):
            raise ValueError(f"invalid topic or channel name {topic!r} {channel!r}")
        self.begin_call(now)
        try:
            self.get_channel(self.get_topic(topic, now), channel, now)
        finally:
            self.end_call(now)

    def delete_topic(self, topic: str, now: float, *, partition: int = -1) -> bool:
        self.begin_call(now)
        try:
            t = self.topics.get((topic, partition))
            if t is None:
                return False
            self.remove_topic(t)
            return True
        finally:
            self.end_call(now)

    def delete_channel(self, topic: str, channel: str, now: float, *, partition: int = -1) -> bool:
        self.begin_call(now)
        try:
            t = self.topics.get((topic, partition))
            ch = None if t is None else t.channels.get(channel)
            if ch is None:
                return False
            self.remove_channel(ch)
            return True
        finally:
            self.end_call(now)

    def pause_channel(
        self, topic: str, channel: str, now: float, *, paused: bool = True, partition: int = -1
    ) -> None:
        self.begin_call(now)
        try:
            ch = self._channel(topic, channel, partition)
            ch.paused = paused
            self._dirty[ch] = None
        finally:
            self.end_call(now)

    def pause_topic(
        self, topic: str, now: float, *, paused: bool = True, partition: int = -1
    ) -> None:
        self.begin_call(now)
        try:
            t = self._topic(topic, partition)
            t.paused = paused
            t.release(now)
            for ch in t.channels.values():
                self._dirty[ch] = None
        finally:
            self.end_call(now)

    # -- inspection ---------------------------------------------------------------------------

    def _topic(self, topic: str, partition: int = -1) -> Topic:
        t = self.topics.get((topic, partition))
        if t is None:
            raise KeyError(f"no topic {topic!r} (partition {partition})")
        return t

    def _channel(self, topic: str, channel: str, partition: int = -1) -> Channel:
        ch = self._topic(topic, partition).channels.get(channel)
        if ch is None:
            raise KeyError(f"no channel {channel!r} on topic {topic!r}")
        return ch

    def topic_names(self) -> list[str]:
        return sorted({name for name, _ in self.topics})

    def channel_names(self, topic: str, *, partition: int = -1) -> list[str]:
        return list(self._topic(topic, partition).channels)

    def topic_stats(self, topic: str, *, partition: int = -1) -> TopicStats:
        t = self._topic(topic, partition)
        return TopicStats(
            t.name,
            t.depth,
            t.message_count,
            t.message_bytes,
            t.paused,
            tuple(t.channels),
            t.partition,
        )

    def channel_stats(self, topic: str, channel: str, *, partition: int = -1) -> ChannelStats:
        ch = self._channel(topic, channel, partition)
        return ChannelStats(
            topic=topic,
            channel=channel,
            depth=ch.depth,
            in_flight_count=len(ch.in_flight),
            deferred_count=len(ch.deferred),
            message_count=ch.message_count,
            requeue_count=ch.requeue_count,
            timeout_count=ch.timeout_count,
            client_count=len(ch.clients),
            paused=ch.paused,
            partition=partition,
        )

    def channel_messages(
        self, topic: str, channel: str, *, partition: int = -1
    ) -> list[MessageInfo]:
        """Every message the channel holds: queued (in order), in flight, deferred."""
        ch = self._channel(topic, channel, partition)
        out = [MessageInfo(m.id, m.body, m.attempts, m.timestamp, "queued") for m in ch.queue]
        for entry in ch.in_flight.values():
            m = entry.message
            out.append(
                MessageInfo(
                    m.id,
                    m.body,
                    m.attempts,
                    m.timestamp,
                    "in_flight",
                    entry.client_id,
                    entry.deadline,
                )
            )
        for m, ready_at, _ in ch.deferred.values():
            out.append(
                MessageInfo(m.id, m.body, m.attempts, m.timestamp, "deferred", None, ready_at)
            )
        return out

    def client_stats(self, conn: NsqdConnection | None = None) -> list[ClientStats]:
        """The server's view of its clients (all open ones, or just ``conn``)."""
        conns: Iterable[NsqdConnection] = self._conns.values() if conn is None else (conn,)
        return [
            ClientStats(
                id=c.id,
                client_id=c.client_id,
                hostname=c.hostname,
                remote_address=c.remote_address,
                state=c.state,
                ready_count=c.ready_count,
                in_flight_count=c.in_flight_count,
                message_count=c.message_count,
                finish_count=c.finish_count,
                requeue_count=c.requeue_count,
                subscription=c.subscription,
                closed=c.closed,
            )
            for c in conns
        ]

    def stats(
        self,
        now: float | None = None,
        *,
        topic: str = "",
        channel: str = "",
        include_clients: bool = True,
        include_mem: bool = True,
    ) -> dict[str, Any]:
        """The object ``GET /stats?format=json`` returns."""
        return stats_object(self, topic, channel, include_clients, include_mem)

    # -- HTTP ---------------------------------------------------------------------------------

    def handle_http(
        self,
        method: str,
        target: str,
        headers: Sequence[tuple[str, str]] = (),
        body: bytes = b"",
        *,
        now: float | None = None,
        tls: bool = False,
    ) -> HttpResponse:
        """Answer one HTTP request on nsqd's HTTP (or, with ``tls``, HTTPS) port."""
        if not self._running:
            raise NsqdStopped("nsqd is stopped")
        t = self._now if now is None else now
        self.begin_call(t)
        try:
            return handle_request(
                self, method, target, headers, body, t, dated=now is not None, tls=tls
            )
        finally:
            self.end_call(t)

    handle = handle_http

    def http_connection(self, now: float, *, tls: bool = False) -> HttpServerConnection:
        """A sans-IO HTTP/1.1 server connection answering with :meth:`handle_http`."""
        if not self._running:
            raise NsqdStopped("nsqd is stopped")

        def respond(
            method: str, target: str, headers: Sequence[tuple[str, str]], body: bytes, t: float
        ) -> HttpResponse:
            return self.handle_http(method, target, headers, body, now=t, tls=tls)

        return HttpServerConnection(respond, now)
