"""``run()`` takes async handlers: a plain function is a TypeError when run() starts, before any
message is handled; async functions, objects with an async ``__call__`` and partials of them are
taken."""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

import anyio
import pytest

from nsq_emulator.loopback import serve_emulator

pytestmark = pytest.mark.anyio

TIMEOUT = 20


async def test_a_plain_function_is_a_type_error_before_any_message(lib: ModuleType) -> None:
    called: list[bytes] = []

    def handler(message: Any) -> None:
        called.append(message.body)  # a side effect that must not happen

    async with serve_emulator(lookupd=False) as cluster:
        addresses = cluster.nsqd_tcp_addresses
        async with lib.Producer(nsqd_tcp_addresses=addresses) as producer:
            await producer.publish("t", b"x")
        async with lib.Consumer("t", "c", nsqd_tcp_addresses=addresses) as consumer:
            with anyio.fail_after(TIMEOUT), pytest.raises(TypeError) as info:
                await consumer.run(handler, 2)
            with anyio.fail_after(TIMEOUT):  # the message is still there for a good handler
                async for message in consumer:
                    await message.finish()
                    break
    assert called == []
    assert str(info.value).startswith("run() takes an async handler (async def), not <function ")
    assert message.body == b"x" and message.attempts == 1


class _Handler:
    def __init__(self) -> None:
        self.seen: list[bytes] = []

    async def __call__(self, message: Any) -> None:
        self.seen.append(message.body)

    async def method(self, message: Any) -> None:
        self.seen.append(message.body)


async def _with_prefix(seen: list[bytes], prefix: bytes, message: Any) -> None:
    seen.append(prefix + message.body)


async def test_async_callables_are_taken(lib: ModuleType) -> None:
    instance = _Handler()
    seen: list[bytes] = []
    handlers: list[Any] = [
        instance,
        instance.method,
        functools.partial(_with_prefix, seen, b"p:"),
        functools.partial(instance),
    ]
    async with serve_emulator(lookupd=False) as cluster:
        addresses = cluster.nsqd_tcp_addresses
        for i, handler in enumerate(handlers):
            topic = f"t{i}"
            async with lib.Producer(nsqd_tcp_addresses=addresses) as producer:
                await producer.publish(topic, b"x")
            async with lib.Consumer(topic, "c", nsqd_tcp_addresses=addresses) as consumer:
                with anyio.fail_after(TIMEOUT):
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(consumer.run, handler, 1)
                        while len(instance.seen) + len(seen) < i + 1:
                            await anyio.sleep(0.01)
                        tg.cancel_scope.cancel()
    assert instance.seen == [b"x", b"x", b"x"]
    assert seen == [b"p:x"]


async def test_a_non_callable_is_a_type_error(lib: ModuleType) -> None:
    consumer = lib.Consumer("t", "c", nsqd_tcp_addresses=["127.0.0.1:4150"])
    with (
        anyio.fail_after(TIMEOUT),
        pytest.raises(TypeError, match=r"^run\(\) takes an async handler \(async def\), not 3"),
    ):
        await consumer.run(3)


def test_the_blocking_run_refuses_an_async_handler() -> None:
    from nsq_anyio import blocking

    async def handler(message: Any) -> None:
        pass

    consumer = blocking.Consumer("t", "c", nsqd_tcp_addresses=["127.0.0.1:4150"])
    with pytest.raises(TypeError, match=r"^the blocking run\(\) takes a plain function, not "):
        consumer.run(handler)
