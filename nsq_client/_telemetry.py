"""Where the consumer and the producer call their telemetry (:mod:`nsq_client.otel`).

:data:`hooks.active` is None unless ``nsq_client.otel.instrument()`` was called: the hot paths
read it once per message (or publish) and do nothing more when it is None.  This module
imports nothing of OpenTelemetry; :mod:`nsq_client.otel` sets the hooks.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

from nsq_proto import Event, TraceReceipt

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ._message import Handler, Message

#: the consumer and the producer (``Any`` here: they import this module)
Consumer: TypeAlias = Any
Producer: TypeAlias = Any

__all__ = ["Hooks", "consumers", "hooks"]


class Hooks(Protocol):
    """What :mod:`nsq_client.otel` does at each hook point."""

    async def publish(
        self,
        producer: Producer,
        topic: str,
        bodies: Sequence[bytes],
        batch: bool,
        ext: Mapping[str, Any] | None,
        send: Callable[[Mapping[str, Any] | None], int],
    ) -> TraceReceipt | None:
        """A publish (``batch``: ``publish_many``): ``send(ext)`` queues it, with the header
        given (its request id, for ``producer._wait``)."""
        ...

    async def process(self, consumer: Consumer, handler: Handler, message: Message) -> None:
        """``run()``'s call of ``handler`` on ``message`` (raising what it raises)."""
        ...

    def received(self, consumer: Consumer, message: Message) -> Message:
        """A message taken with ``async for``: the message to give the application."""
        ...

    def consumer_event(self, consumer: Consumer, event: Event) -> None:
        """Any event of the consumer's core but ``MessageReceived``."""
        ...


class _Slot:
    __slots__ = ("active",)

    def __init__(self) -> None:
        self.active: Hooks | None = None


#: ``hooks.active``: the instrumentation, or None when it is off
hooks = _Slot()

#: every consumer alive (for the observable gauges and counters of :mod:`nsq_client.otel`)
consumers: weakref.WeakSet[Any] = weakref.WeakSet()
