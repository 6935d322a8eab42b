"""The inbox the workers take messages from: a handler that never awaits still lets the loop
run (a checkpoint every so many messages taken without waiting)."""

from __future__ import annotations

from typing import Any, cast

import anyio
import pytest

from nsq_anyio._backend import AnyioBackend
from nsq_client._message import CHECKPOINT_EVERY, Message, _Inbox

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_a_worker_that_never_waits_yields_to_the_loop(anyio_backend: str) -> None:
    inbox = _Inbox(AnyioBackend())
    count = 3 * CHECKPOINT_EVERY + 10
    for i in range(count):
        inbox.put(cast(Message, i))
    inbox.close()
    ticks = 0
    seen_at: list[int] = []  # the ticker's count when each message was taken

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await anyio.lowlevel.checkpoint()

    async def worker() -> None:
        # what Consumer._worker does with a handler that does not await
        while True:
            message: Any = inbox.take()
            if message is None:
                message = await inbox.wait_next()
                if message is None:
                    return
            seen_at.append(ticks)

    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        await anyio.lowlevel.checkpoint()
        await worker()
        tg.cancel_scope.cancel()
    assert len(seen_at) == count
    # the ticker ran between runs of messages. trio may reverse the order of the runnable tasks
    # from one batch to the next (ticker, worker | worker, ticker), so two runs of the worker can
    # see the same tick, never three: a worker that did not yield would take all in one run
    runs = [seen_at.count(t) for t in sorted(set(seen_at))]
    assert len(runs) >= 2
    assert max(runs) <= 2 * CHECKPOINT_EVERY < count


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_get_waits_for_a_message_and_ends_once_closed(anyio_backend: str) -> None:
    inbox = _Inbox(AnyioBackend())
    got: list[object] = []

    async def reader() -> None:
        while (message := await inbox.get()) is not None:
            got.append(message)

    async with anyio.create_task_group() as tg:
        tg.start_soon(reader)
        await anyio.sleep(0.01)
        inbox.put(cast(Message, "a"))
        inbox.put(cast(Message, "b"))
        await anyio.sleep(0.01)
        assert got == ["a", "b"]
        inbox.close()
    assert got == ["a", "b"]
