"""Topics, channels and messages of the emulated nsqd (no protocol, no connections).

A topic holds messages until it has a channel (and while it is paused); then every channel
gets its own copy of each message.  A channel keeps a FIFO queue, the messages in flight
(with their timeout) and the deferred ones (with the time they become ready), like nsqd's
``Channel``.  Delivery to subscribers is the connection side's business (``_nsqd.py``).
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "StoredMessage",
    "InFlight",
    "Channel",
    "Topic",
    "Subscriber",
    "TWEPOCH",
    "IdFactory",
]

#: nsqd's GUID epoch: (2012-10-28 16:23:42 UTC).UnixNano() >> 20
TWEPOCH = 1288834974288
_U64_MASK = (1 << 64) - 1
_seq = itertools.count()


class Subscriber(Protocol):
    """What a channel needs to know about a client connection."""

    @property
    def id(self) -> int: ...

    def message_timed_out(self) -> None: ...


class StoredMessage:
    """One message as a channel holds it (each channel has its own copy)."""

    __slots__ = (
        "attempts",
        "body",
        "deferred",
        "ext_data",
        "ext_version",
        "id",
        "internal_id",
        "key",
        "queue_offset",
        "raw_size",
        "timestamp",
        "trace_id",
    )

    def __init__(
        self,
        msg_id: bytes,
        body: bytes,
        timestamp: int,
        *,
        deferred: float = 0.0,
        internal_id: int = 0,
        trace_id: int = 0,
        queue_offset: int = 0,
        raw_size: int = 0,
        ext_version: int | None = None,
        ext_data: bytes = b"",
        key: bytes | None = None,
    ) -> None:
        self.id = msg_id
        #: what FIN/REQ/TOUCH identify the message by (the partitioned server: the internal id)
        self.key = msg_id if key is None else key
        self.body = body
        self.timestamp = timestamp
        self.attempts = 0
        self.deferred = deferred
        self.internal_id = internal_id
        self.trace_id = trace_id
        self.queue_offset = queue_offset
        self.raw_size = raw_size
        self.ext_version = ext_version
        self.ext_data = ext_data

    def copy(self) -> StoredMessage:
        twin = StoredMessage(
            self.id,
            self.body,
            self.timestamp,
            deferred=self.deferred,
            internal_id=self.internal_id,
            trace_id=self.trace_id,
            queue_offset=self.queue_offset,
            raw_size=self.raw_size,
            ext_version=self.ext_version,
            ext_data=self.ext_data,
            key=self.key,
        )
        twin.attempts = self.attempts
        return twin

    def __repr__(self) -> str:
        return f"StoredMessage(id={self.id!r}, attempts={self.attempts}, body={self.body[:32]!r})"


@dataclass(slots=True)
class InFlight:
    message: StoredMessage
    client_id: int
    deadline: float
    delivered_at: float
    token: int


class IdFactory:
    """nsqd's GUID factory: ``(ts_ms20 - twepoch) << 22 | node_id << 12 | sequence`` as hex."""

    __slots__ = ("_last", "_node", "_seq")

    def __init__(self, node_id: int) -> None:
        self._node = node_id
        self._last = -1
        self._seq = 0

    def new_id(self, unix_ns: int) -> bytes:
        ts = unix_ns >> 20
        if ts < self._last:
            ts = self._last
        if ts == self._last:
            self._seq = (self._seq + 1) & 0xFFF
            if self._seq == 0:
                # nsqd would sleep until the next pseudo-millisecond; borrow it instead
                ts = self._last + 1
        else:
            self._seq = 0
        self._last = ts
        value = (((ts - TWEPOCH) << 22) | (self._node << 12) | self._seq) & _U64_MASK
        return f"{value:016x}".encode("ascii")


class Channel:
    """A channel: queue, in-flight and deferred messages, and the attached subscribers."""

    def __init__(self, topic: Topic, name: str) -> None:
        self.topic = topic
        self.name = name
        self.ephemeral = name.endswith("#ephemeral")
        self.paused = False
        #: partitioned server: one message outstanding at a time (SUB_ORDERED)
        self.ordered = False
        #: partitioned server: the next delivery goes out twice (the channel's reader was
        #: reset when it turned ordered with a backlog: "read a message not in ordered")
        self.repeat_next = False
        #: ids sent twice: the ordered channel moves on once the second copy is FINished too
        self.owed: set[bytes] = set()
        self.queue: deque[StoredMessage] = deque()
        self.in_flight: dict[bytes, InFlight] = {}
        self.deferred: dict[bytes, tuple[StoredMessage, float, int]] = {}
        self._in_flight_heap: list[tuple[float, int, bytes]] = []
        self._deferred_heap: list[tuple[float, int, bytes]] = []
        self.clients: dict[int, Subscriber] = {}
        self.message_count = 0
        self.requeue_count = 0
        self.timeout_count = 0
        self.rr = 0
        self.deleted = False
        #: timers of this channel do not fire before this time (nsqd's queue-scan refresh)
        self.scan_from = float("-inf")

    def __repr__(self) -> str:
        return f"Channel({self.topic.name!r}, {self.name!r}, depth={len(self.queue)})"

    # -- queue ---------------------------------------------------------------------------

    def put(self, msg: StoredMessage) -> None:
        self.queue.append(msg)

    def put_back(self, msg: StoredMessage) -> None:
        """A requeued or timed-out message: to the end of the queue, or, on an ordered
        channel, to its front (the ordered reader does not move past it)."""
        if self.ordered:
            self.queue.appendleft(msg)
        else:
            self.queue.append(msg)

    def put_new(self, msg: StoredMessage, now: float) -> None:
        """A message arriving from the topic (counted in ``message_count``)."""
        self.message_count += 1
        if msg.deferred > 0:
            self.defer(msg, now + msg.deferred)
        else:
            self.put(msg)

    def defer(self, msg: StoredMessage, ready_at: float) -> None:
        token = next(_seq)
        self.deferred[msg.key] = (msg, ready_at, token)
        heapq.heappush(self._deferred_heap, (ready_at, token, msg.key))

    @property
    def depth(self) -> int:
        return len(self.queue)

    # -- in flight -----------------------------------------------------------------------

    def start_in_flight(
        self, msg: StoredMessage, client_id: int, now: float, timeout: float
    ) -> None:
        token = next(_seq)
        deadline = now + timeout
        self.in_flight[msg.key] = InFlight(msg, client_id, deadline, now, token)
        heapq.heappush(self._in_flight_heap, (deadline, token, msg.key))

    def pop_in_flight(self, client_id: int, msg_id: bytes) -> InFlight | str:
        entry = self.in_flight.get(msg_id)
        if entry is None:
            return "ID not in flight"
        if entry.client_id != client_id:
            return "client does not own message"
        del self.in_flight[msg_id]
        return entry

    def finish(self, client_id: int, msg_id: bytes) -> str | None:
        entry = self.pop_in_flight(client_id, msg_id)
        return entry if isinstance(entry, str) else None

    def requeue(self, client_id: int, msg_id: bytes, delay: float, now: float) -> str | None:
        entry = self.pop_in_flight(client_id, msg_id)
        if isinstance(entry, str):
            return entry
        self.requeue_count += 1
        self.owed.discard(msg_id)  # requeued: the next delivery is what counts
        if delay <= 0:
            self.put_back(entry.message)
        else:
            self.defer(entry.message, now + delay)
        return None

    def touch(
        self, client_id: int, msg_id: bytes, now: float, timeout: float, max_timeout: float
    ) -> str | None:
        entry = self.in_flight.get(msg_id)
        if entry is None:
            return "ID not in flight"
        if entry.client_id != client_id:
            return "client does not own message"
        deadline = now + timeout
        if deadline - entry.delivered_at >= max_timeout:
            deadline = entry.delivered_at + max_timeout
        entry.deadline = deadline
        entry.token = next(_seq)
        heapq.heappush(self._in_flight_heap, (deadline, entry.token, msg_id))
        return None

    def requeue_client(self, client_id: int) -> int:
        """Put every message in flight to ``client_id`` back at the end of the queue."""
        ids = [mid for mid, e in self.in_flight.items() if e.client_id == client_id]
        for mid in reversed(ids) if self.ordered else ids:
            entry = self.in_flight.pop(mid)
            self.put_back(entry.message)
        return len(ids)

    # -- timers --------------------------------------------------------------------------

    def next_deadline(self) -> float | None:
        best: float | None = None
        heap = self._in_flight_heap
        while heap:
            deadline, token, mid = heap[0]
            entry = self.in_flight.get(mid)
            if entry is not None and entry.token == token:
                best = deadline
                break
            heapq.heappop(heap)
        heap = self._deferred_heap
        while heap:
            ready_at, token, mid = heap[0]
            item = self.deferred.get(mid)
            if item is not None and item[2] == token:
                if best is None or ready_at < best:
                    best = ready_at
                break
            heapq.heappop(heap)
        if best is not None and best < self.scan_from:
            best = self.scan_from
        return best

    def expire(self, now: float) -> int:
        """Time out in-flight messages and release deferred ones due at ``now``."""
        changed = 0
        if now < self.scan_from:
            return 0
        heap = self._in_flight_heap
        while heap and heap[0][0] <= now:
            _, token, mid = heapq.heappop(heap)
            entry = self.in_flight.get(mid)
            if entry is None or entry.token != token:
                continue
            del self.in_flight[mid]
            self.owed.discard(mid)
            self.timeout_count += 1
            client = self.clients.get(entry.client_id)
            if client is not None:
                client.message_timed_out()
            self.put_back(entry.message)
            changed += 1
        heap = self._deferred_heap
        while heap and heap[0][0] <= now:
            _, token, mid = heapq.heappop(heap)
            item = self.deferred.get(mid)
            if item is None or item[2] != token:
                continue
            del self.deferred[mid]
            self.put(item[0])
            changed += 1
        return changed

    # -- bulk ----------------------------------------------------------------------------

    def empty(self) -> None:
        """``/channel/empty``: drop queued, in-flight and deferred messages."""
        self.queue.clear()
        self.in_flight.clear()
        self.deferred.clear()
        self._in_flight_heap.clear()
        self._deferred_heap.clear()

    def drop_in_memory(self) -> None:
        """What a kill -9 of an nsqd whose queue lives on disk (``--mem-queue-size=0``) loses:
        the in-flight and deferred messages, which only its memory held."""
        self.in_flight.clear()
        self.deferred.clear()
        self._in_flight_heap.clear()
        self._deferred_heap.clear()

    def flush_to_queue(self) -> None:
        """What nsqd persists on a clean shutdown: in-flight and deferred go back to the queue."""
        for entry in sorted(self.in_flight.values(), key=lambda e: e.token):
            self.queue.append(entry.message)
        for msg, _, _ in sorted(self.deferred.values(), key=lambda item: item[2]):
            self.queue.append(msg)
        self.in_flight.clear()
        self.deferred.clear()
        self._in_flight_heap.clear()
        self._deferred_heap.clear()

    def all_messages(self) -> Iterator[StoredMessage]:
        yield from self.queue
        for entry in self.in_flight.values():
            yield entry.message
        for msg, _, _ in self.deferred.values():
            yield msg


class Topic:
    """A topic (or one partition of a topic on the partitioned server)."""

    def __init__(self, name: str, node_id: int, partition: int = -1) -> None:
        self.name = name
        self.partition = partition
        self.ephemeral = name.endswith("#ephemeral")
        self.paused = False
        self.channels: dict[str, Channel] = {}
        #: messages held while the topic has no channel or is paused
        self.queue: deque[StoredMessage] = deque()
        self.message_count = 0
        self.message_bytes = 0
        self.ids = IdFactory(node_id)
        # partitioned server
        #: every message of the partition, for SUB_ADVANCED start positions
        self.log: list[StoredMessage] = []
        self.next_internal_id = 1
        self.next_offset = 0
        self.ordered = False
        self.ext = False
        self.disable_channel_auto_create = False
        #: partitioned cluster: publishes are refused (E_FAILED_ON_NOT_WRITABLE)
        self.write_disabled = False
        self.deleted = False

    def __repr__(self) -> str:
        part = "" if self.partition < 0 else f", partition={self.partition}"
        return f"Topic({self.name!r}{part}, channels={list(self.channels)})"

    def get_channel(self, name: str, now: float) -> tuple[Channel, bool]:
        """Return the channel, creating it (and releasing held messages) if needed."""
        channel = self.channels.get(name)
        if channel is not None:
            return channel, False
        channel = Channel(self, name)
        self.channels[name] = channel
        self.release(now)
        return channel, True

    def put(self, msg: StoredMessage, now: float) -> None:
        self.message_count += 1
        self.message_bytes += len(msg.body)
        if self.channels and not self.paused:
            self._distribute(msg, now)
        else:
            self.queue.append(msg)

    def release(self, now: float) -> None:
        """Hand held messages to the channels (a channel appeared or the topic unpaused)."""
        if not self.channels or self.paused:
            return
        while self.queue:
            self._distribute(self.queue.popleft(), now)

    def _distribute(self, msg: StoredMessage, now: float) -> None:
        for i, channel in enumerate(self.channels.values()):
            channel.put_new(msg if i == 0 else msg.copy(), now)

    @property
    def depth(self) -> int:
        return len(self.queue)
