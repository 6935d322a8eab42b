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
import logging
import math
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import anyio
import anyio.to_thread
import pyarrow as pa  # type: ignore[import-untyped]
from anyio.abc import TaskGroup
from pyspark.sql.datasource import InputPartition
from pyspark.sql.streaming.datasource import ReadLimit
from pyspark.sql.types import StructType

import nsq_anyio

from ._options import SourceOptions
from ._planner import Planner
from ._planning import (
    AvailableNow,
    Part,
    connections_for,
    encode_part,
    executor_limits,
    max_rdy_counts,
    offers,
    plan_batch,
    plan_of,
    read_limit,
)
from ._reader import NSQReader, fewer_collections
from ._rows import message_ids, record_batch
from ._staging import ID_COLUMN, NSQD_KEY, Staging, default_staging_location

__all__ = ["LateAttempt", "NSQExecutorStreamReader", "NSQStagedPartition"]

log = logging.getLogger("nsq_spark")

#: seconds a task waits for its first message (connecting and subscribing included)
FIRST_MESSAGE_WAIT = 5.0
#: seconds between two looks at nsqd's depth while nothing waits
IDLE_POLL_INTERVAL = 0.1
#: messages taken from the consumer at once
_CHUNK = 1024


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
            size = sum([len(m.body) for m in batch])
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
                wanted = connections_for(self.count + room, limit, o.max_connections_per_nsqd)
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
        consumers = self.consumers
        holding = [len(self.taken.get(c, ())) for c in consumers]
        for i, rdy in offers(holding, room, self.held_limit):
            consumers[i].set_max_in_flight(rdy)

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
    counts = max_rdy_counts(consumer.stats()["connections"], subscribed_only=False)
    return counts[0][1] if counts else None


# ---------------------------------------------------------------------------------------------
# what Spark calls


class NSQExecutorStreamReader(NSQReader):
    """Spark's stream reader of one topic/channel, read on the executors (see the module
    documentation)."""

    live = ("_planner",)
    partition_type = NSQStagedPartition

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        super().__init__(options, schema)
        self.staging = Staging(options.staging_location or default_staging_location())
        self._planner: Planner | None = None
        self._run: str | None = None
        self._marked: set[str] = set()
        #: availableNow: what waited when the run began
        self._available_now: AvailableNow | None = None

    # -- the driver side ------------------------------------------------------------------

    @property
    def planner(self) -> Planner:
        if self._planner is None:
            self._planner = Planner(self.options)
        return self._planner

    def initialOffset(self) -> dict[str, Any]:
        return {"batch": 0}

    def prepareForTriggerAvailableNow(self) -> None:
        depths = self.planner.depths()
        self._available_now = AvailableNow(depths, self.planner.counters)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        o = self.options
        max_messages, max_bytes = executor_limits(read_limit(limit), o)
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
            max_messages_per_task=o.max_messages_per_task,
            min_partitions=o.min_partitions,
            sizes=self.planner.sizes,
            max_bytes_per_task=o.max_bytes_per_task,
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
            "parts": [encode_part(p) for p in parts],
        }

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        run, batch, parts = plan_of(end)
        if run is None:
            return []
        if run not in self._marked:  # a batch of the log, planned by an earlier driver
            self.staging.mark(run)
            self._marked.add(run)
        return [NSQStagedPartition(i, run, batch, part) for i, part in enumerate(parts)]

    def commit(self, end: dict[str, Any]) -> None:
        run, batch, _ = plan_of(end)
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

    def read_rows(self, partition: NSQStagedPartition) -> Iterator[pa.RecordBatch]:
        run, batch, index = partition.run, partition.batch, partition.value
        table = self.staging.read(run, batch, index)
        if table is None:
            self.staging.check_shared(run)
            self._check_not_late(partition)
            arrow_schema = self.arrow_schema()
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
