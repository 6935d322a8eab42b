"""What the consumer and the producer share: options, TLS and the ``async with`` plumbing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._backend import Backend, TaskGroupContext, TaskGroupLike
from ._driver import Driver

__all__ = ["ClientBase"]


class ClientBase:
    """``async with`` plumbing shared by the consumer and the producer."""

    _driver: Driver

    def __init__(self, backend: Backend) -> None:
        self._backend = backend
        self._clock: Callable[[], float] = backend.current_time
        self._tg_cm: TaskGroupContext | None = None
        self._tg: TaskGroupLike | None = None

    async def _enter(self) -> None:
        self._clock = self._backend.clock()
        self._tg_cm = self._backend.task_group()
        self._tg = await self._tg_cm.__aenter__()
        self._tg.start_soon(self._driver.run, self._tg)

    async def _exit(self, exc_info: tuple[Any, Any, Any]) -> bool | None:
        assert self._tg is not None and self._tg_cm is not None
        self._tg.cancel_scope.cancel()
        error = exc_info[1]
        if error is None or isinstance(error, self._backend.cancelled_exc_class()):
            return await self._tg_cm.__aexit__(*exc_info)
        # the body failed: close our tasks, then let its exception through as it is (not
        # wrapped in an exception group by our internal task group)
        await self._tg_cm.__aexit__(None, None, None)
        return False
