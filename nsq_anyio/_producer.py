"""``nsq_anyio.Producer``: the shared async producer on the anyio backend."""

from __future__ import annotations

from typing import Any

from nsq_proto._aio import AsyncProducer

from ._backend import BACKEND

__all__ = ["Producer"]


class Producer(AsyncProducer):
    __doc__ = AsyncProducer.__doc__

    def __init__(self, **options: Any) -> None:
        super().__init__(BACKEND, agent="nsq_anyio", **options)

    async def __aenter__(self) -> Producer:
        await super().__aenter__()
        return self
