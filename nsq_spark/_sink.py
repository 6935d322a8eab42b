"""The sink: ``df.write.format("nsq")`` and ``df.writeStream.format("nsq")``.

Each Spark task publishes its partition's rows with MPUB (DPUB for rows with a ``delay``) and
returns only once nsqd acknowledged every one; a failed publish fails the task, which Spark tries
again as its settings say (``spark.task.maxFailures`` on a cluster; ``local[N]`` tries a task
once, ``local[N,M]`` M times): at-least-once, duplicates possible, never a loss.  The producers live in a pool per worker
process (one ``nsq_anyio.Producer`` per distinct set of connection options), on an event loop of
their own, so consecutive tasks and micro-batches reuse their connections.
"""

from __future__ import annotations

import atexit
import logging
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import anyio
import pyarrow as pa  # type: ignore[import-untyped]
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    BinaryType,
    DataType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
)

import nsq_anyio

from ._loop import LoopThread
from ._options import SinkOptions

__all__ = ["NSQWriter", "NSQStreamWriter", "NSQCommitMessage", "check_sink_schema"]

log = logging.getLogger("nsq_spark")

_NUMBER = (ShortType, IntegerType, LongType, FloatType, DoubleType, DecimalType)
_KNOWN = {
    "body": (BinaryType, StringType),
    "topic": (StringType,),
    "delay": _NUMBER,
    "partition": (ShortType, IntegerType, LongType),
    "sharding_key": (BinaryType, StringType),
}


def check_sink_schema(schema: StructType, options: SinkOptions) -> None:
    """Fail at planning time for a DataFrame the sink cannot publish."""
    types: dict[str, DataType] = {f.name: f.dataType for f in schema.fields}
    if "body" not in types:
        raise ValueError("the nsq sink needs a 'body' column (binary or string)")
    for name, allowed in _KNOWN.items():
        if name in types and not isinstance(types[name], allowed):
            raise ValueError(
                f"the nsq sink's column {name!r} cannot be {types[name].simpleString()}"
            )
    if "topic" not in types and options.topic is None:
        raise ValueError("the nsq sink needs the option 'topic' or a 'topic' column")


@dataclass
class NSQCommitMessage(WriterCommitMessage):
    """What one task published."""

    messages: int
    requests: int


# ---------------------------------------------------------------------------------------------
# the worker process's producers


@dataclass(frozen=True)
class _Request:
    topic: str
    bodies: list[bytes]
    delay: float | None = None
    partition: int | None = None
    sharding_key: bytes | None = None


class _PooledProducer:
    """One open ``nsq_anyio.Producer`` on the pool's loop."""

    def __init__(self, loop: LoopThread, options: SinkOptions) -> None:
        self.options = options
        self._loop = loop
        self._producer: nsq_anyio.Producer | None = None
        self._close: anyio.Event | None = None
        self._future, _ = loop.portal.start_task(self._hold)

    async def _hold(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        self._close = anyio.Event()
        async with nsq_anyio.Producer(**self.options.producer_kwargs()) as producer:
            self._producer = producer
            task_status.started()
            await self._close.wait()

    async def _publish_all(self, requests: list[_Request]) -> None:
        producer = self._producer
        assert producer is not None
        limiter = anyio.CapacityLimiter(self.options.max_outstanding * self.options.pool_size)

        async def one(request: _Request) -> None:
            async with limiter:
                if request.delay is not None:
                    (body,) = request.bodies
                    await producer.publish(
                        request.topic,
                        body,
                        delay=request.delay,
                        partition=request.partition,
                        sharding_key=request.sharding_key,
                    )
                elif len(request.bodies) == 1:
                    await producer.publish(
                        request.topic,
                        request.bodies[0],
                        partition=request.partition,
                        sharding_key=request.sharding_key,
                    )
                else:
                    await producer.publish_many(
                        request.topic,
                        request.bodies,
                        partition=request.partition,
                        sharding_key=request.sharding_key,
                    )

        if len(requests) == 1:
            await one(requests[0])
            return
        async with anyio.create_task_group() as tg:
            for request in requests:
                tg.start_soon(one, request)

    def publish(self, requests: list[_Request]) -> None:
        try:
            self._loop.call(self._publish_all, requests)
        except BaseExceptionGroup as group:
            raise _first(group) from None

    async def _aclose(self) -> None:
        if self._close is not None:
            self._close.set()

    def close(self) -> None:
        try:
            self._loop.call(self._aclose)
            self._future.result(timeout=self.options.publish_timeout + 10.0)
        except Exception:
            log.debug("closing an nsq producer failed", exc_info=True)


def _first(group: BaseExceptionGroup[Any]) -> BaseException:
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc


class _Pool:
    """The producers of this worker process, keyed by their options."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: LoopThread | None = None
        self._producers: dict[tuple[Any, ...], _PooledProducer] = {}

    def get(self, options: SinkOptions) -> _PooledProducer:
        key = options.producer_key()
        with self._lock:
            producer = self._producers.get(key)
            if producer is None:
                if self._loop is None or not self._loop.alive:
                    self._loop = LoopThread("nsq-spark-sink")
                producer = _PooledProducer(self._loop, options)
                self._producers[key] = producer
            return producer

    def discard(self, options: SinkOptions) -> None:
        with self._lock:
            producer = self._producers.pop(options.producer_key(), None)
        if producer is not None:
            producer.close()

    def close(self) -> None:
        with self._lock:
            producers = list(self._producers.values())
            self._producers.clear()
            loop, self._loop = self._loop, None
        for producer in producers:
            producer.close()
        if loop is not None:
            loop.close()


_POOL = _Pool()
atexit.register(_POOL.close)


# ---------------------------------------------------------------------------------------------
# rows to requests


def _as_bytes(value: Any, column: str) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    raise TypeError(f"the nsq sink's column {column!r} holds {type(value).__name__}")


def _requests(batch: pa.RecordBatch, options: SinkOptions) -> Iterator[_Request]:
    """The rows of one Arrow batch as publish requests: rows to the same topic (and partition,
    sharding key) share MPUBs of at most ``batch_size`` rows / ``batch_bytes`` bytes, in row
    order; each delayed row is a DPUB of its own."""
    names = batch.schema.names
    bodies = batch.column(names.index("body")).to_pylist()
    n = len(bodies)

    def column(name: str) -> list[Any]:
        return batch.column(names.index(name)).to_pylist() if name in names else [None] * n

    topics = column("topic")
    delays = column("delay")
    partitions = column("partition")
    keys = column("sharding_key")
    default_topic = options.topic
    open_groups: dict[tuple[str, int | None, bytes | None], tuple[list[bytes], list[int]]] = {}
    for i in range(n):
        body = bodies[i]
        if body is None:
            raise ValueError("the nsq sink cannot publish a row whose body is null")
        body = _as_bytes(body, "body")
        topic = topics[i] if topics[i] is not None else default_topic
        if topic is None:
            raise ValueError("a row has no topic: set the 'topic' option or the 'topic' column")
        partition = None if partitions[i] is None else int(partitions[i])
        key = None if keys[i] is None else _as_bytes(keys[i], "sharding_key")
        delay = delays[i]
        if delay is not None and float(delay) > 0:
            yield _Request(topic, [body], float(delay), partition, key)
            continue
        group_key = (topic, partition, key)
        group = open_groups.get(group_key)
        if group is None:
            group = open_groups[group_key] = ([], [0])
        group_bodies, size = group
        if group_bodies and (
            len(group_bodies) >= options.batch_size or size[0] + len(body) > options.batch_bytes
        ):
            yield _Request(topic, list(group_bodies), None, partition, key)
            group_bodies.clear()
            size[0] = 0
        group_bodies.append(body)
        size[0] += len(body)
    for (topic, partition, key), (group_bodies, _) in open_groups.items():
        if group_bodies:
            yield _Request(topic, group_bodies, None, partition, key)


def publish_batches(batches: Iterable[pa.RecordBatch], options: SinkOptions) -> NSQCommitMessage:
    """Publish every row and wait for every OK (what one Spark task does)."""
    producer = _POOL.get(options)
    messages = requests = 0
    # one Arrow batch at a time: its MPUBs go out together, pipelined
    try:
        for batch in batches:
            if batch.num_rows == 0:
                continue
            pending = list(_requests(batch, options))
            producer.publish(pending)
            messages += sum(len(r.bodies) for r in pending)
            requests += len(pending)
    except nsq_anyio.NSQError:
        # start afresh on the retry: the connections may be what failed
        _POOL.discard(options)
        raise
    return NSQCommitMessage(messages=messages, requests=requests)


class NSQWriter(DataSourceArrowWriter):
    """``df.write.format("nsq")``: append-only publishing."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> NSQCommitMessage:
        return publish_batches(iterator, self.options)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        total = sum(m.messages for m in messages if isinstance(m, NSQCommitMessage))
        log.info("published %d messages to nsq", total)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        total = sum(m.messages for m in messages if isinstance(m, NSQCommitMessage))
        log.warning("write aborted; %d messages had been published by tasks that succeeded", total)


class NSQStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("nsq")``: each micro-batch is published before it commits."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> NSQCommitMessage:
        return publish_batches(iterator, self.options)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        total = sum(m.messages for m in messages if isinstance(m, NSQCommitMessage))
        log.debug("batch %d: published %d messages to nsq", batchId, total)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning("batch %d aborted: it is published again when it is retried", batchId)
