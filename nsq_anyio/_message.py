"""The message object handed to applications."""

from __future__ import annotations

from typing import TYPE_CHECKING

import nsq_proto

if TYPE_CHECKING:
    from ._consumer import Consumer

__all__ = ["Message"]


class Message:
    """A delivered message with its answers.  Answer each message once: ``finish``,
    ``requeue`` or let ``touch`` buy time first."""

    __slots__ = ("_consumer", "_message", "_responded", "conn_id", "nsqd_address", "partition")

    def __init__(
        self,
        consumer: Consumer,
        conn_id: int,
        message: nsq_proto.Message,
        nsqd_address: str,
        partition: int | None,
    ) -> None:
        self._consumer = consumer
        self._message = message
        self.conn_id = conn_id
        self.nsqd_address = nsqd_address
        self.partition = partition
        self._responded = False

    @property
    def id(self) -> bytes:
        return self._message.id

    @property
    def body(self) -> bytes:
        return self._message.body

    @property
    def attempts(self) -> int:
        return self._message.attempts

    @property
    def timestamp(self) -> int:
        """Nanoseconds since the epoch, when nsqd received the message."""
        return self._message.timestamp

    @property
    def trace_id(self) -> int | None:
        return self._message.trace_id

    @property
    def raw(self) -> nsq_proto.Message:
        return self._message

    @property
    def has_responded(self) -> bool:
        return self._responded

    def _mark(self) -> None:
        if self._responded:
            raise nsq_proto.LocalProtocolError("this message has already been answered")
        self._responded = True

    async def finish(self) -> None:
        self._mark()
        self._consumer._finish(self)

    async def requeue(self, delay: float | None = None, backoff: bool = True) -> None:
        self._mark()
        self._consumer._requeue(self, delay, backoff)

    async def touch(self) -> None:
        if self._responded:
            raise nsq_proto.LocalProtocolError("this message has already been answered")
        self._consumer._touch(self)

    def __repr__(self) -> str:
        return f"<Message id={self.id!r} attempts={self.attempts} body={self.body[:40]!r}>"
