"""``nsq_anyio.Consumer``: the shared async consumer on the anyio backend."""

from __future__ import annotations

from typing import Any

from nsq_proto._aio import AsyncConsumer

from ._backend import BACKEND

__all__ = ["Consumer"]


class Consumer(AsyncConsumer):
    __doc__ = AsyncConsumer.__doc__

    def __init__(self, topic: str, channel: str, **options: Any) -> None:
        super().__init__(BACKEND, topic, channel, agent="nsq_anyio", **options)

    async def __aenter__(self) -> Consumer:
        await super().__aenter__()
        return self
