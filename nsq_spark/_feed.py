"""The driver reader's feed (``read_mode`` ``driver``): the consumers on the reader's event
loop and the messages they hold until the batch that carries them is committed (see
``_source``, which runs it).  Every method of :class:`Feed` runs on that loop."""

from __future__ import annotations

import contextlib
import itertools
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import anyio
from anyio.abc import TaskGroup
from anyio.lowlevel import checkpoint

import nsq_anyio

from ._options import SourceOptions
from ._planning import connect_timeout, connections_for, max_rdy_counts, shares

__all__ = ["Feed"]

log = logging.getLogger("nsq_spark")

#: (message, when it arrived on the loop's clock, the consumer that received it)
_Held = tuple[nsq_anyio.Message, float, nsq_anyio.Consumer]

#: messages taken from a consumer at once
_RECEIVE_CHUNK = 4096
#: the body size the feed expects before it received any: nsqd's default ``--max-msg-size``
_ASSUMED_BODY_SIZE = 1024 * 1024
#: FINs given between two checkpoints of the loop (others run meanwhile)
_ANSWER_CHUNK = 2048


@dataclass(eq=False)
class Feed:
    """The consumers and the messages they hold; every method runs on the reader's loop.

    One consumer gives each nsqd one connection, and nsqd lets a connection hold at most its
    ``--max-rdy-count`` (2,500 by default) unanswered messages; a source holds every message
    until its batch is committed, so when ``max_in_flight`` is above what one connection per
    nsqd may hold, the feed runs several consumers of the channel (up to
    ``max_connections_per_nsqd``) and splits ``max_in_flight`` between them: the RDY of all
    their connections never adds up to more than ``max_in_flight``.

    The feed also holds about ``max_bytes_in_flight`` bytes of bodies at most: nsqd bounds
    what a connection holds by count (RDY), so the feed's window, the RDY of all its
    connections, is ``max_bytes_in_flight`` over the body size it expects (and at most
    ``max_in_flight``).  Until the first messages tell that size, it expects nsqd's default
    largest message (1 MiB); then a running mean that follows a rise at once and a fall
    slowly.
    """

    options: SourceOptions
    #: a new query (not one resuming from its checkpoint): start_from applies
    fresh: bool = False
    #: received, not yet numbered for a batch
    held: deque[_Held] = field(default_factory=deque)
    #: numbered for a batch, not yet answered: ``numbered[i]`` has the number ``base + i``
    numbered: deque[_Held] = field(default_factory=deque)
    base: int = 0
    #: the ranges [start, end) whose rows Spark read (``partitions()``), not yet answered
    read_ranges: list[tuple[int, int]] = field(default_factory=list)
    #: received during an availableNow run but published after it began: never numbered
    later: list[_Held] = field(default_factory=list)
    available_now_cutoff_ns: int | None = None
    failure: BaseException | None = None
    consumers: list[nsq_anyio.Consumer] = field(default_factory=list)
    #: committed batches' messages on their way to FIN (sent in the background)
    finishing: deque[_Held] = field(default_factory=deque)
    finished: int = 0
    #: TOUCHes sent for held messages
    touched: int = 0
    _arrived: anyio.Event | None = None
    _finish_wanted: anyio.Event | None = None
    _scope: anyio.CancelScope | None = None
    _task_group: TaskGroup | None = None
    _running: int = 0
    _done: anyio.Event | None = None
    _warned_max_timeout: bool = False
    _warned_rdy_cap: bool = False
    #: bytes of the bodies in ``held``
    held_bytes: int = 0
    #: the body size the window expects (0: none received yet)
    body_size: float = 0.0
    #: the RDY of all connections together, set by :meth:`_set_window`
    window: int = 0

    def __post_init__(self) -> None:
        self.window = self._wanted_window()

    def _wanted_window(self) -> int:
        o = self.options
        size = self.body_size or _ASSUMED_BODY_SIZE
        return max(1, min(o.max_in_flight, int(o.max_bytes_in_flight / max(size, 1.0))))

    @property
    def next_seq(self) -> int:
        return self.base + len(self.numbered)

    async def run(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        o = self.options
        self._done = anyio.Event()
        self._arrived = anyio.Event()
        self._finish_wanted = anyio.Event()
        try:
            with anyio.CancelScope() as scope:
                self._scope = scope
                async with anyio.create_task_group() as tg:
                    self._task_group = tg
                    await tg.start(self._consume, self.window, self.fresh)
                    task_status.started()
                    tg.start_soon(self._touch_loop)
                    tg.start_soon(self._finish_loop)
                    tg.start_soon(self._connect_deadline, self.consumers[0])
                    if not o.ordered:
                        tg.start_soon(self._grow)
        except Exception as exc:
            self.failure = exc
            log.exception("the nsq consumer of %s/%s failed", o.topic, o.channel)
            raise
        finally:
            self.consumers = []
            self._done.set()
            self._arrived.set()

    async def _consume(
        self, max_in_flight: int, fresh: bool, *, task_status: Any = anyio.TASK_STATUS_IGNORED
    ) -> None:
        o = self.options
        kwargs = o.consumer_kwargs(fresh=fresh)
        kwargs["max_in_flight"] = max_in_flight
        async with nsq_anyio.Consumer(o.topic, o.channel, **kwargs) as consumer:
            self.consumers.append(consumer)
            self._running += 1
            task_status.started()
            try:
                while batch := await consumer.get_many(_RECEIVE_CHUNK):
                    self._receive(batch, consumer)
            finally:
                self._running -= 1
        # consumers end when the feed shuts down: with the last one, so does the feed
        if not self._running and self._task_group is not None:
            self._task_group.cancel_scope.cancel()

    async def _grow(self) -> None:
        """Open more connections per nsqd while ``max_in_flight`` is above what the
        connections may hold (IDENTIFY tells each one's ``max_rdy_count``)."""
        o = self.options
        caps: dict[str, int] = {}
        while len(self.consumers) < o.max_connections_per_nsqd:
            # quick until the first IDENTIFY answers; then as lookupd may change the nsqds
            await anyio.sleep(1.0 if caps else 0.1)
            caps = self._caps(self.consumers[0])
            if not caps:
                continue
            capacity = sum(caps.values())  # of one consumer: one connection per nsqd
            wanted = connections_for(self.window, capacity, o.max_connections_per_nsqd)
            if wanted <= len(self.consumers):
                continue
            split = shares(self.window, wanted, capacity)
            for consumer, share in zip(self.consumers, split, strict=False):
                consumer.set_max_in_flight(share)
            assert self._task_group is not None
            for share in split[len(self.consumers) :]:
                await self._task_group.start(self._consume, share, False)
            log.info(
                "the source's window of %d messages (max_in_flight, max_bytes_in_flight) is "
                "above what one connection per nsqd may hold (%d): %d connections per nsqd",
                self.window,
                capacity,
                wanted,
            )

    def _set_window(self, window: int) -> None:
        """Split ``window`` between the consumers (more open in :meth:`_grow` if needed)."""
        self.window = window
        consumers = self.consumers
        if not consumers:
            return
        caps = self._caps(consumers[0])
        if len(consumers) == 1 or not caps:
            consumers[0].set_max_in_flight(window)
            for consumer in consumers[1:]:
                consumer.set_max_in_flight(0)
            return
        split = shares(window, len(consumers), sum(caps.values()))
        for consumer, share in zip(consumers, split, strict=True):
            consumer.set_max_in_flight(share)

    @staticmethod
    def _caps(consumer: nsq_anyio.Consumer) -> dict[str, int]:
        return dict(max_rdy_counts(consumer.stats()["connections"]))

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
        where = [f"nsqd {a}" for a in c.nsqd_tcp_addresses]
        where += [f"lookupd {a}" for a in c.lookupd_http_addresses]
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
        self.failure = connect_timeout(o, where, causes)
        log.error("%s", self.failure)
        assert self._scope is not None
        self._scope.cancel()

    def _receive(self, batch: list[nsq_anyio.Message], consumer: nsq_anyio.Consumer) -> None:
        now = anyio.current_time()
        cutoff = self.available_now_cutoff_ns
        size = sum([len(m.body) for m in batch])
        if cutoff is None:
            self.held.extend([(message, now, consumer) for message in batch])
            self.held_bytes += size
        else:
            for message in batch:
                if message.timestamp > cutoff:
                    self.later.append((message, now, consumer))
                else:
                    self.held.append((message, now, consumer))
                    self.held_bytes += len(message.body)
        self._follow_size(size / len(batch))
        assert self._arrived is not None
        self._arrived.set()

    def _follow_size(self, mean: float) -> None:
        """Size the window by the bodies received: at once when they grow (what is held must
        stay bounded), slowly when they shrink."""
        known = self.body_size
        self.body_size = mean if not known or mean > known else known + (mean - known) / 8
        wanted = self._wanted_window()
        if wanted < self.window * 0.9 or wanted > self.window * 1.25 + 1:
            self._set_window(wanted)

    async def _touch_loop(self) -> None:
        """TOUCH what is held long enough for nsqd to time it out: every ``touch_interval / 2``
        seconds, each message held for at least that long (so at most ``touch_interval``
        passes between two TOUCHes of one message, well below ``msg_timeout``), in bulk: one
        write per connection and chunk."""
        o = self.options
        step = o.touch_interval / 2
        while True:
            await anyio.sleep(step)
            now = anyio.current_time()
            due: dict[nsq_anyio.Consumer, list[nsq_anyio.Message]] = {}
            for message, received_at, consumer in self._all_held():
                if now - received_at < step:
                    continue
                if now - received_at + o.msg_timeout > o.max_msg_timeout:
                    # nsqd will not extend past max_msg_timeout: it times out and comes back
                    if not self._warned_max_timeout:
                        self._warned_max_timeout = True
                        log.warning(
                            "a message has been held for max_msg_timeout (%.0f s): nsqd will "
                            "deliver it again",
                            o.max_msg_timeout,
                        )
                    continue
                if not message.has_responded:
                    due.setdefault(consumer, []).append(message)
            for consumer, messages in due.items():
                for at in range(0, len(messages), _ANSWER_CHUNK):
                    # answered meanwhile (a FIN of a committed batch): not touched
                    chunk = [m for m in messages[at : at + _ANSWER_CHUNK] if not m.has_responded]
                    # a message can be gone from its connection (reconnected; timed out and
                    # delivered again): its TOUCH is moot
                    with contextlib.suppress(nsq_anyio.NSQError):
                        await consumer.touch_many(chunk)
                    self.touched += len(chunk)
                    await checkpoint()

    def _all_held(self) -> list[_Held]:
        return [*self.numbered, *self.held, *self.later]

    def _take_before(self, seq: int) -> tuple[list[_Held], list[_Held]]:
        """Take every message numbered below ``seq``: (read by Spark, never read)."""
        n = min(seq - self.base, len(self.numbered))
        if n <= 0:
            return [], []
        first = self.base
        popleft = self.numbered.popleft
        taken = [popleft() for _ in range(n)]
        self.base += n
        flags = bytearray(n)
        for a, b in self.read_ranges:
            lo, hi = max(a, first) - first, min(b, first + n) - first
            if lo < hi:
                flags[lo:hi] = b"\x01" * (hi - lo)
        self.read_ranges = [(a, b) for a, b in self.read_ranges if b > self.base]
        if all(flags):
            return taken, []
        read = [m for m, f in zip(taken, flags, strict=True) if f]
        unread = [m for m, f in zip(taken, flags, strict=True) if not f]
        return read, unread

    async def finish_before(self, seq: int) -> int:
        """FIN every message numbered below ``seq`` (in the background: the batch is
        committed, nothing waits for the FINs); returns how many."""
        read, unread = self._take_before(seq)
        if unread:
            # a message Spark never asked for is not processed: it goes back to nsqd
            log.warning("%d messages were committed but never read: requeued", len(unread))
            for message, _, _ in unread:
                await self._answer(message, finish=False)
        if read:
            self.finishing.extend(read)
            assert self._finish_wanted is not None
            self._finish_wanted.set()
        return len(read) + len(unread)

    async def _finish_loop(self) -> None:
        while True:
            assert self._finish_wanted is not None
            await self._finish_wanted.wait()
            self._finish_wanted = anyio.Event()
            await self._finish_pending(checkpoints=True)

    async def _finish_pending(self, *, checkpoints: bool) -> None:
        finishing = self.finishing
        popleft = finishing.popleft
        while finishing:
            by_consumer: dict[nsq_anyio.Consumer, list[nsq_anyio.Message]] = {}
            for _ in range(min(_ANSWER_CHUNK, len(finishing))):
                message, _, consumer = popleft()
                if not message.has_responded:
                    by_consumer.setdefault(consumer, []).append(message)
            for consumer, messages in by_consumer.items():
                # a message can be gone from its connection (reconnected; timed out and
                # delivered again): nsqd redelivers it, its FIN is moot
                with contextlib.suppress(nsq_anyio.NSQError):
                    await consumer.finish_many(messages)
                self.finished += len(messages)
            if checkpoints:
                await checkpoint()

    async def _answer(self, message: nsq_anyio.Message, *, finish: bool) -> None:
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
        """Warn (once) when nsqd lets the source hold fewer messages than max_in_flight even
        with ``max_connections_per_nsqd`` connections per nsqd."""
        o = self.options
        if self._warned_rdy_cap or not self.consumers or o.ordered:
            return
        if len(self.consumers) < o.max_connections_per_nsqd:
            return  # more are on their way if needed
        caps: dict[str, int] = {}
        for consumer in self.consumers:
            for address, cap in self._caps(consumer).items():
                caps[address] = caps.get(address, 0) + cap
        if caps and sum(caps.values()) < o.max_in_flight:
            self._warned_rdy_cap = True
            log.warning(
                "max_in_flight %d is above what nsqd allows: the source holds at most %d "
                "messages (%d connections per nsqd: %s; nsqd's --max-rdy-count, the option "
                "max_connections_per_nsqd)",
                o.max_in_flight,
                sum(caps.values()),
                len(self.consumers),
                ", ".join(f"{address} {cap}" for address, cap in sorted(caps.items())),
            )

    async def advance(self, start: int, limit: tuple[str, int]) -> int:
        """Finish what is before ``start`` and number held messages for the next batch."""
        self._check_rdy_cap()
        await self.finish_before(start)
        if self.next_seq < start:  # a reader that resumes a query: its numbers go on
            self.base = start
        kind, amount = limit
        if self.available_now_cutoff_ns is not None:
            await self._wait_until_quiet(amount if kind == "rows" else None)
        # numbered for the batch that begins at ``start`` already (Spark asked before)
        already = self.next_seq - start
        held = self.held
        if kind == "min_rows" and already + len(held) < amount:
            return self.next_seq
        # a batch is bounded by max_bytes_per_trigger besides Spark's limit in rows
        rows, max_bytes = len(held), self.options.max_bytes_per_trigger
        if kind == "rows":
            rows = max(0, min(amount - already, len(held)))
        elif kind == "bytes":
            max_bytes = min(max_bytes, amount)
        taken_bytes = sum(len(m.body) for m, _, _ in self.numbered) if already else 0
        if rows == len(held) and taken_bytes + self.held_bytes <= max_bytes:
            take, size = rows, self.held_bytes
        else:  # count the bodies up to the limits (the first message goes whatever its size)
            take = size = 0
            for message, _, _ in itertools.islice(held, rows):
                body = len(message.body)
                if already + take > 0 and taken_bytes + size + body > max_bytes:
                    break
                take += 1
                size += body
        self.held_bytes -= size
        if take == len(held):
            self.numbered.extend(held)
            held.clear()
        else:
            popleft = held.popleft
            self.numbered.extend([popleft() for _ in range(take)])
        return self.next_seq

    async def _wait_until_quiet(self, rows: int | None) -> None:
        """availableNow: let what nsqd has for us arrive (until ``rows`` are held or nothing
        arrived for ``available_now_idle_timeout``)."""
        idle = self.options.available_now_idle_timeout
        while self.failure is None and not (self._done and self._done.is_set()):
            if rows is not None and len(self.held) >= rows:
                return
            if self.held_bytes >= self.options.max_bytes_per_trigger:
                return  # a batch's worth of bytes
            holding = len(self.numbered) + len(self.held) + len(self.later) + len(self.finishing)
            if holding >= self.window:
                return  # nsqd sends no more before some are answered
            self._arrived = anyio.Event()
            with anyio.move_on_after(idle) as scope:
                await self._arrived.wait()
            if scope.cancelled_caught:
                return

    async def rows(self, start: int, end: int) -> list[nsq_anyio.Message]:
        if self.next_seq < end and not self.numbered:
            # a batch of the query's log that this reader never numbered (a restart): NSQ
            # cannot replay it, its messages come again from nsqd; numbering goes on after it
            self.base = end
            return []
        lo, hi = max(start, self.base), min(end, self.next_seq)
        if lo >= hi:
            return []
        self.read_ranges.append((lo, hi))
        offset = lo - self.base
        # (a deque's middle is slow to index: slice it)
        return [h[0] for h in itertools.islice(self.numbered, offset, offset + hi - lo)]

    async def latest(self) -> int:
        return self.next_seq + len(self.held)

    async def prepare_available_now(self) -> None:
        self.available_now_cutoff_ns = time.time_ns()
        # what was already received but published later waits for the next run
        keep: deque[_Held] = deque()
        for held in self.held:
            if held[0].timestamp > self.available_now_cutoff_ns:
                self.later.append(held)
            else:
                keep.append(held)
        self.held = keep
        self.held_bytes = sum(len(m.body) for m, _, _ in keep)

    async def shutdown(self) -> None:
        """FIN what was committed, requeue every other message held and unanswered, then
        stop the consumers."""
        consumers = list(self.consumers)
        for consumer in consumers:
            consumer.set_max_in_flight(0)  # nothing more, not even what is requeued now
        await self._finish_pending(checkpoints=False)
        pending = self._all_held()
        self.numbered.clear()
        self.held.clear()
        self.held_bytes = 0
        self.later.clear()
        for message, _, _ in pending:
            await self._answer(message, finish=False)
        # a graceful stop: the answers go out before the connections close
        with anyio.move_on_after(10.0):
            async with anyio.create_task_group() as tg:
                for consumer in consumers:
                    tg.start_soon(self._stop_consumer, consumer)
        if self._done is not None:
            with anyio.move_on_after(5.0):
                await self._done.wait()
        if self._scope is not None:
            self._scope.cancel()

    @staticmethod
    async def _stop_consumer(consumer: nsq_anyio.Consumer) -> None:
        try:
            await consumer.stop()
        except nsq_anyio.NSQError:
            log.warning("stopping the nsq consumer failed", exc_info=True)

    async def stats(self) -> dict[str, int]:
        return {
            "held": len(self.held),
            "batched": len(self.numbered),
            "later": len(self.later),
            "next_seq": self.next_seq,
            "finishing": len(self.finishing),
            "finished": self.finished,
            "touched": self.touched,
            "connections_per_nsqd": len(self.consumers),
        }
