"""Where each partition of a consumer starts: setting its ``start_from`` position.

:class:`StartPositions` is the consumer's part for ``start_from`` (the positions are
:mod:`._start_from`'s): before the first subscription to a partition it sets the channel's
position on the partition's leader over nsqd's HTTP API (``POST /channel/setoffset``, after
``/channel/create`` when the leader does not have the channel yet), once per partition while
the consumer runs, never on a reconnect.  Each partition's position is :attr:`Seek.SETTING`
while its call is out and :attr:`Seek.APPLIED` once the leader took it; a failure forgets it,
so that the next lookup tries again.

It sends its calls through the consumer's :class:`~._lookupd_client.LookupdClient` and turns
their answers into decisions, as that client does: :class:`~nsq_proto.StartFromApplied` (the
consumer reports it and connects to the partition now), :class:`~nsq_proto.StartFromFailed`
(reported; not consumed from until a later lookup sets it), or None (another call is out).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from ._config import ConfigError, ConsumerConfig
from ._errors import LookupdError, NSQError
from ._events import StartFromApplied, StartFromFailed
from ._lookupd import Peer
from ._lookupd_client import LookupdClient, NsqdAnswered, NsqdCallFailed

__all__ = ["Seek", "StartDecision", "StartPositions"]

#: what an answer to a start-position call decides (None: another call is out)
StartDecision = StartFromApplied | StartFromFailed | None


class Seek(Enum):
    """Where setting one partition's position stands (absent: not set, nor being set)."""

    # members are singletons: identity hashing is exact and much cheaper than Enum's
    __hash__ = object.__hash__

    #: a call to the leader is out
    SETTING = "setting"
    #: the leader took the position: the partition is consumed from
    APPLIED = "applied"


@dataclass(frozen=True, slots=True)
class _SeekCall:
    """A start-position call to nsqd's HTTP API: on the leader ``peer`` of ``partition``,
    ``/channel/create`` when ``create``, else ``/channel/setoffset``."""

    peer: Peer
    partition: int
    create: bool


class StartPositions:
    """The ``start_from`` positions of one consumer's partitions, set on their leaders."""

    __slots__ = ("_calls", "_channel", "_config", "_lookupd", "_topic", "seeks")

    def __init__(
        self, topic: str, channel: str, config: ConsumerConfig, lookupd: LookupdClient
    ) -> None:
        if config.start_from is not None and not lookupd.addresses:
            # the position is set over the HTTP API of each partition's leader, which lookupd
            # names (its TCP SUB_ADVANCED form applies it to the wrong partition)
            raise ConfigError("start_from needs lookupd_http_addresses")
        self._topic = topic
        self._channel = channel
        self._config = config
        self._lookupd = lookupd
        #: partition -> where setting its position stands
        self.seeks: dict[int, Seek] = {}
        #: the calls in flight: request id -> what each sets
        self._calls: dict[int, _SeekCall] = {}

    def pending(self, partition: int) -> bool:
        """Whether ``partition`` has a position still to set (connect only once it is)."""
        return (
            self.seeks.get(partition) is not Seek.APPLIED
            and self._config.start_position(partition) is not None
        )

    def seek(self, peer: Peer, partition: int, now: float, *, create: bool = False) -> None:
        """``POST /channel/setoffset`` (``/channel/create`` when ``create``) on the
        partition's leader ``peer``; one call per partition at a time."""
        if self.seeks.get(partition) is Seek.SETTING and not create:
            return
        position = self._config.start_position(partition)
        assert position is not None
        self.seeks[partition] = Seek.SETTING
        address = (peer.address[0], peer.http_port)
        query: dict[str, str | int] = {
            "topic": self._topic,
            "partition": partition,
            "channel": self._channel,
        }
        if create:
            rid = self._lookupd.post(address, "/channel/create", query, b"", now)
        else:
            rid = self._lookupd.post(address, "/channel/setoffset", query, position.token(), now)
        self._calls[rid] = _SeekCall(peer, partition, create)

    def answered(self, answer: NsqdAnswered, now: float) -> StartDecision:
        """The leader answered a call: the decision."""
        seek = self._calls.pop(answer.request_id)
        peer, partition, created = seek.peer, seek.partition, seek.create
        status = answer.status
        if status == 200:
            if created:
                del self.seeks[partition]
                self.seek(peer, partition, now)  # the channel exists now: set its position
                return None
            self.seeks[partition] = Seek.APPLIED
            return StartFromApplied(peer.address, partition)
        text = answer.body.decode("utf-8", "replace").strip()
        if status == 404 and "CHANNEL_NOT_FOUND" in text and not created:
            self.seek(peer, partition, now, create=True)
            return None
        what = "/channel/create" if created else "/channel/setoffset"
        detail = f": {text}" if text else ""
        return self._failed(
            seek,
            LookupdError(
                f"start_from for partition {partition}: {what} answered HTTP {status}{detail}"
            ),
        )

    def failed(self, answer: NsqdCallFailed) -> StartFromFailed:
        """A call got no complete answer: the decision."""
        return self._failed(self._calls.pop(answer.request_id), answer.error)

    def _failed(self, seek: _SeekCall, error: NSQError) -> StartFromFailed:
        # not consumed from until the position is set: the next lookup tries again
        self.seeks.pop(seek.partition, None)
        return StartFromFailed(seek.peer.address, seek.partition, error)
