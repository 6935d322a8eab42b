"""An anyio event loop in a daemon thread, reached from Spark's threads through a blocking portal.

Spark calls the data source from plain threads; the NSQ clients are async.  Each reader (and
each worker process's producer pool) runs its clients on one such loop.  The thread is a daemon
so that a process Spark ends never waits for it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
from anyio.from_thread import BlockingPortal

__all__ = ["LoopThread"]

T = TypeVar("T")


class LoopThread:
    """One event loop (asyncio via anyio) running in a daemon thread."""

    def __init__(self, name: str) -> None:
        self._ready = threading.Event()
        self._portal: BlockingPortal | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._portal is None:
            raise RuntimeError(f"the event loop thread {name!r} did not start") from self._error

    def _main(self) -> None:
        try:
            anyio.run(self._amain)
        except BaseException as exc:  # reported to the starting thread
            self._error = exc
        finally:
            self._ready.set()

    async def _amain(self) -> None:
        async with BlockingPortal() as portal:
            self._portal = portal
            self._ready.set()
            await portal.sleep_until_stopped()

    @property
    def portal(self) -> BlockingPortal:
        if self._portal is None:
            raise RuntimeError("the event loop thread is not running")
        return self._portal

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self._portal is not None

    def call(self, func: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run ``func(*args)`` on the loop and wait for its result."""
        return self.portal.call(func, *args)

    def close(self, timeout: float = 10.0) -> None:
        """Stop the loop (cancelling what still runs on it) and wait for the thread."""
        portal, self._portal = self._portal, None
        if portal is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop has already ended
            portal.call(portal.stop, True)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)
