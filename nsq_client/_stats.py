"""What ``Consumer.stats()`` and ``Producer.stats()`` return: typed, JSON-ready dicts."""

from __future__ import annotations

from typing import TypedDict

__all__ = ["ConsumerConnectionStats", "ConsumerStats", "ProducerConnectionStats", "ProducerStats"]


class ConsumerConnectionStats(TypedDict):
    """One connection of a consumer, in :class:`ConsumerStats`'s ``connections``."""

    conn_id: int
    #: ``host:port`` of the nsqd
    address: str
    #: the connection's state (``ConnectionState`` name)
    state: str
    #: the RDY count the consumer gave it
    rdy: int
    #: messages it delivered that are not answered yet
    in_flight: int
    #: the partition it subscribed to (partitioned NSQ), else None
    partition: int | None
    #: the RDY nsqd allows on it (IDENTIFY's ``max_rdy_count``; None before the answer)
    max_rdy_count: int | None


class ConsumerStats(TypedDict):
    """What ``Consumer.stats()`` returns: the subscription, its RDY and backoff, counts of
    messages since the start, the latest error, each connection."""

    topic: str
    channel: str
    max_in_flight: int
    total_rdy: int
    backoff_level: int
    starved: bool
    messages_received: int
    messages_finished: int
    messages_requeued: int
    messages_given_up: int
    #: the newest connection failure, as text (None if none)
    last_error: str | None
    connections: list[ConsumerConnectionStats]


class ProducerConnectionStats(TypedDict):
    """One connection of a producer, in :class:`ProducerStats`'s ``connections``."""

    conn_id: int
    #: ``host:port`` of the nsqd
    address: str
    #: the connection's state (``ConnectionState`` name)
    state: str
    #: publishes sent and not yet acknowledged
    outstanding: int


class ProducerStats(TypedDict):
    """What ``Producer.stats()`` returns: publishes waiting for a connection, each
    connection."""

    #: publishes waiting for a connection
    pending: int
    connections: list[ProducerConnectionStats]
