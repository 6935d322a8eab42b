"""What the source decides, apart from Spark, Arrow and the network: pure functions and small
records over plain values, shared by both readers and tested on their own.

* the offsets: the driver reader's ``{"seq": N}`` and the executor reader's plan
  ``{"run": R, "batch": B, "parts": [[nsqd, messages, bytes(, partition)], ...]}``;
* :func:`plan_batch`: a micro-batch split over the nsqd (or NSQ partitions) that have
  messages waiting, and :class:`AvailableNow`: what is left of an ``availableNow`` run;
* nsqd's ``/stats``: the topic's entries, the channel's ready messages, their mean size and
  counters;
* Spark's read limit as one ``(kind, amount)``;
* how many connections a window needs, and how RDY is split between them;
* the :class:`ConnectTimeout` both readers raise, with one text.

Nothing here imports pyspark or pyarrow (a test holds it to that).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import nsq_proto

from ._options import SourceOptions

__all__ = [
    "SOURCE_COLUMNS",
    "AvailableNow",
    "ConnectTimeout",
    "Part",
    "check_columns",
    "connect_timeout",
    "connections_for",
    "decode_part",
    "encode_part",
    "executor_limits",
    "max_rdy_counts",
    "mean_body_size",
    "offers",
    "plan_batch",
    "plan_of",
    "read_limit",
    "seq_offset",
    "seq_of",
    "shares",
    "source_key",
    "split_evenly",
    "topic_channel",
    "topic_entries",
    "waiting",
]

#: the columns the source can produce, in the order of its default schema
SOURCE_COLUMNS = ("body", "id", "attempts", "timestamp", "topic", "nsqd", "partition", "trace_id")


def check_columns(names: Iterable[str]) -> None:
    """A ValueError naming a column of ``names`` (a schema's) the source does not have."""
    for name in names:
        if name not in SOURCE_COLUMNS:
            raise ValueError(
                f"the nsq source has no column {name!r} (it has {', '.join(SOURCE_COLUMNS)})"
            )


# ---------------------------------------------------------------------------------------------
# the connect timeout


class ConnectTimeout(nsq_proto.NSQTimeout):
    """The source found no nsqd to consume from within ``connect_timeout``."""


# tracebacks name it where users import it from
ConnectTimeout.__module__ = "nsq_spark"


def connect_timeout(
    options: SourceOptions, where: Sequence[str], causes: Sequence[str]
) -> ConnectTimeout:
    """The error of a source with nothing to consume from after ``connect_timeout``: the
    places it tried (``where``) and the last errors (``causes``)."""
    o = options
    return ConnectTimeout(
        f"the nsq source of {o.topic}/{o.channel} has no nsqd to consume from after "
        f"connect_timeout ({o.connect_timeout:g} s) ({', '.join(where)})"
        + (f"; last error: {'; '.join(causes)}" if causes else "")
    )


# ---------------------------------------------------------------------------------------------
# Spark's read limit


def read_limit(limit: Any) -> tuple[str, int]:
    """Spark's ``ReadLimit`` (``pyspark.sql.streaming.datasource``) as ``(kind, amount)``:
    ``("rows", n)``, ``("bytes", n)``, ``("min_rows", n)``, or ``("all", 0)`` (``ReadAllAvailable``
    and limits that do not apply to messages).  The classes are told by name, here where
    pyspark is not imported: a subclass is its base."""
    kinds = {cls.__name__ for cls in type(limit).__mro__}
    if "ReadMaxRows" in kinds:
        return "rows", max(1, int(getattr(limit, "max_rows")))  # noqa: B009
    if "ReadMaxBytes" in kinds:
        return "bytes", max(1, int(getattr(limit, "max_bytes")))  # noqa: B009
    if "ReadMinRows" in kinds:
        return "min_rows", int(limit.min_rows)
    return "all", 0


def executor_limits(limit: tuple[str, int], options: SourceOptions) -> tuple[int, int]:
    """The executor reader's batch bounds under ``limit`` (see :func:`read_limit`): (messages,
    bytes).  A limit in rows replaces ``max_messages_per_trigger``; one in bytes lowers
    ``max_bytes_per_trigger``; others leave both."""
    max_messages, max_bytes = options.max_messages_per_trigger, options.max_bytes_per_trigger
    kind, amount = limit
    if kind == "rows":
        max_messages = amount
    elif kind == "bytes":
        max_bytes = min(max_bytes, amount)
    return max_messages, max_bytes


# ---------------------------------------------------------------------------------------------
# the driver reader's offsets


def seq_offset(seq: int) -> dict[str, int]:
    """The driver reader's offset of the message numbered ``seq``."""
    return {"seq": seq}


def seq_of(offset: Mapping[str, Any]) -> int:
    """The number in a driver reader's offset; a ValueError for anything else."""
    try:
        return int(offset["seq"])
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"not an offset of the nsq source: {offset!r}") from None


_T = TypeVar("_T")


def split_evenly(items: list[_T], parts: int) -> list[list[_T]]:
    """``items`` in order, in at most ``parts`` runs whose lengths differ by one at most (the
    longer first); none of them empty."""
    if not items:
        return []
    n = min(parts, len(items))
    size, extra = divmod(len(items), n)
    groups = []
    at = 0
    for i in range(n):
        step = size + (1 if i < extra else 0)
        groups.append(items[at : at + step])
        at += step
    return groups


# ---------------------------------------------------------------------------------------------
# the executor reader's plans


def source_key(address: str, partition: int | None) -> str:
    """Where a part reads, as the planner keys it: the nsqd, and its partition if any."""
    return address if partition is None else f"{address} partition {partition}"


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
        return source_key(self.address, self.partition)


def plan_batch(
    depths: Mapping[str, int],
    *,
    max_messages: int,
    max_bytes: int,
    max_messages_per_task: int,
    min_partitions: int = 1,
    sizes: Mapping[str, float] | None = None,
    max_bytes_per_task: int | None = None,
    sources: Mapping[str, tuple[str, int | None]] | None = None,
) -> list[Part]:
    """Split a batch of at most ``max_messages`` and ``max_bytes`` over the nsqd (or NSQ
    partitions: ``sources`` tells where each key reads) whose channel has ``depths[key]``
    messages waiting into tasks (Spark input partitions): each nsqd gets its fair share (what
    one does not need goes to the others), each task at most ``max_messages_per_task``
    messages and ``max_bytes_per_task`` bytes, and at least ``min_partitions`` tasks when
    there are messages enough.

    ``sizes[address]``, where known, is the mean body size of the topic on that nsqd: the
    batch then takes no more messages than ``max_bytes`` holds at those sizes, and an nsqd's
    share is split into tasks of ``max_bytes_per_task`` at most.  Whatever the sizes, each
    task's byte limit is its share of ``max_bytes`` (and at most ``max_bytes_per_task``): the
    task stops there."""
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
        count = -(-n // max_messages_per_task)
        size = sizes.get(address, 0.0)
        if max_bytes_per_task is not None and size > 0:
            # as many tasks as it takes for each one's messages to fit at the mean size
            fit = max(1, int(max_bytes_per_task // size))
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
            if max_bytes_per_task is not None:
                limit = min(limit, max_bytes_per_task)
            where = sources.get(address, (address, None)) if sources else (address, None)
            parts.append(Part(where[0], n, max(1, limit), where[1]))
    return parts


def encode_part(part: Part) -> list[Any]:
    """A part in the offset log: ``[nsqd, messages, bytes]``, and its partition if any."""
    encoded: list[Any] = [part.address, part.messages, part.bytes]
    if part.partition is not None:
        encoded.append(part.partition)
    return encoded


def decode_part(encoded: Sequence[Any]) -> Part:
    """The part :func:`encode_part` wrote; a ValueError (or TypeError) for anything else."""
    address, messages, size, *partition = encoded
    if len(partition) > 1:
        raise ValueError("too many fields")
    return Part(str(address), int(messages), int(size), int(partition[0]) if partition else None)


def plan_of(offset: Mapping[str, Any]) -> tuple[str | None, int, list[Part]]:
    """(run, batch, parts) of an executor reader's offset (no run: the initial offset); a
    ValueError for anything else."""
    try:
        run = offset.get("run")
        batch = int(offset.get("batch", 0))
        parts = [decode_part(p) for p in offset.get("parts", [])]
    except (AttributeError, TypeError, ValueError):
        raise ValueError(f"not an offset of the nsq source: {offset!r}") from None
    return (None if run is None else str(run)), batch, parts


class AvailableNow:
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


# ---------------------------------------------------------------------------------------------
# nsqd's /stats


#: a channel's counters in nsqd's ``/stats``: messages that reached it, then its backlog
_COUNTERS = ("message_count", "depth", "in_flight_count", "deferred_count")


def topic_entries(status: int, body: bytes, topic: str) -> list[dict[str, Any]]:
    """The topic's entries in nsqd's ``/stats?format=json`` answer: one, or one per partition
    the nsqd holds (the partitioned server); a ValueError for an answer other than 200."""
    if status != 200:
        raise ValueError(f"/stats answered {status}")
    stats = json.loads(body)
    if "topics" not in stats and isinstance(stats.get("data"), dict):
        stats = stats["data"]  # the legacy envelope
    return [dict(t) for t in stats.get("topics") or [] if t["topic_name"] == topic]


def topic_channel(topic: Mapping[str, Any], channel: str) -> Mapping[str, Any] | None:
    """The entry of ``channel`` in a topic's stats, if it is there."""
    for entry in topic.get("channels") or []:
        if entry["channel_name"] == channel:
            return dict(entry)
    return None


def mean_body_size(topic: Mapping[str, Any], channel: Mapping[str, Any] | None) -> float | None:
    """The mean body size: of what waits on the channel where nsqd tells (the partitioned
    server), else of what the topic received."""
    if channel is not None:
        size, depth = channel.get("depth_size"), channel.get("depth")
        if isinstance(size, int) and isinstance(depth, int) and depth:
            return size / depth
    count, size = topic.get("message_count"), topic.get("message_bytes")
    return size / count if isinstance(size, int) and isinstance(count, int) and count else None


def waiting(
    topic: Mapping[str, Any], channel: Mapping[str, Any], partitioned: bool
) -> tuple[int, float | None, tuple[int, int] | None]:
    """(ready messages, mean body size, counters) of the channel; the counters: (messages
    that reached it, its backlog: ready, in flight and deferred), where nsqd tells them.
    nsqd's ``depth`` is what is ready; the partitioned server's counts what is unconfirmed,
    in flight and deferred too."""
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
    return ready, mean_body_size(topic, channel), counters


# ---------------------------------------------------------------------------------------------
# connections and their RDY


def max_rdy_counts(
    connections: Iterable[Mapping[str, Any]], *, subscribed_only: bool = True
) -> list[tuple[str, int]]:
    """(address, ``max_rdy_count``) of each connection of a consumer's ``stats()`` that
    IDENTIFY told it of (``subscribed_only``: of the subscribed connections alone)."""
    return [
        (c["address"], c["max_rdy_count"])
        for c in connections
        if c["max_rdy_count"] is not None and (not subscribed_only or c["state"] == "SUBSCRIBED")
    ]


def connections_for(messages: int, capacity: int, max_connections: int) -> int:
    """The connections it takes to hold ``messages`` when each holds ``capacity`` at most
    (nsqd's ``max_rdy_count``), up to ``max_connections``."""
    return min(max_connections, -(-messages // capacity))


def shares(window: int, consumers: int, capacity: int) -> list[int]:
    """``window`` split between ``consumers`` that may hold ``capacity`` each: the first ones
    full, the rest what is left (0 when nothing is)."""
    split = []
    left = window
    for i in range(consumers):
        share = left if i == consumers - 1 else min(capacity, left)
        split.append(share)
        left -= share
    return split


def offers(holding: Sequence[int], room: int, limit: int | None) -> list[tuple[int, int]]:
    """The RDY of connections that hold ``holding[i]`` messages when together they may take
    ``room`` more: what each holds plus its part of ``room``, split evenly, none above
    ``limit`` (nsqd's ``max_rdy_count``; None: not told).  (index, RDY) pairs, the fullest
    connections first: what they cannot take goes to the others."""
    order = sorted(range(len(holding)), key=holding.__getitem__, reverse=True)
    rdy = []
    left = room
    for j, i in enumerate(order):
        even = -(-left // (len(order) - j))
        more = even if limit is None else min(even, max(0, limit - holding[i]))
        left -= more
        rdy.append((i, holding[i] + more))
    return rdy
