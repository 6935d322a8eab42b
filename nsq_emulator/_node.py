"""The interfaces between the parts of the emulator, as small typed protocols.

* :class:`Node` is what a client connection needs of the nsqd that accepted it, and
  :class:`PartitionedNode` what a connection to the partitioned server needs on top of it:
  the connection modules depend on these, never on :class:`~._nsqd.Nsqd` itself.
* :class:`Placement` is what a partitioned nsqd asks the cluster it belongs to.
* :class:`Registry` is what an nsqd tells each nsqlookupd it registers with.

This module imports none of the modules that implement them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

from ._options import NsqdOptions
from ._store import Channel, StoredMessage, Topic
from ._wire import ClientError

__all__ = ["Node", "PartitionedNode", "Placement", "Registry"]

ConnT = TypeVar("ConnT", contravariant=True)


class Node(Protocol[ConnT]):
    """What a client connection (of type ``ConnT``) needs of the nsqd that accepted it.

    Every entry point of a connection is bracketed by :meth:`begin_call` and
    :meth:`end_call` (timers due first, delivery and flushing after); the connection reports
    its output with :meth:`output_ready`, :meth:`output_buffered` and
    :meth:`output_flushed`, and its end with :meth:`connection_closed`."""

    @property
    def options(self) -> NsqdOptions: ...

    @property
    def output_delay(self) -> float:
        """How long a new connection holds each write (see ``Nsqd.delay_output``)."""

    def begin_call(self, now: float) -> None: ...

    def end_call(self, now: float) -> None: ...

    def pump(self, now: float) -> None:
        """Deliver what the channels changed since the last pump can deliver."""

    def take_injected(self, command: bytes) -> ClientError | None:
        """The error to answer ``command`` with instead of running it, if one is queued."""

    def get_topic(self, name: str, now: float) -> Topic: ...

    def get_channel(self, topic: Topic, name: str, now: float) -> Channel: ...

    def new_message(self, topic: Topic, body: bytes, now: float) -> StoredMessage: ...

    def put(self, topic: Topic, msg: StoredMessage, now: float) -> None: ...

    def dirty_channel(self, channel: Channel) -> None:
        """``channel`` may be able to deliver again (at the next :meth:`pump`)."""

    def output_ready(self, conn: ConnT) -> None:
        """``conn`` has bytes to send (or has just closed)."""

    def output_buffered(self, conn: ConnT) -> None:
        """``conn`` has a message frame in its writer, to flush at the end of the call."""

    def output_flushed(self, conn: ConnT) -> None:
        """``conn`` has flushed its writer."""

    def connection_closed(self, conn: ConnT, now: float) -> None: ...


class PartitionedNode(Node[ConnT], Protocol[ConnT]):
    """What a connection to the partitioned server needs on top of :class:`Node`."""

    @property
    def connections(self) -> Sequence[object]: ...

    @property
    def in_cluster(self) -> bool:
        """Whether the node belongs to a cluster (which then owns its topics)."""

    def default_partition(self, name: str) -> int:
        """The partition a request naming none goes to (-1: none)."""

    def existing_partition(self, name: str, partition: int) -> Topic | None: ...

    def is_leader(self, name: str, partition: int) -> bool: ...

    def new_partition_message(
        self,
        topic: Topic,
        body: bytes,
        now: float,
        *,
        trace_id: int = ...,
        ext_version: int | None = ...,
        ext_data: bytes = ...,
    ) -> StoredMessage: ...

    def set_channel_offset(self, channel: Channel, start: tuple[str, int]) -> str | None:
        """Apply a start position to ``channel``; returns the error text, or None."""

    def create_partition(
        self,
        topic: str,
        partition: int,
        now: float,
        *,
        ordered: bool = ...,
        ext: bool = ...,
        disable_channel_auto_create: bool = ...,
    ) -> None: ...


class Placement(Protocol):
    """What a partitioned nsqd asks the cluster that places partitions on nodes."""

    def default_partition(self, node: object, name: str) -> int:
        """The partition of ``name`` that ``node`` serves by default (-1: none)."""

    def replica_topic(self, node: object, name: str, partition: int) -> Topic | None:
        """The partition's data if ``node`` holds a replica of it, else None."""

    def leader(self, topic: str, partition: int) -> object | None:
        """The node leading the partition, if the partition exists."""


class Registry(Protocol):
    """What an nsqd tells each nsqlookupd it is registered with."""

    def nsqd_changed(self, nsqd: object, topic: str, channel: str | None, added: bool) -> None:
        """A topic (``channel`` None) or a channel was created (``added``) or deleted."""

    def nsqd_stopped(self, nsqd: object) -> None: ...

    def nsqd_started(self, nsqd: object) -> None: ...
