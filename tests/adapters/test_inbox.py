"""The inbox the workers take messages from: a handler that never awaits still lets the loop
run (a checkpoint every so many messages taken without waiting)."""

from __future__ import annotations

from typing import Any, cast

import anyio
import pytest

from nsq_anyio._backend import AnyioBackend
from nsq_client._message import CHECKPOINT_EVERY, Message, _Inbox

from ..ticks import Ticker

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_a_worker_that_never_waits_yields_to_the_loop(anyio_backend: str) -> None:
    inbox = _Inbox(AnyioBackend())
    count = 3 * CHECKPOINT_EVERY + 10
    for i in range(count):
        inbox.put(cast(Message, i))
    inbox.close()
    ticker = Ticker()  # marked when each message is taken

    async def worker() -> None:
        # what Consumer._worker does with a handler that does not await
        while True:
            message: Any = inbox.take()
            if message is None:
                message = await inbox.wait_next()
                if message is None:
                    return
            ticker.mark()

    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker.run)
        await anyio.lowlevel.checkpoint()
        await worker()
        tg.cancel_scope.cancel()
    assert len(ticker.seen_at) == count
    # the ticker ran between runs of messages: a worker that did not yield would take all in
    # one run
    runs = ticker.runs()
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
