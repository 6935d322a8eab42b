"""The streaming source read on the executors (``read_mode`` ``executors``, the default).

The driver only plans.  For each micro-batch it asks every nsqd that has the topic (the
``nsqd_tcp_addresses`` with their ``nsqd_http_addresses``, or those lookupd lists) how many
messages wait on the channel (``GET /stats``), and plans input partitions over them: each
partition is one nsqd, a number of messages and a number of bytes, its share of the batch's
limits.  The plan is the batch's end offset, so Spark's offset log keeps it:
``{"run": R, "batch": B, "parts": [[nsqd, messages, bytes], ...]}``; a topic with nothing
waiting makes no batch.  The driver keeps no message and opens no consumer connection.

A task (on an executor) reads its partition:

* if rows are staged for (run, batch, partition), it returns them: a task or a batch that
  runs again gives the same rows;
* otherwise it connects to its nsqd, consumes up to its share (messages and bytes: RDY grows
  with what the first messages weigh; nsqd lets one connection hold ``max_rdy_count``
  unanswered, so a larger share opens more connections: see :class:`_Share`), stages
  the rows (``_staging``: a temporary file moved
  to its name, the first writer wins), then FINishes them; an attempt that lost the race
  requeues what it consumed and returns the winner's rows.  What nsqd delivered beyond the
  share is requeued before the connection closes.

A task whose connections all ended after nsqd answered ``CLS`` with ``CLOSE_WAIT``, with no
FIN refused, knows nsqd processed its FINs and marks its rows confirmed.  A task of a batch
that was committed already (a slow attempt that speculation copied) takes no message: see
``_staging``.  ``commit(end)``
keeps the ids of unconfirmed rows (nsqd may deliver those messages again: a later task FINs
such a copy without making a row of it) and deletes the staged rows of the committed
batches.  ``availableNow`` takes the
channel's backlog when the query starts and stops once that many messages were FINished (as
nsqd's channel counters tell), or nothing of them is ready.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.to_thread
import pyarrow as pa  # type: ignore[import-untyped]
from anyio.abc import TaskGroup
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

import nsq_anyio
from nsq_proto import parse_lookup_response

from ._options import SourceOptions
from ._source import (
    ConnectTimeout,
    check_columns,
    fewer_collections,
    message_ids,
    record_batch,
)
from ._staging import ID_COLUMN, NSQD_KEY, Staging, default_staging_location

__all__ = ["NSQExecutorStreamReader", "NSQStagedPartition", "plan_batch"]

log = logging.getLogger("nsq_spark")

#: seconds a task waits for its first message (connecting and subscribing included)
FIRST_MESSAGE_WAIT = 5.0
#: seconds between two looks at nsqd's depth while nothing waits
IDLE_POLL_INTERVAL = 0.1
#: seconds an HTTP request to nsqd or lookupd may take
HTTP_TIMEOUT = 10.0
#: messages taken from the consumer at once
_CHUNK = 1024


@dataclass(frozen=True)
class Part:
    """One input partition of a batch's plan: consume up to ``messages`` / ``bytes`` from the
    nsqd at ``address`` (its TCP address), from its NSQ ``partition`` on the partitioned
    server."""

    address: str
    messages: int
    bytes: int
    partition: int | None = None

    @property
    def source(self) -> str:
        """Where the part reads: the nsqd, and its partition if any."""
        return _source(self.address, self.partition)


def _source(address: str, partition: int | None) -> str:
    return address if partition is None else f"{address} partition {partition}"


def plan_batch(
    depths: Mapping[str, int],
    *,
    max_messages: int,
    max_bytes: int,
    per_partition: int,
    min_partitions: int = 1,
    sizes: Mapping[str, float] | None = None,
    max_partition_bytes: int | None = None,
    sources: Mapping[str, tuple[str, int | None]] | None = None,
) -> list[Part]:
    """Split a batch of at most ``max_messages`` and ``max_bytes`` over the nsqd (or NSQ
    partitions: ``sources`` tells where each key reads) whose channel has ``depths[key]``
    messages waiting: each nsqd gets its fair share (what one does
    not need goes to the others), each partition at most ``per_partition`` messages and
    ``max_partition_bytes`` bytes, and at least ``min_partitions`` partitions when there are
    messages enough.

    ``sizes[address]``, where known, is the mean body size of the topic on that nsqd: the
    batch then takes no more messages than ``max_bytes`` holds at those sizes, and an nsqd's
    share is split into partitions of ``max_partition_bytes`` at most.  Whatever the sizes,
    each partition's byte limit is its share of ``max_bytes`` (and at most
    ``max_partition_bytes``): a task stops there."""
    sizes = sizes or {}
    alloc: dict[str, int] = {}
    budget = max_messages
    waiting = sorted(((d, a) for a, d in depths.items() if d > 0))
    for i, (depth, address) in enumerate(waiting):
        if budget <= 0:
            break
        fair = max(1, budget // (len(waiting) - i))
        take = min(depth, fair, budget)
        alloc[address] = take
        budget -= take
    estimate = sum(n * sizes.get(a, 0.0) for a, n in alloc.items())
    if estimate > max_bytes:  # the mean sizes say the messages would not fit: fewer of them
        alloc = {a: max(1, int(n * max_bytes / estimate)) for a, n in alloc.items()}
    total = sum(alloc.values())
    if total == 0:
        return []
    tasks = {}
    for address, n in alloc.items():
        count = -(-n // per_partition)
        size = sizes.get(address, 0.0)
        if max_partition_bytes is not None and size > 0:
            # as many tasks as it takes for each one's messages to fit at the mean size
            fit = max(1, int(max_partition_bytes // size))
            count = max(count, -(-n // fit))
        tasks[address] = min(n, count)
    while sum(tasks.values()) < min_partitions:
        address = max(tasks, key=lambda a: alloc[a] / tasks[a])
        if alloc[address] <= tasks[address]:
            break
        tasks[address] += 1
    parts = []
    for address in sorted(tasks):
        size, extra = divmod(alloc[address], tasks[address])
        for j in range(tasks[address]):
            n = size + (1 if j < extra else 0)
            limit = max_bytes * n // total
            if max_partition_bytes is not None:
                limit = min(limit, max_partition_bytes)
            where = sources.get(address, (address, None)) if sources else (address, None)
            parts.append(Part(where[0], n, max(1, limit), where[1]))
    return parts


class NSQStagedPartition(InputPartition):
    """One task of a micro-batch: its nsqd and share, and where its rows are staged."""

    def __init__(self, index: int, run: str, batch: int, part: Part) -> None:
        super().__init__(index)
        self.run = run
        self.batch = batch
        self.part = part

    def __repr__(self) -> str:
        p = self.part
        return (
            f"NSQStagedPartition({self.value}, batch={self.batch}, nsqd={p.source}, "
            f"messages={p.messages}, bytes={p.bytes})"
        )


# ---------------------------------------------------------------------------------------------
# the driver: nsqd's and lookupd's HTTP APIs


def _http(
    address: str, path: str, *, post: bool = False, tls: Callable[[], ssl.SSLContext] | None = None
) -> tuple[int, bytes]:
    """``address``: ``host:port`` or ``http://host:port`` (HTTP), or ``https://host:port``
    (HTTPS with the context ``tls`` makes)."""
    secure = address.startswith("https://")
    context = tls() if secure and tls is not None else None
    url = address if secure else f"http://{address.removeprefix('http://')}"
    request = urllib.request.Request(
        f"{url}{path}",
        data=b"" if post else None,
        method="POST" if post else "GET",
    )
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT, context=context) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()


def _query(**params: str) -> str:
    return urllib.parse.urlencode(params, quote_via=urllib.parse.quote)


#: a channel's counters in nsqd's ``/stats``: messages that reached it, then its backlog
_COUNTERS = ("message_count", "depth", "in_flight_count", "deferred_count")


class _AvailableNow:
    """``availableNow``: what is left of the messages that waited when the run began.

    On each nsqd: the channel's backlog (ready, in flight and deferred) less what reached the
    channel since the run began, as nsqd's channel counters tell.  A task may take fewer
    messages than it was planned (its share of the bytes, or nothing more came in time):
    they are still left, and planned again.  Where nsqd does not tell the counters, the
    depth when the run began less what was planned since."""

    def __init__(self, depths: Mapping[str, int], counters: Mapping[str, tuple[int, int]]):
        self.depths = dict(depths)
        self.counters = dict(counters)
        self.planned: dict[str, int] = {}

    def left(self, counters: Mapping[str, tuple[int, int]]) -> dict[str, int]:
        left = {}
        for address, depth in self.depths.items():
            then, now = self.counters.get(address), counters.get(address)
            if then is not None and now is not None:
                (arrived_then, _), (arrived, backlog) = then, now
                left[address] = max(0, backlog - (arrived - arrived_then))
            else:
                left[address] = max(0, depth - self.planned.get(address, 0))
        return left

    def plan(self, parts: Sequence[Part]) -> None:
        for part in parts:
            self.planned[part.source] = self.planned.get(part.source, 0) + part.messages


class _Planner:
    """What the driver knows: which nsqd have the topic, and how many messages wait."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.started = time.monotonic()
        self.answered = False
        self.last_error: str | None = None
        #: what the planner reads, by key (:attr:`Part.source`): an nsqd's TCP address, with
        #: an NSQ partition on the partitioned server
        self.sources: dict[str, tuple[str, int | None]] = {}
        #: source -> the mean body size of the messages there (where nsqd's stats tell: the
        #: channel's ``depth_size`` / ``depth``, or the topic's ``message_bytes`` /
        #: ``message_count``)
        self.sizes: dict[str, float] = {}
        #: source -> the channel's counters at the last stats, where nsqd tells them:
        #: (messages that reached the channel, its backlog: ready, in flight and deferred);
        #: a channel the planner creates counts the topic's messages as reached already
        self.counters: dict[str, tuple[int, int]] = {}
        self._context: ssl.SSLContext | None = None

    def _tls(self) -> ssl.SSLContext:
        if self._context is None:
            self._context = self.options.connection.https_context()
        return self._context

    def nodes(self) -> dict[str, str]:
        """TCP address -> HTTP address of every nsqd to read."""
        o = self.options
        c = o.connection
        nodes = dict(zip(c.nsqd_tcp_addresses, o.nsqd_http_addresses, strict=True))
        for lookupd in c.lookupd_http_addresses:
            try:
                status, body = _http(lookupd, "/lookup?" + _query(topic=o.topic))
                result = parse_lookup_response(status, body)
            except (OSError, ValueError) as exc:
                self.last_error = f"lookupd {lookupd}: {exc}"
                log.warning("the nsq source could not ask lookupd %s: %s", lookupd, exc)
                continue
            self.answered = True
            for peer in result.producers:
                nodes.setdefault(peer.key, f"{peer.broadcast_address}:{peer.http_port}")
        return nodes

    def depths(self) -> dict[str, int]:
        """Source (see :attr:`sources`) -> messages waiting on the channel there (ready, not
        in flight or deferred)."""
        o = self.options
        depths: dict[str, int] = {}
        for tcp, http in self.nodes().items():
            try:
                found = self._depths(http)
            except (OSError, ValueError, KeyError, TypeError) as exc:
                self.last_error = f"nsqd: {http}: {exc}"
                log.warning("the nsq source could not ask nsqd %s for its stats: %s", http, exc)
                continue
            self.answered = True
            for partition, depth, size, counters in found:
                if o.partitions is not None and partition not in o.partitions:
                    continue
                key = _source(tcp, partition)
                self.sources[key] = (tcp, partition)
                depths[key] = depth
                if size is not None:
                    self.sizes[key] = size
                if counters is not None:
                    self.counters[key] = counters
                else:
                    self.counters.pop(key, None)
        if not self.answered and time.monotonic() - self.started > o.connect_timeout:
            c = o.connection
            where = ", ".join(
                [
                    f"nsqd {t} (HTTP {h})"
                    for t, h in zip(c.nsqd_tcp_addresses, o.nsqd_http_addresses, strict=True)
                ]
                + [f"lookupd {a}" for a in c.lookupd_http_addresses]
            )
            raise ConnectTimeout(
                f"the nsq source of {o.topic}/{o.channel} has no nsqd to consume from after "
                f"connect_timeout ({o.connect_timeout:g} s) ({where})"
                + (f"; last error: {self.last_error}" if self.last_error else "")
            )
        return depths

    def _depths(
        self, http: str
    ) -> list[tuple[int | None, int, float | None, tuple[int, int] | None]]:
        """For each place of the topic on the nsqd at ``http`` (one, or each partition it
        leads on the partitioned server): its partition, the messages waiting on the channel,
        their mean body size and the channel's counters (see :attr:`counters`) if known."""
        found = []
        for topic in self._topic_stats(http):
            partitioned = "topic_partition" in topic
            if partitioned and topic.get("is_leader") is False:
                continue  # a replica: its leader is read
            partition = int(topic["topic_partition"]) if partitioned else None
            channel = self._channel(topic)
            if channel is not None:
                found.append((partition, *self._waiting(topic, channel, partitioned)))
                continue
            # a topic without our channel: create it, as a consumer's SUB would, so that
            # messages are kept for it from now on
            self._create_channel(http, partition)
            if partitioned or topic.get("channels"):
                # it starts empty (the partitioned server's at the end of the topic); what
                # reached the topic so far never reaches it
                arrived = topic.get("message_count") if partitioned else 0
                counters = (arrived, 0) if isinstance(arrived, int) else None
                found.append((partition, 0, self._mean(topic, None), counters))
                continue
            # nsqd hands a topic's first channel what the topic holds (in the background):
            # those messages count as there now
            after = [t for t in self._topic_stats(http) if "topic_partition" not in t]
            channel = self._channel(after[0]) if after else None
            depth = int(channel["depth"]) if channel is not None else 0
            depth = max(int(topic.get("depth", 0)), depth)
            found.append((None, depth, self._mean(topic, None), (depth, depth)))
        return found

    def _channel(self, topic: Mapping[str, Any]) -> Mapping[str, Any] | None:
        for channel in topic.get("channels") or []:
            if channel["channel_name"] == self.options.channel:
                return dict(channel)
        return None

    def _create_channel(self, http: str, partition: int | None) -> None:
        o = self.options
        where: dict[str, Any] = {"topic": o.topic, "channel": o.channel}
        if partition is not None:
            where["partition"] = partition
        status, _ = _http(http, "/channel/create?" + _query(**where), post=True, tls=self._tls)
        if status != 200:
            raise ValueError(f"/channel/create answered {status}")

    @staticmethod
    def _mean(topic: Mapping[str, Any], channel: Mapping[str, Any] | None) -> float | None:
        """The mean body size: of what waits on the channel where nsqd tells (the partitioned
        server), else of what the topic received."""
        if channel is not None:
            size, depth = channel.get("depth_size"), channel.get("depth")
            if isinstance(size, int) and isinstance(depth, int) and depth:
                return size / depth
        count, size = topic.get("message_count"), topic.get("message_bytes")
        return size / count if isinstance(size, int) and isinstance(count, int) and count else None

    def _waiting(
        self, topic: Mapping[str, Any], channel: Mapping[str, Any], partitioned: bool
    ) -> tuple[int, float | None, tuple[int, int] | None]:
        """(ready messages, mean body size, counters) of the channel.  nsqd's ``depth`` is
        what is ready; the partitioned server's counts what is unconfirmed, in flight and
        deferred too."""
        ready = int(channel["depth"])
        fields = [channel.get(k) for k in _COUNTERS]
        counters = None
        numbers = [f for f in fields if isinstance(f, int)]
        if len(numbers) == len(fields):
            arrived, depth, in_flight, deferred = numbers
            if partitioned:
                ready = max(0, depth - in_flight - deferred)
                counters = (arrived, depth)
            else:
                counters = (arrived, depth + in_flight + deferred)
        return ready, self._mean(topic, channel), counters

    def _topic_stats(self, http: str) -> list[dict[str, Any]]:
        """The topic's entries in nsqd's stats: one, or one per partition it holds."""
        o = self.options
        # (not filtered by channel: nsqd then leaves out a topic without that channel)
        query = _query(format="json", topic=o.topic, include_clients="false")
        status, body = _http(http, "/stats?" + query, tls=self._tls)
        if status != 200:
            raise ValueError(f"/stats answered {status}")
        stats = json.loads(body)
        if "topics" not in stats and isinstance(stats.get("data"), dict):
            stats = stats["data"]  # the legacy envelope
        return [dict(t) for t in stats.get("topics") or [] if t["topic_name"] == o.topic]


# ---------------------------------------------------------------------------------------------
# the tasks


class _Share:
    """One task's share of its nsqd, consumed over as many connections as it needs.

    nsqd lets one connection hold ``max_rdy_count`` (2,500 by default) unanswered messages,
    and a task answers none before its rows are staged: a share above that opens more
    connections to the same nsqd (up to ``max_connections_per_nsqd``), and RDY is split
    between them so that together they are never offered more than the share.  Each
    connection is a consumer in a task of its own, open until :meth:`release`; they close
    together, gracefully (what arrived after the share was taken goes back at once).
    """

    def __init__(
        self, options: SourceOptions, part: Part, suspects: frozenset[bytes] = frozenset()
    ) -> None:
        self.options = options
        self.part = part
        #: ids of messages written already whose FIN nsqd did not confirm: if one comes
        #: again, it is a copy, FINished and not a row
        self.suspects = suspects
        self.copies: list[nsq_anyio.Message] = []
        #: the task group of the connections (set by the caller)
        self.tg: TaskGroup | None = None
        #: the messages of the share, by the consumer that received them (answers go there)
        self.taken: dict[nsq_anyio.Consumer, list[nsq_anyio.Message]] = {}
        self.count = 0
        self.size = 0
        #: delivered beyond the share: requeued
        self.extra: list[nsq_anyio.Message] = []
        #: nsqd's max_rdy_count (None: not told)
        self.held_limit: int | None = None
        self.consumers: list[nsq_anyio.Consumer] = []
        self._receiving: list[anyio.CancelScope] = []
        self._released = anyio.Event()
        self._send, self._arrivals = anyio.create_memory_object_stream[int](math.inf)

    @property
    def full(self) -> bool:
        return self.count >= self.part.messages or bool(self.extra)

    def rows(self) -> list[nsq_anyio.Message]:
        """The messages of the share that are rows (not copies of rows written before)."""
        copies = {id(m) for m in self.copies}
        return [m for taken in self.taken.values() for m in taken if id(m) not in copies]

    def _take(self, consumer: nsq_anyio.Consumer, batch: list[nsq_anyio.Message]) -> None:
        part = self.part
        taken = self.taken.setdefault(consumer, [])
        if self.count and self.count + len(batch) <= part.messages and not self.suspects:
            size = sum([len(m.raw.body) for m in batch])
            if self.size + size <= part.bytes:  # all of it fits: taken at once
                taken.extend(batch)
                self.count += len(batch)
                self.size += size
                return
        for message in batch:
            body = len(message.body)
            if self.count < part.messages and (not self.count or self.size + body <= part.bytes):
                taken.append(message)
                self.count += 1
                self.size += body
                if message.attempts > 1 and message.id in self.suspects:
                    self.copies.append(message)
            else:
                self.extra.append(message)

    async def _connection(self, max_in_flight: int, *, task_status: Any) -> None:
        o = self.options
        kwargs = o.consumer_kwargs()
        kwargs.pop("lookupd_http_addresses", None)
        kwargs["nsqd_tcp_addresses"] = [self.part.address]
        kwargs.pop("partitions", None)
        if self.part.partition is not None:
            kwargs["partitions"] = (self.part.partition,)
        kwargs["max_in_flight"] = max_in_flight
        async with nsq_anyio.Consumer(o.topic, o.channel, **kwargs) as consumer:
            self.consumers.append(consumer)
            with anyio.CancelScope() as receiving:
                self._receiving.append(receiving)
                task_status.started()
                while batch := await consumer.get_many(_CHUNK):
                    self._take(consumer, batch)
                    self._send.send_nowait(len(batch))
            await self._released.wait()

    async def _open(self, max_in_flight: int) -> None:
        assert self.tg is not None
        await self.tg.start(self._connection, max_in_flight)

    def release(self) -> None:
        """Let the connections close (the answers were given)."""
        self._released.set()

    def close(self) -> None:
        self._send.close()
        self._arrivals.close()

    async def consume(self) -> None:
        """Take the share, or what comes before ``task_idle_timeout`` passes without any."""
        o = self.options
        part = self.part
        # the first connection asks for one message: what it weighs sizes RDY
        await self._open(1)
        while not self.full:
            wait = (
                o.task_idle_timeout if self.count else max(FIRST_MESSAGE_WAIT, o.task_idle_timeout)
            )
            with anyio.move_on_after(wait) as waiting:
                await self._arrivals.receive()
            if waiting.cancelled_caught:
                break  # nothing more came in time (or the consumers stopped)
            with contextlib.suppress(anyio.WouldBlock):
                while True:  # what else arrived meanwhile
                    self._arrivals.receive_nowait()
            if self.full or not self.count:
                continue
            if self.held_limit is None:
                self.held_limit = _max_rdy_count(self.consumers[0])
            # nsqd sends while fewer than RDY are unanswered: the connections together are
            # offered what they hold plus what the rest of the share may still take, judged
            # by the mean size so far
            mean = max(1.0, self.size / self.count)
            room = min(part.messages - self.count, int((part.bytes - self.size) / mean))
            if room <= 0:
                break
            limit = self.held_limit
            if limit is not None:
                wanted = min(o.max_connections_per_nsqd, -(-(self.count + room) // limit))
                while len(self.consumers) < wanted:
                    await self._open(0)
                if all(len(self.taken.get(c, ())) >= limit for c in self.consumers):
                    break  # each connection holds all it may: the rest waits for a later batch
            self._offer(room)
        # nothing more is taken: what still arrives stays with its consumer, which sends it
        # back when it closes
        for consumer in self.consumers:
            consumer.set_max_in_flight(0)
        for receiving in self._receiving:
            receiving.cancel()

    def _offer(self, room: int) -> None:
        """Set each connection's RDY to what it holds plus its part of ``room`` (split evenly,
        none above nsqd's max_rdy_count)."""
        limit = self.held_limit
        holding = {c: len(self.taken.get(c, ())) for c in self.consumers}
        # the fullest first: what they cannot take goes to the others
        order = sorted(self.consumers, key=holding.__getitem__, reverse=True)
        left = room
        for j, consumer in enumerate(order):
            even = -(-left // (len(order) - j))
            more = even if limit is None else min(even, max(0, limit - holding[consumer]))
            left -= more
            consumer.set_max_in_flight(holding[consumer] + more)

    async def answer(self, won: bool) -> None:
        """FIN the share's messages (staged by this attempt) or REQ them (another attempt
        staged first, or staging failed), and REQ what came beyond the share."""
        # a message can be gone from its connection (reconnected, timed out and delivered
        # again): its answer is moot
        copies = {id(m) for m in self.copies}
        for consumer, taken in self.taken.items():
            with contextlib.suppress(nsq_anyio.NSQError):
                finish = [m for m in taken if won or id(m) in copies]
                await consumer.finish_many(m for m in finish if not m.has_responded)
                for message in taken:
                    if not message.has_responded:
                        await message.requeue(delay=0.0, backoff=False)
        for message in self.extra:
            with contextlib.suppress(nsq_anyio.NSQError):
                if not message.has_responded:
                    await message.requeue(delay=0.0, backoff=False)


async def _consume_and_stage(
    options: SourceOptions,
    part: Part,
    arrow_schema: pa.Schema,
    stage: Callable[[pa.Table], bool],
    suspects: frozenset[bytes] = frozenset(),
) -> tuple[pa.Table, bool, bool]:
    """Consume up to the part's share, stage the rows, then FIN them (or, if another attempt
    staged first, REQ them); (the rows consumed, whether they were staged by this call,
    whether nsqd confirmed every answer)."""
    share = _Share(options, part, suspects)
    failure: Exception | None = None
    try:
        async with anyio.create_task_group() as share.tg:
            try:
                await share.consume()
                rows = share.rows()
                ids = message_ids(rows)
                batch = record_batch(rows, arrow_schema, options.topic, ids=ids)
                # the ids too: if nsqd does not confirm their FINs, later tasks know them
                table = pa.Table.from_batches([batch]).append_column(ID_COLUMN, ids)
                table = table.replace_schema_metadata({NSQD_KEY: part.source.encode()})
                won = await anyio.to_thread.run_sync(stage, table)
                await share.answer(won)
            except Exception as exc:  # the connections still close gracefully
                failure = exc
                await share.answer(False)
            finally:
                share.release()
    finally:
        share.close()
    if failure is not None:
        raise failure
    return table, won, all(c.answers_confirmed for c in share.consumers)


def _max_rdy_count(consumer: nsq_anyio.Consumer) -> int | None:
    for connection in consumer.stats()["connections"]:
        if connection["max_rdy_count"] is not None:
            return connection["max_rdy_count"]
    return None


# ---------------------------------------------------------------------------------------------
# what Spark calls


class NSQExecutorStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Spark's stream reader of one topic/channel, read on the executors (see the module
    documentation)."""

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema
        check_columns(schema)
        self.staging = Staging(options.staging_location or default_staging_location())
        self._planner: _Planner | None = None
        self._run: str | None = None
        self._marked: set[str] = set()
        #: availableNow: what waited when the run began
        self._available_now: _AvailableNow | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_planner"] = None
        return state

    # -- the driver side ------------------------------------------------------------------

    @property
    def planner(self) -> _Planner:
        if self._planner is None:
            self._planner = _Planner(self.options)
        return self._planner

    def initialOffset(self) -> dict[str, Any]:
        return {"batch": 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.options.max_messages_per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:
        depths = self.planner.depths()
        self._available_now = _AvailableNow(depths, self.planner.counters)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        o = self.options
        max_messages = o.max_messages_per_trigger
        max_bytes = o.max_bytes_per_trigger
        if isinstance(limit, ReadMaxRows):
            max_messages = max(1, int(limit.max_rows))
        elif isinstance(limit, ReadMaxBytes):
            max_bytes = min(max_bytes, max(1, int(limit.max_bytes)))
        depths = self.planner.depths()
        if self._available_now is not None:
            # no more than what is left of what waited when the run began (an nsqd found
            # since then had nothing for the run)
            left = self._available_now.left(self.planner.counters)
            depths = {a: min(d, left.get(a, 0)) for a, d in depths.items()}
        parts = plan_batch(
            depths,
            max_messages=max_messages,
            max_bytes=max_bytes,
            per_partition=o.max_messages_per_partition,
            min_partitions=o.num_partitions,
            sizes=self.planner.sizes,
            max_partition_bytes=o.max_bytes_per_partition,
            sources=self.planner.sources,
        )
        if not parts:
            # Spark asks again at once (every 10 ms with the default trigger): an idle query
            # would keep the driver, its source runner and nsqd busy answering; an empty plan
            # ends an availableNow run, at once
            if self._available_now is None:
                time.sleep(IDLE_POLL_INTERVAL)
            return start
        run = start.get("run") or self._run or uuid.uuid4().hex
        self._run = run
        if run not in self._marked:
            self.staging.mark(run)
            self._marked.add(run)
        if self._available_now is not None:
            self._available_now.plan(parts)
        return {
            "run": run,
            "batch": int(start.get("batch", 0)) + 1,
            "parts": [_encode(p) for p in parts],
        }

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        run, batch, parts = _plan_of(end)
        if run is None:
            return []
        if run not in self._marked:  # a batch of the log, planned by an earlier driver
            self.staging.mark(run)
            self._marked.add(run)
        return [NSQStagedPartition(i, run, batch, part) for i, part in enumerate(parts)]

    def commit(self, end: dict[str, Any]) -> None:
        run, batch, _ = _plan_of(end)
        if run is None:
            return
        try:
            self.staging.delete_through(
                run, batch, redelivery_window=self.options.redelivery_window
            )
        except OSError:
            log.warning("the nsq source could not delete staged batches", exc_info=True)

    def stop(self) -> None:
        pass

    # -- the executor side ------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, NSQStagedPartition):
            raise TypeError(f"not a partition of the nsq source: {partition!r}")
        run, batch, index = partition.run, partition.batch, partition.value
        table = self.staging.read(run, batch, index)
        if table is None:
            self.staging.check_shared(run)
            self._check_not_late(partition)
            arrow_schema = to_arrow_schema(self.schema, timezone="UTC")
            suspects = self.staging.suspects(run, partition.part.source)

            def stage(rows: pa.Table) -> bool:
                won = self.staging.publish(run, batch, index, rows)
                if won:
                    # the name is free again once a committed batch's rows were deleted: the
                    # rows of this attempt would never be written, its messages go back
                    try:
                        self._check_not_late(partition)
                    except LateAttempt:
                        self.staging.discard(run, batch, index)
                        raise
                return won

            with fewer_collections():
                table, won, confirmed = anyio.run(
                    _consume_and_stage, self.options, partition.part, arrow_schema, stage, suspects
                )
            if won and confirmed:
                try:
                    self.staging.confirm(run, batch, index)
                except OSError:  # its ids are kept at commit: nothing is lost, a copy is known
                    log.warning("the nsq source could not mark %r confirmed", partition)
            if not won:
                table = self.staging.read(run, batch, index)
                if table is None:
                    self._check_not_late(partition)  # committed and deleted meanwhile
                    raise RuntimeError(f"the staged rows of {partition!r} are gone")
        if ID_COLUMN in table.column_names:
            table = table.drop_columns([ID_COLUMN])
        yield from table.replace_schema_metadata(None).to_batches()

    def _check_not_late(self, partition: NSQStagedPartition) -> None:
        committed = self.staging.committed(partition.run)
        if committed >= partition.batch:
            raise LateAttempt(
                f"batch {partition.batch} of the nsq source was committed already (the last "
                f"committed is {committed}): this attempt of its partition {partition.value} "
                "ran late (another attempt's rows were written: a speculative copy, or a task "
                "Spark was ending) and takes no message"
            )


class LateAttempt(RuntimeError):
    """A task of a batch that was committed already: Spark keeps none of its rows, so it
    takes (or keeps) no message."""


def _encode(part: Part) -> list[Any]:
    """A part in the offset log: ``[nsqd, messages, bytes]``, and its partition if any."""
    encoded: list[Any] = [part.address, part.messages, part.bytes]
    if part.partition is not None:
        encoded.append(part.partition)
    return encoded


def _decode(encoded: Sequence[Any]) -> Part:
    address, messages, size, *partition = encoded
    if len(partition) > 1:
        raise ValueError("too many fields")
    return Part(str(address), int(messages), int(size), int(partition[0]) if partition else None)


def _plan_of(offset: dict[str, Any]) -> tuple[str | None, int, list[Part]]:
    try:
        run = offset.get("run")
        batch = int(offset.get("batch", 0))
        parts = [_decode(p) for p in offset.get("parts", [])]
    except (AttributeError, TypeError, ValueError):
        raise ValueError(f"not an offset of the nsq source: {offset!r}") from None
    return (None if run is None else str(run)), batch, parts
