"""Where a channel of the partitioned server starts consuming: ``start_from`` positions.

The server knows four positions (``ConsumeOffset``): the end of the partition (skip the
backlog), a Unix time, a queue byte offset and a message count; the last three need the
cluster (a standalone partitioned nsqd refuses them).

How it is sent: ``SUB_ADVANCED topic channel partition position`` (go-nsq's form) has five
tokens, and the server reads the partition token only from a four-token line, so that form
subscribes to whichever partition the node leads first and moves *that* partition: wrong as
soon as a node leads two partitions of the topic.  The consumer core therefore sets the
position over nsqd's HTTP API, ``POST /channel/setoffset?topic=&partition=&channel=`` with the
position as the body, on the partition's leader, before its first subscription to that
partition.  That call moves the channel for every consumer of it, so the consumer makes it
once per partition, when it starts, never on a reconnect.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from ._errors import ConfigError

__all__ = ["StartFrom"]

_INT64_MAX = (1 << 63) - 1
StartKind = Literal["special", "timestamp", "virtual_queue", "msgcount"]


class _DateTime(Protocol):
    """What :meth:`StartFrom.timestamp` needs of a ``datetime`` (the core reads no clock)."""

    @property
    def tzinfo(self) -> Any: ...
    def timestamp(self) -> float: ...


@dataclass(frozen=True, slots=True)
class StartFrom:
    """A start position; make it with :meth:`end`, :meth:`timestamp`, :meth:`queue_offset`
    or :meth:`message_count`."""

    kind: StartKind
    value: int

    def __post_init__(self) -> None:
        if self.kind not in ("special", "timestamp", "virtual_queue", "msgcount"):
            raise ConfigError(f"unknown start position kind {self.kind!r}")
        value = self.value
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"a start position is an int, not {value!r}")
        if self.kind == "special":
            if value != -1:
                raise ConfigError("the only special start position is -1 (the end)")
        elif not 0 <= value <= _INT64_MAX:
            raise ConfigError(f"a {self.kind} start position must be 0..2^63-1, not {value}")

    @classmethod
    def end(cls) -> StartFrom:
        """The current end: only messages published from now on."""
        return cls("special", -1)

    @classmethod
    def timestamp(cls, when: float | _DateTime) -> StartFrom:
        """The first message published at or after ``when`` (Unix seconds, or an aware
        datetime)."""
        if isinstance(when, bool):
            raise ConfigError(f"a start time is Unix seconds or a datetime, not {when!r}")
        if isinstance(when, int | float):
            seconds = float(when)
        elif hasattr(when, "timestamp") and hasattr(when, "tzinfo"):
            if when.tzinfo is None:
                raise ConfigError("give an aware datetime (with a tzinfo) as a start position")
            seconds = when.timestamp()
        else:
            raise ConfigError(f"a start time is Unix seconds or a datetime, not {when!r}")
        if not math.isfinite(seconds):
            raise ConfigError(f"a start time must be finite, not {seconds!r}")
        return cls("timestamp", math.floor(seconds))

    @classmethod
    def queue_offset(cls, offset: int) -> StartFrom:
        """The message at this queue byte offset (``message.queue_offset`` of a message)."""
        return cls("virtual_queue", offset)

    @classmethod
    def message_count(cls, count: int) -> StartFrom:
        """The partition's ``count``-th message (1 is the first; the count covers the
        partition's whole history, as the real server counts)."""
        return cls("msgcount", count)

    def token(self) -> bytes:
        """The wire form, ``type:value``."""
        return f"{self.kind}:{self.value}".encode()

    @classmethod
    def parse(cls, text: str) -> StartFrom:
        """``end``, ``timestamp:<unix s>``, ``virtual_queue:<offset>``, ``msgcount:<n>`` or
        ``special:-1`` (for options given as text, e.g. Spark's)."""
        if text.strip() == "end":
            return cls.end()
        kind, sep, value = text.strip().partition(":")
        if not sep:
            raise ConfigError(f"a start position reads 'end' or 'kind:value', not {text!r}")
        try:
            number = int(value)
        except ValueError:
            raise ConfigError(f"start position {text!r}: {value!r} is not an int") from None
        return cls(kind, number)  # type: ignore[arg-type]
