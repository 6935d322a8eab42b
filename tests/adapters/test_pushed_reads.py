"""Reads handed over from the loop's callback (nsq_anyio on asyncio, ``nsq_client.PushStream``)
behave as reads in a task do: what the user's hooks can call, what a write that must wait
does, and what an error raised there becomes, on every way the client runs."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import anyio
import pytest

import nsq_client
from nsq_anyio._asyncio_stream import AsyncioStream
from nsq_anyio._backend import AnyioBackend
from nsq_emulator.loopback import serve_emulator

pytestmark = pytest.mark.anyio

TIMEOUT = 10


async def _poison(addresses: list[str]) -> None:
    async with nsq_client.Producer(backend=AnyioBackend(), nsqd_tcp_addresses=addresses) as p:
        await p.publish("t", b"poison")


async def _give_up_once(lib: ModuleType, hook: Any) -> tuple[list[int], BaseException | None]:
    """A message that fails once with ``max_attempts=1``: its second delivery is given up
    while the read that carried it is handled, and ``hook`` runs there."""
    attempts: list[int] = []
    failure: BaseException | None = None
    async with serve_emulator(lookupd=False) as cluster:
        addresses = cluster.nsqd_tcp_addresses
        await _poison(addresses)

        async def handler(message: Any) -> None:
            attempts.append(message.attempts)
            raise RuntimeError("fails")

        try:
            with anyio.fail_after(TIMEOUT):
                async with lib.Consumer(
                    "t",
                    "c",
                    nsqd_tcp_addresses=addresses,
                    max_attempts=1,
                    default_requeue_delay=0.0,
                    backoff_multiplier=0.01,
                    on_give_up=hook,
                ) as consumer:
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(consumer.run, handler, 1)
                        while consumer.stats()["messages_given_up"] == 0:
                            await anyio.sleep(0.01)
                        tg.cancel_scope.cancel()
        except BaseException as exc:  # what the user's ``async with`` raised
            failure = exc
    return attempts, failure


async def test_a_give_up_hook_can_call_the_event_loop_library(lib: ModuleType) -> None:
    seen: list[tuple[int, float]] = []

    def hook(message: Any) -> None:
        # run while the read is handled: on asyncio that is the transport's callback, where
        # anyio still has to find its loop
        seen.append((message.attempts, anyio.current_time()))

    attempts, failure = await _give_up_once(lib, hook)
    assert failure is None
    assert attempts == [1]
    assert [a for a, _ in seen] == [2]
    assert seen[0][1] > 0


async def test_an_error_raised_in_a_hook_ends_the_consumer_with_that_error(
    lib: ModuleType,
) -> None:
    def hook(message: Any) -> None:
        raise ValueError(f"hook refused {message.id!r}")

    _, failure = await _give_up_once(lib, hook)
    # the user's ``async with`` ends with the hook's own error, whichever way reads are taken
    assert failure is not None
    errors = list(failure.exceptions) if isinstance(failure, BaseExceptionGroup) else [failure]
    flat: list[BaseException] = []
    while errors:
        error = errors.pop()
        if isinstance(error, BaseExceptionGroup):
            errors.extend(error.exceptions)
        else:
            flat.append(error)
    assert [type(e) for e in flat] == [ValueError]
    assert "hook refused" in str(flat[0])


class _FullStream:
    """An asyncio stream that never takes bytes without waiting (a transport whose buffer is
    always above its high-water mark): every write of a pushed read must go through a task."""

    def __init__(self, inner: AsyncioStream, log: list[str]) -> None:
        self.inner = inner
        self.log = log

    def send_nowait(self, data: bytes) -> bool:
        self.log.append("refused")
        return False

    async def send(self, data: bytes) -> None:
        # the commands of this write (IDENTIFY's body is JSON on its own line, not a command)
        for line in data.removeprefix(b"  V2").split(b"\n"):
            word = line.split(b" ", 1)[0]
            if word.isalpha() and word.isupper():
                self.log.append(word.decode())
        await self.inner.send(data)

    async def receive(self) -> bytes:
        return await self.inner.receive()

    def start_pushing(self, on_data: Any, on_end: Any) -> None:
        self.log.append("pushing")
        self.inner.start_pushing(on_data, on_end)

    def stop_pushing(self) -> None:
        self.inner.stop_pushing()

    async def aclose(self) -> None:
        await self.inner.aclose()


class _FullBackend(AnyioBackend):
    def __init__(self) -> None:
        self.log: list[str] = []

    async def connect_tcp(self, host: str, port: int) -> Any:
        stream = await super().connect_tcp(host, port)
        assert isinstance(stream, AsyncioStream)
        return _FullStream(stream, self.log)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_writes_a_pushed_read_cannot_make_at_once_go_out_in_order(
    anyio_backend: str,
) -> None:
    backend = _FullBackend()
    async with serve_emulator(lookupd=False) as cluster:
        addresses = cluster.nsqd_tcp_addresses
        await _poison(addresses)
        async with nsq_client.Producer(backend=AnyioBackend(), nsqd_tcp_addresses=addresses) as p:
            await p.publish_many("t", [b"%d" % i for i in range(50)])
        got: list[bytes] = []
        with anyio.fail_after(TIMEOUT):
            async with nsq_client.Consumer(
                "t", "c", backend=backend, nsqd_tcp_addresses=addresses, max_in_flight=5
            ) as consumer:
                async for message in consumer:
                    got.append(message.body)
                    await message.finish()
                    if len(got) == 51:
                        break
        stats = cluster.nsqds[0].channel_stats("t", "c")
    assert sorted(got) == sorted([b"poison"] + [b"%d" % i for i in range(50)])
    assert stats.depth == 0 and stats.in_flight_count == 0  # every FIN arrived
    log = backend.log
    assert "pushing" in log and "refused" in log
    # SUB and RDY answer what nsqd said in pushed reads, after IDENTIFY, in that order
    commands = [entry for entry in log if entry.isupper()]
    assert commands[:3] == ["IDENTIFY", "SUB", "RDY"]
    assert commands.count("FIN") == 51
