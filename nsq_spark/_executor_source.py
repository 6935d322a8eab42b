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
  with what the first messages weigh; at most nsqd's ``max_rdy_count``, which nsqd lets one
  connection hold unanswered: the rest of a larger share waits for a later batch), stages
  the rows (``_staging``: a temporary file moved
  to its name, the first writer wins), then FINishes them; an attempt that lost the race
  requeues what it consumed and returns the winner's rows.  What nsqd delivered beyond the
  share is requeued before the connection closes.

``commit(end)`` deletes the staged rows of the committed batches.  ``availableNow`` takes the
channel's depth when the query starts and stops once that many messages were planned.
"""

from __future__ import annotations

import contextlib
import json
import logging
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
from nsq_proto._lookupd import parse_lookup_response

from ._options import SourceOptions
from ._source import ConnectTimeout, check_columns, record_batch
from ._staging import Staging, default_staging_location

__all__ = ["NSQExecutorStreamReader", "NSQStagedPartition", "plan_batch"]

log = logging.getLogger("nsq_spark")

#: seconds a task waits for its first message (connecting and subscribing included)
FIRST_MESSAGE_WAIT = 5.0
#: seconds an HTTP request to nsqd or lookupd may take
HTTP_TIMEOUT = 10.0
#: messages taken from the consumer at once
_CHUNK = 1024


@dataclass(frozen=True)
class Part:
    """One input partition of a batch's plan: consume up to ``messages`` / ``bytes`` from the
    nsqd at ``address`` (its TCP address)."""

    address: str
    messages: int
    bytes: int


def plan_batch(
    depths: Mapping[str, int],
    *,
    max_messages: int,
    max_bytes: int,
    per_partition: int,
    min_partitions: int = 1,
) -> list[Part]:
    """Split a batch of at most ``max_messages`` and ``max_bytes`` over the nsqd whose channel
    has ``depths[address]`` messages waiting: each nsqd gets its fair share (what one does
    not need goes to the others), each partition at most ``per_partition`` messages, and at
    least ``min_partitions`` partitions when there are messages enough."""
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
    total = sum(alloc.values())
    if total == 0:
        return []
    tasks = {a: -(-n // per_partition) for a, n in alloc.items()}
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
            parts.append(Part(address, n, max(1, max_bytes * n // total)))
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
            f"NSQStagedPartition({self.value}, batch={self.batch}, nsqd={p.address}, "
            f"messages={p.messages}, bytes={p.bytes})"
        )


# ---------------------------------------------------------------------------------------------
# the driver: nsqd's and lookupd's HTTP APIs


def _http(address: str, path: str, *, post: bool = False) -> tuple[int, bytes]:
    request = urllib.request.Request(
        f"http://{address.removeprefix('http://')}{path}",
        data=b"" if post else None,
        method="POST" if post else "GET",
    )
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()


def _query(**params: str) -> str:
    return urllib.parse.urlencode(params, quote_via=urllib.parse.quote)


class _Planner:
    """What the driver knows: which nsqd have the topic, and how many messages wait."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.started = time.monotonic()
        self.answered = False
        self.last_error: str | None = None

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
        """TCP address -> messages waiting on the channel (ready, not in flight or deferred)."""
        o = self.options
        depths: dict[str, int] = {}
        for tcp, http in self.nodes().items():
            try:
                depths[tcp] = self._depth(http)
            except (OSError, ValueError, KeyError, TypeError) as exc:
                self.last_error = f"nsqd: {http}: {exc}"
                log.warning("the nsq source could not ask nsqd %s for its stats: %s", http, exc)
                continue
            self.answered = True
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

    def _depth(self, http: str) -> int:
        o = self.options
        topic = self._topic_stats(http)
        if topic is None:
            return 0
        for channel in topic.get("channels") or []:
            if channel["channel_name"] == o.channel:
                return int(channel["depth"])
        # a topic without our channel: create it, as a consumer's SUB would, so that messages
        # are kept for it from now on; a topic that had no channel at all hands it what it
        # holds (nsqd moves them over in the background)
        path = "/channel/create?" + _query(topic=o.topic, channel=o.channel)
        status, _ = _http(http, path, post=True)
        if status != 200:
            raise ValueError(f"/channel/create answered {status}")
        if topic.get("channels"):
            return 0
        after = self._topic_stats(http) or {}
        depth = max([0] + [int(c["depth"]) for c in after.get("channels") or []])
        return max(int(topic.get("depth", 0)), depth)

    def _topic_stats(self, http: str) -> dict[str, Any] | None:
        o = self.options
        # (not filtered by channel: nsqd then leaves out a topic without that channel)
        query = _query(format="json", topic=o.topic, include_clients="false")
        status, body = _http(http, "/stats?" + query)
        if status != 200:
            raise ValueError(f"/stats answered {status}")
        stats = json.loads(body)
        if "topics" not in stats and isinstance(stats.get("data"), dict):
            stats = stats["data"]  # the legacy envelope
        for topic in stats.get("topics") or []:
            if topic["topic_name"] == o.topic:
                return dict(topic)
        return None


# ---------------------------------------------------------------------------------------------
# the tasks


async def _consume_and_stage(
    options: SourceOptions,
    part: Part,
    arrow_schema: pa.Schema,
    stage: Callable[[pa.Table], bool],
) -> tuple[pa.Table, bool]:
    """Consume up to the part's share, stage the rows, then FIN them (or, if another attempt
    staged first, REQ them); (the rows consumed, whether they were staged by this call)."""
    o = options
    kwargs = o.consumer_kwargs()
    kwargs.pop("lookupd_http_addresses", None)
    kwargs["nsqd_tcp_addresses"] = [part.address]
    kwargs["max_in_flight"] = 1  # grows with what the first messages weigh
    cap = o.max_messages_per_partition
    taken: list[nsq_anyio.Message] = []
    extra: list[nsq_anyio.Message] = []
    size = 0
    async with nsq_anyio.Consumer(o.topic, o.channel, **kwargs) as consumer:
        #: nsqd's max_rdy_count on the connection: nsqd sends no more than that many messages
        #: before some are answered, and none is answered before the rows are staged
        held_limit: int | None = None
        while len(taken) < part.messages:
            wait = o.task_idle_timeout if taken else max(FIRST_MESSAGE_WAIT, o.task_idle_timeout)
            batch: list[nsq_anyio.Message] = []
            with anyio.move_on_after(wait):
                batch = await consumer.get_many(_CHUNK)
            if not batch:
                break  # nothing more came in time (or the consumer stopped)
            for message in batch:
                body = len(message.body)
                if len(taken) < part.messages and (not taken or size + body <= part.bytes):
                    taken.append(message)
                    size += body
                else:
                    extra.append(message)
            if extra:
                break  # the share is full
            if held_limit is None:
                held_limit = _max_rdy_count(consumer)
            if held_limit is not None and len(taken) >= held_limit:
                break  # the rest of the share waits for a later batch
            # nsqd sends while fewer than RDY are unanswered: RDY is what is held plus what
            # the rest of the share may still take, judged by the mean size so far
            mean = max(1.0, size / len(taken))
            room = min(part.messages - len(taken), int((part.bytes - size) / mean))
            if room <= 0:
                break
            consumer.set_max_in_flight(min(cap, held_limit or cap, len(taken) + room))
        consumer.set_max_in_flight(0)
        table = pa.Table.from_batches([record_batch(taken, arrow_schema, o.topic)])
        won = await anyio.to_thread.run_sync(stage, table)
        # a message can be gone from its connection (reconnected, timed out and delivered
        # again): its answer is moot
        with contextlib.suppress(nsq_anyio.NSQError):
            if won:
                await consumer.finish_many(m for m in taken if not m.has_responded)
            else:
                for message in taken:
                    if not message.has_responded:
                        await message.requeue(delay=0.0, backoff=False)
        for message in extra:
            with contextlib.suppress(nsq_anyio.NSQError):
                if not message.has_responded:
                    await message.requeue(delay=0.0, backoff=False)
        # leaving the block requeues what arrived meanwhile and closes gracefully
    return table, won


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
        #: availableNow: messages still to plan (the depth when the run began)
        self._available_now_left: int | None = None

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
        self._available_now_left = sum(self.planner.depths().values())

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        o = self.options
        max_messages = o.max_messages_per_trigger
        max_bytes = o.max_bytes_per_trigger
        if isinstance(limit, ReadMaxRows):
            max_messages = max(1, int(limit.max_rows))
        elif isinstance(limit, ReadMaxBytes):
            max_bytes = min(max_bytes, max(1, int(limit.max_bytes)))
        if self._available_now_left is not None:
            max_messages = min(max_messages, self._available_now_left)
            if max_messages <= 0:
                return start
        depths = self.planner.depths()
        parts = plan_batch(
            depths,
            max_messages=max_messages,
            max_bytes=max_bytes,
            per_partition=o.max_messages_per_partition,
            min_partitions=o.num_partitions,
        )
        if not parts:
            return start
        run = start.get("run") or self._run or uuid.uuid4().hex
        self._run = run
        if run not in self._marked:
            self.staging.mark(run)
            self._marked.add(run)
        if self._available_now_left is not None:
            self._available_now_left -= sum(p.messages for p in parts)
        return {
            "run": run,
            "batch": int(start.get("batch", 0)) + 1,
            "parts": [[p.address, p.messages, p.bytes] for p in parts],
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
            self.staging.delete_through(run, batch)
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
            arrow_schema = to_arrow_schema(self.schema, timezone="UTC")

            def stage(rows: pa.Table) -> bool:
                return self.staging.publish(run, batch, index, rows)

            table, won = anyio.run(
                _consume_and_stage, self.options, partition.part, arrow_schema, stage
            )
            if not won:
                table = self.staging.read(run, batch, index)
                if table is None:
                    raise RuntimeError(f"the staged rows of {partition!r} are gone")
        yield from table.to_batches()


def _plan_of(offset: dict[str, Any]) -> tuple[str | None, int, list[Part]]:
    try:
        run = offset.get("run")
        batch = int(offset.get("batch", 0))
        parts = [Part(str(a), int(m), int(b)) for a, m, b in offset.get("parts", [])]
    except (AttributeError, TypeError, ValueError):
        raise ValueError(f"not an offset of the nsq source: {offset!r}") from None
    return (None if run is None else str(run)), batch, parts
