"""The streaming source: ``spark.readStream.format("nsq")``.

NSQ cannot replay, so an offset is a sequence counter of this reader, ``{"seq": N}``: the messages
of a micro-batch are the ones numbered ``start <= seq < end``.  The reader lives on the driver, in
the one Python process Spark keeps for the source while the query runs; it owns an
``nsq_anyio.Consumer`` on an event loop in a background thread and holds every message until
the batch that carries it has been committed by the sink:

* ``latestOffset(start, limit)``: Spark asks past ``start`` only once the batch ending at
  ``start`` is committed, so everything numbered below ``start`` is FINished first; then up to
  ``limit`` held messages are numbered for the next batch.
* ``partitions(start, end)``: the rows themselves travel in the input partitions, so executors
  do no network I/O.
* ``commit(end)``: FINishes everything below ``end`` again (idempotent; Spark sends it one
  trigger late).
* held messages are TOUCHed in the background so that nsqd does not time them out while a batch
  runs; ``stop()`` requeues what is held and unanswered.

After a crash, whatever was not FINished comes back from nsqd with ``attempts`` + 1: delivery is
at-least-once, and ``id`` / ``attempts`` let a pipeline drop duplicates.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, NoReturn

import anyio
import pyarrow as pa  # type: ignore[import-untyped]
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

import nsq_anyio

from ._loop import LoopThread
from ._options import SourceOptions

__all__ = [
    "ConnectTimeout",
    "NSQStreamReader",
    "NSQInputPartition",
    "RefusingStreamReader",
    "SOURCE_COLUMNS",
]

log = logging.getLogger("nsq_spark")

#: the columns the source can produce, in the order of its default schema
SOURCE_COLUMNS = ("body", "id", "attempts", "timestamp", "topic", "nsqd", "partition", "trace_id")


class ConnectTimeout(TimeoutError):
    """The source found no nsqd to consume from within ``connect_timeout``."""


# tracebacks name it where users import it from
ConnectTimeout.__module__ = "nsq_spark"


def _offset(seq: int) -> dict[str, int]:
    return {"seq": seq}


def _seq(offset: dict[str, Any]) -> int:
    try:
        return int(offset["seq"])
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"not an offset of the nsq source: {offset!r}") from None


def _message_id(raw: bytes) -> str:
    """nsqd's ids are 16 hex digits; the partitioned server's are binary (shown in hex)."""
    if raw.isascii():
        text = raw.decode("ascii")
        if text.isprintable():
            return text
    return raw.hex()


class NSQInputPartition(InputPartition):
    """The rows of one Spark partition of a micro-batch, column by column."""

    def __init__(self, index: int, columns: dict[str, list[Any]]) -> None:
        super().__init__(index)
        self.columns = columns

    def __len__(self) -> int:
        return len(self.columns["body"])

    def __repr__(self) -> str:
        return f"NSQInputPartition({self.value}, rows={len(self)})"


# ---------------------------------------------------------------------------------------------
# what runs on the event loop


@dataclass(eq=False, slots=True)
class _Held:
    message: nsq_anyio.Message
    received_at: float
    touched_at: float
    #: handed to Spark by ``partitions()``
    planned: bool = False


@dataclass(eq=False)
class _Feed:
    """The consumer and the messages it holds; every method runs on the reader's loop."""

    options: SourceOptions
    #: a new query (not one resuming from its checkpoint): start_from applies
    fresh: bool = False
    #: received, not yet numbered for a batch
    held: deque[_Held] = field(default_factory=deque)
    #: numbered for a batch (seq -> message), not yet FINished
    batched: dict[int, _Held] = field(default_factory=dict)
    #: received during an availableNow run but published after it began: never numbered
    later: list[_Held] = field(default_factory=list)
    next_seq: int = 0
    available_now_cutoff_ns: int | None = None
    failure: BaseException | None = None
    _arrived: anyio.Event | None = None
    _scope: anyio.CancelScope | None = None
    _consumer: nsq_anyio.Consumer | None = None
    _done: anyio.Event | None = None
    _warned_max_timeout: bool = False
    _warned_rdy_cap: bool = False

    async def run(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        o = self.options
        self._done = anyio.Event()
        self._arrived = anyio.Event()
        try:
            with anyio.CancelScope() as scope:
                self._scope = scope
                async with nsq_anyio.Consumer(
                    o.topic, o.channel, **o.consumer_kwargs(fresh=self.fresh)
                ) as consumer:
                    self._consumer = consumer
                    task_status.started()
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(self._touch_loop)
                        tg.start_soon(self._connect_deadline, consumer)
                        async for message in consumer:  # ends once the consumer stopped
                            self._receive(message)
                        tg.cancel_scope.cancel()
        except Exception as exc:
            self.failure = exc
            log.exception("the nsq consumer of %s/%s failed", o.topic, o.channel)
            raise
        finally:
            self._consumer = None
            self._done.set()
            self._arrived.set()

    async def _connect_deadline(self, consumer: nsq_anyio.Consumer) -> None:
        """Fail the source when it has nothing to consume from ``connect_timeout`` seconds
        after it started: no subscribed nsqd connection and, with lookupd, no answer that
        lists no nsqd yet (a topic nobody published to)."""
        o = self.options
        with anyio.move_on_after(o.connect_timeout):
            while True:
                stats = consumer.stats()
                if any(c["state"] == "SUBSCRIBED" for c in stats["connections"]):
                    return
                lookup = consumer.last_lookup
                if lookup is not None and not lookup.producers:
                    return
                await anyio.sleep(0.05)
        c = o.connection
        where = ", ".join(
            [f"nsqd {a}" for a in c.nsqd_tcp_addresses]
            + [f"lookupd {a}" for a in c.lookupd_http_addresses]
        )
        causes = []
        if consumer.lookup_failures:
            causes.append(f"lookupd: {consumer.lookup_failures[-1].error}")
        if consumer.connection_errors:
            error = consumer.connection_errors[-1]
            cause = error.__cause__
            text = str(error)
            if cause is not None and str(cause) not in text:
                text += f" ({cause})"
            causes.append(f"nsqd: {text}")
        if consumer.last_lookup is not None and consumer.last_lookup.producers:
            causes.append(f"lookupd listed {', '.join(consumer.last_lookup.producers)}")
        self.failure = ConnectTimeout(
            f"the nsq source of {o.topic}/{o.channel} has no nsqd to consume from after "
            f"connect_timeout ({o.connect_timeout:g} s) ({where})"
            + (f"; last error: {'; '.join(causes)}" if causes else "")
        )
        log.error("%s", self.failure)
        assert self._scope is not None
        self._scope.cancel()

    def _receive(self, message: nsq_anyio.Message) -> None:
        now = anyio.current_time()
        held = _Held(message, now, now)
        cutoff = self.available_now_cutoff_ns
        if cutoff is not None and message.timestamp > cutoff:
            self.later.append(held)
        else:
            self.held.append(held)
        assert self._arrived is not None
        self._arrived.set()

    async def _touch_loop(self) -> None:
        o = self.options
        interval = o.touch_interval
        while True:
            await anyio.sleep(interval / 2)
            now = anyio.current_time()
            for held in self._all_held():
                if now - held.touched_at < interval:
                    continue
                if now - held.received_at + o.msg_timeout > o.max_msg_timeout:
                    # nsqd will not extend past max_msg_timeout: it times out and comes back
                    if not self._warned_max_timeout:
                        self._warned_max_timeout = True
                        log.warning(
                            "a message has been held for max_msg_timeout (%.0f s): nsqd will "
                            "deliver it again",
                            o.max_msg_timeout,
                        )
                    continue
                held.touched_at = now
                message = held.message
                if not message.has_responded:
                    with contextlib.suppress(nsq_anyio.NSQError):
                        await message.touch()

    def _all_held(self) -> list[_Held]:
        return [*self.batched.values(), *self.held, *self.later]

    async def finish_before(self, seq: int) -> int:
        """FIN every message numbered below ``seq``; returns how many."""
        done = [s for s in self.batched if s < seq]
        unread = 0
        for s in done:
            held = self.batched.pop(s)
            # a message Spark never asked for is not processed: it goes back to nsqd
            unread += not held.planned
            await self._answer(held, finish=held.planned)
        if unread:
            log.warning("%d messages were committed but never read: requeued", unread)
        return len(done)

    async def _answer(self, held: _Held, *, finish: bool) -> None:
        message = held.message
        if message.has_responded:
            return
        # a message can be gone from the connection (reconnected, timed out and delivered
        # again): nsqd redelivers it, the answer is moot
        with contextlib.suppress(nsq_anyio.NSQError):
            if finish:
                await message.finish()
            else:
                await message.requeue(delay=0.0, backoff=False)

    def _check_rdy_cap(self) -> None:
        """Warn (once) when nsqd lets the source hold fewer messages than max_in_flight."""
        consumer = self._consumer
        o = self.options
        if self._warned_rdy_cap or consumer is None or o.ordered:
            return
        caps = {
            c["address"]: c["max_rdy_count"]
            for c in consumer.stats()["connections"]
            if c["state"] == "SUBSCRIBED" and c["max_rdy_count"] is not None
        }
        if caps and sum(caps.values()) < o.max_in_flight:
            self._warned_rdy_cap = True
            log.warning(
                "max_in_flight %d is above what nsqd allows: the source holds at most %d "
                "messages (max_rdy_count per connection: %s; nsqd's --max-rdy-count)",
                o.max_in_flight,
                sum(caps.values()),
                ", ".join(f"{address} {cap}" for address, cap in sorted(caps.items())),
            )

    async def advance(self, start: int, limit: tuple[str, int]) -> int:
        """Finish what is before ``start`` and number held messages for the next batch."""
        self._check_rdy_cap()
        self.next_seq = max(self.next_seq, start)
        await self.finish_before(start)
        kind, amount = limit
        if self.available_now_cutoff_ns is not None:
            await self._wait_until_quiet(amount if kind == "rows" else None)
        planned = self.next_seq - start
        if kind == "min_rows" and planned + len(self.held) < amount:
            return self.next_seq
        taken_bytes = sum(
            len(self.batched[s].message.body)
            for s in range(start, self.next_seq)
            if s in self.batched
        )
        while self.held:
            if kind == "rows" and planned >= amount:
                break
            size = len(self.held[0].message.body)
            if kind == "bytes" and planned > 0 and taken_bytes + size > amount:
                break
            self.batched[self.next_seq] = self.held.popleft()
            self.next_seq += 1
            planned += 1
            taken_bytes += size
        return self.next_seq

    async def _wait_until_quiet(self, rows: int | None) -> None:
        """availableNow: let what nsqd has for us arrive (until ``rows`` are held or nothing
        arrived for ``available_now_idle_timeout``)."""
        idle = self.options.available_now_idle_timeout
        while self.failure is None and not (self._done and self._done.is_set()):
            if rows is not None and len(self.held) >= rows:
                return
            self._arrived = anyio.Event()
            with anyio.move_on_after(idle) as scope:
                await self._arrived.wait()
            if scope.cancelled_caught:
                return

    async def rows(self, start: int, end: int) -> list[_Held]:
        self.next_seq = max(self.next_seq, end)
        rows = [self.batched[s] for s in range(start, end) if s in self.batched]
        for held in rows:
            held.planned = True
        return rows

    async def latest(self) -> int:
        return self.next_seq + len(self.held)

    async def prepare_available_now(self) -> None:
        self.available_now_cutoff_ns = time.time_ns()
        # what was already received but published later waits for the next run
        keep: deque[_Held] = deque()
        for held in self.held:
            if held.message.timestamp > self.available_now_cutoff_ns:
                self.later.append(held)
            else:
                keep.append(held)
        self.held = keep

    async def shutdown(self) -> None:
        """Requeue every message held and unanswered, then stop the consumer."""
        consumer = self._consumer
        if consumer is not None:
            consumer.set_max_in_flight(0)  # nothing more, not even what is requeued now
        pending = self._all_held()
        self.batched.clear()
        self.held.clear()
        self.later.clear()
        for held in pending:
            await self._answer(held, finish=False)
        if consumer is not None:
            # a graceful stop: the answers go out before the connections close
            try:
                with anyio.move_on_after(10.0):
                    await consumer.stop()
            except nsq_anyio.NSQError:
                log.warning("stopping the nsq consumer failed", exc_info=True)
        if self._done is not None:
            with anyio.move_on_after(5.0):
                await self._done.wait()
        if self._scope is not None:
            self._scope.cancel()

    async def stats(self) -> dict[str, int]:
        return {
            "held": len(self.held),
            "batched": len(self.batched),
            "later": len(self.later),
            "next_seq": self.next_seq,
        }


# ---------------------------------------------------------------------------------------------
# what Spark calls


class _Runtime:
    """The reader's live part: a loop thread and the feed on it (never pickled)."""

    def __init__(self, options: SourceOptions, *, fresh: bool = False) -> None:
        self.loop = LoopThread(f"nsq-spark-source-{options.topic}")
        self.feed = _Feed(options, fresh=fresh)
        self.closed = False
        try:
            self.future, _ = self.loop.portal.start_task(self.feed.run)
        except BaseException:
            self.loop.close()
            raise

    def check(self) -> None:
        failure = self.feed.failure
        if failure is None:
            return
        if isinstance(failure, ConnectTimeout):
            raise ConnectTimeout(*failure.args)
        raise RuntimeError(f"the nsq consumer failed: {failure}") from failure

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            if self.loop.alive:
                self.loop.call(self.feed.shutdown)
        finally:
            self.loop.close()


_SIGTERM_LOCK = threading.Lock()
_SIGTERM_INSTALLED = False
_TERMINATING = False


def _sigterm_to_exit(signum: int, frame: FrameType | None) -> None:
    # Spark ends the source's process with SIGTERM when the query stops (and may send it
    # twice): the first one becomes SystemExit, which unwinds through Spark's
    # ``finally: reader.stop()`` (and atexit), and that requeues what is held; later ones
    # must not interrupt that stop
    global _TERMINATING
    if _TERMINATING:
        return
    _TERMINATING = True
    sys.exit(128 + signum)


def _install_sigterm_handler() -> None:
    global _SIGTERM_INSTALLED
    with _SIGTERM_LOCK:
        if _SIGTERM_INSTALLED or threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None):
            return  # somebody else handles it
        signal.signal(signal.SIGTERM, _sigterm_to_exit)
        _SIGTERM_INSTALLED = True


class NSQStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Spark's stream reader of one topic/channel (see the module documentation)."""

    def __init__(
        self, options: SourceOptions, schema: StructType, *, handle_sigterm: bool = True
    ) -> None:
        self.options = options
        self.schema = schema
        #: turn SIGTERM into SystemExit in the process that runs the reader (Spark's source
        #: runner), so that ``stop()`` runs when the query stops
        self.handle_sigterm = handle_sigterm
        for name in schema.fieldNames():
            if name not in SOURCE_COLUMNS:
                raise ValueError(
                    f"the nsq source has no column {name!r} (it has {', '.join(SOURCE_COLUMNS)})"
                )
        self._runtime: _Runtime | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_runtime"] = None
        return state

    # -- the driver side ------------------------------------------------------------------

    def _feed(self, *, fresh: bool = False) -> _Runtime:
        runtime = self._runtime
        if runtime is None:
            runtime = self._runtime = _Runtime(self.options, fresh=fresh)
            if self.handle_sigterm:
                _install_sigterm_handler()
            atexit.register(runtime.close)
        runtime.check()
        return runtime

    def initialOffset(self) -> dict[str, int]:
        # a fresh query numbers from 0; Spark may ask again when it plans the first batch, so
        # the answer must not move.  Only a fresh query asks: start_from applies here (a query
        # that resumes from its checkpoint goes on where the channel is)
        self._feed(fresh=True)
        return _offset(0)

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.options.max_messages_per_trigger)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, int]:
        runtime = self._feed()
        if isinstance(limit, ReadMaxRows):
            spec = ("rows", max(1, int(limit.max_rows)))
        elif isinstance(limit, ReadMaxBytes):
            spec = ("bytes", max(1, int(limit.max_bytes)))
        elif isinstance(limit, ReadMinRows):
            spec = ("min_rows", int(limit.min_rows))
        else:  # ReadAllAvailable and limits that do not apply to messages
            spec = ("all", 0)
        return _offset(runtime.loop.call(runtime.feed.advance, _seq(start), spec))

    def reportLatestOffset(self) -> dict[str, int] | None:
        runtime = self._runtime
        if runtime is None or runtime.closed:
            return None
        return _offset(runtime.loop.call(runtime.feed.latest))

    def prepareForTriggerAvailableNow(self) -> None:
        runtime = self._feed()
        runtime.loop.call(runtime.feed.prepare_available_now)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        runtime = self._feed()
        held = runtime.loop.call(runtime.feed.rows, _seq(start), _seq(end))
        if not held:
            return []
        topic = self.options.topic
        groups: list[list[_Held]]
        if self.options.ordered:
            # one Spark partition per NSQ partition, in delivery order
            by_partition: dict[tuple[str, int | None], list[_Held]] = {}
            for h in held:
                key = (h.message.nsqd_address, h.message.partition)
                by_partition.setdefault(key, []).append(h)
            groups = list(by_partition.values())
        else:
            n = min(self.options.num_partitions, len(held))
            size, extra = divmod(len(held), n)
            groups = []
            at = 0
            for i in range(n):
                step = size + (1 if i < extra else 0)
                groups.append(held[at : at + step])
                at += step
        out: list[InputPartition] = []
        for index, group in enumerate(groups):
            columns: dict[str, list[Any]] = {
                "body": [h.message.body for h in group],
                "id": [_message_id(h.message.id) for h in group],
                "attempts": [h.message.attempts for h in group],
                "timestamp": [h.message.timestamp // 1000 for h in group],
                "topic": [topic] * len(group),
                "nsqd": [h.message.nsqd_address for h in group],
                "partition": [h.message.partition for h in group],
                "trace_id": [h.message.trace_id for h in group],
            }
            out.append(NSQInputPartition(index, columns))
        return out

    def commit(self, end: dict[str, Any]) -> None:
        runtime = self._feed()
        runtime.loop.call(runtime.feed.finish_before, _seq(end))

    def stop(self) -> None:
        runtime, self._runtime = self._runtime, None
        if runtime is not None:
            runtime.close()
            atexit.unregister(runtime.close)

    # -- the executor side ------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, NSQInputPartition):
            raise TypeError(f"not a partition of the nsq source: {partition!r}")
        arrow_schema = to_arrow_schema(self.schema, timezone="UTC")
        arrays = [pa.array(partition.columns[f.name], type=f.type) for f in arrow_schema]
        yield pa.RecordBatch.from_arrays(arrays, schema=arrow_schema)


class RefusingStreamReader(DataSourceStreamReader):
    """The reader of a source whose options (or schema) are wrong: every call Spark makes
    raises that error, so the query fails at once with it."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def _refuse(self) -> NoReturn:
        raise self.error

    def initialOffset(self) -> dict[str, int]:
        self._refuse()

    def getDefaultReadLimit(self) -> ReadLimit:
        self._refuse()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, int]:
        self._refuse()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        self._refuse()

    def commit(self, end: dict[str, Any]) -> None:
        self._refuse()

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        self._refuse()

    def stop(self) -> None:
        pass
