"""The streaming source: ``spark.readStream.format("nsq")``.

NSQ cannot replay, so an offset is a sequence counter of this reader, ``{"seq": N}``: the messages
of a micro-batch are the ones numbered ``start <= seq < end``.  The reader lives on the driver, in
the one Python process Spark keeps for the source while the query runs; its feed runs the
``nsq_anyio.Consumer`` instances of the channel (one, or several when ``max_in_flight`` is above
what one connection per nsqd may hold: ``_feed.Feed``) on an event loop in a background thread,
and holds every message until the batch that carries it has been committed by the sink:

* ``latestOffset(start, limit)``: Spark asks past ``start`` only once the batch ending at
  ``start`` is committed, so everything numbered below ``start`` is FINished first; then up to
  ``limit`` held messages are numbered for the next batch.
* ``partitions(start, end)``: the rows themselves travel in the input partitions
  (``num_partitions`` of them, or one per NSQ partition when ``ordered``), so executors do no
  network I/O.
* ``commit(end)``: FINishes everything below ``end`` again (idempotent; Spark sends it one
  trigger late).
* held messages are TOUCHed in the background so that nsqd does not time them out while a batch
  runs; ``stop()`` requeues what is held and unanswered.

After a crash, whatever was not FINished comes back from nsqd with ``attempts`` + 1: delivery is
at-least-once, and ``id`` / ``attempts`` let a pipeline drop duplicates.
"""

from __future__ import annotations

import atexit
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from types import FrameType
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
from pyspark.sql.datasource import InputPartition
from pyspark.sql.streaming.datasource import ReadLimit
from pyspark.sql.types import StructType

import nsq_anyio

from ._feed import Feed
from ._loop import LoopThread
from ._options import SourceOptions
from ._planning import ConnectTimeout, read_limit, seq_of, seq_offset, split_evenly
from ._reader import NSQReader, tune_gc
from ._rows import record_batch

__all__ = ["NSQInputPartition", "NSQStreamReader"]


class NSQInputPartition(InputPartition):
    """The rows of one Spark partition of a micro-batch: one Arrow record batch, built on the
    driver with the columns the query's schema names."""

    def __init__(self, index: int, batch: pa.RecordBatch) -> None:
        super().__init__(index)
        self.batch = batch

    def __len__(self) -> int:
        return int(self.batch.num_rows)

    def __repr__(self) -> str:
        return f"NSQInputPartition({self.value}, rows={len(self)})"


class _Runtime:
    """The reader's live part: a loop thread and the feed on it (never pickled)."""

    def __init__(self, options: SourceOptions, *, fresh: bool = False) -> None:
        tune_gc()
        self.loop = LoopThread(f"nsq-spark-source-{options.topic}")
        self.feed = Feed(options, fresh=fresh)
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


class NSQStreamReader(NSQReader):
    """Spark's stream reader of one topic/channel (see the module documentation)."""

    live = ("_runtime",)
    partition_type = NSQInputPartition

    def __init__(
        self, options: SourceOptions, schema: StructType, *, handle_sigterm: bool = True
    ) -> None:
        super().__init__(options, schema)
        #: turn SIGTERM into SystemExit in the process that runs the reader (Spark's source
        #: runner), so that ``stop()`` runs when the query stops
        self.handle_sigterm = handle_sigterm
        self._runtime: _Runtime | None = None

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
        return seq_offset(0)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, int]:
        runtime = self._feed()
        spec = read_limit(limit)
        return seq_offset(runtime.loop.call(runtime.feed.advance, seq_of(start), spec))

    def reportLatestOffset(self) -> dict[str, int] | None:
        runtime = self._runtime
        if runtime is None or runtime.closed:
            return None
        return seq_offset(runtime.loop.call(runtime.feed.latest))

    def prepareForTriggerAvailableNow(self) -> None:
        runtime = self._feed()
        runtime.loop.call(runtime.feed.prepare_available_now)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        runtime = self._feed()
        held = runtime.loop.call(runtime.feed.rows, seq_of(start), seq_of(end))
        if not held:
            return []
        topic = self.options.topic
        groups: list[list[nsq_anyio.Message]]
        if self.options.ordered:
            # one Spark partition per NSQ partition, in delivery order
            by_partition: dict[tuple[str, int | None], list[nsq_anyio.Message]] = {}
            for m in held:
                by_partition.setdefault((m.nsqd_address, m.partition), []).append(m)
            groups = list(by_partition.values())
        else:
            groups = split_evenly(held, self.options.num_partitions)
        arrow_schema = self.arrow_schema()
        return [
            NSQInputPartition(index, record_batch(group, arrow_schema, topic))
            for index, group in enumerate(groups)
        ]

    def commit(self, end: dict[str, Any]) -> None:
        runtime = self._feed()
        runtime.loop.call(runtime.feed.finish_before, seq_of(end))

    def stop(self) -> None:
        runtime, self._runtime = self._runtime, None
        if runtime is not None:
            runtime.close()
            atexit.unregister(runtime.close)

    # -- the executor side ------------------------------------------------------------------

    def read_rows(self, partition: NSQInputPartition) -> Iterator[pa.RecordBatch]:
        yield partition.batch
