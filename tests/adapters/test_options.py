"""The options of the adapters' Consumer and Producer as a user meets them: typos and misuse
are a ConfigError naming the option, ``config=`` is accepted, the typed option lists match
the configurations, and the classes say which public module they belong to."""

from __future__ import annotations

import dataclasses
import typing
from types import ModuleType
from typing import Any

import anyio
import pytest

import nsq_client
from nsq_anyio._asyncio_stream import AsyncioStream
from nsq_anyio._backend import AnyioBackend
from nsq_emulator.loopback import serve_emulator
from nsq_proto import (
    ConfigError,
    ConnectionClosedError,
    ConsumerConfig,
    ProducerConfig,
    ServerError,
    __version__,
)

ADDRESSES = ["127.0.0.1:4150"]


def test_an_unknown_option_is_a_config_error_naming_it(lib: ModuleType) -> None:
    with pytest.raises(ConfigError, match="unknown option max_in_fligth of ConsumerConfig"):
        lib.Consumer("t", "c", max_in_fligth=10)
    with pytest.raises(ConfigError, match="unknown options colour, size of ProducerConfig"):
        lib.Producer(size=1, colour="red")


def test_tls_v1_points_at_tls(lib: ModuleType) -> None:
    with pytest.raises(ConfigError, match=r"give tls=True .* not tls_v1"):
        lib.Consumer("t", "c", tls_v1=True)
    assert lib.Consumer("t", "c", tls=True, nsqd_tcp_addresses=ADDRESSES).config.tls_v1 is True
    assert lib.Producer(nsqd_tcp_addresses=ADDRESSES).config.tls_v1 is False


def test_a_config_object_with_options_on_top(lib: ModuleType) -> None:
    base = ConsumerConfig(max_in_flight=7, msg_timeout=20.0, user_agent="mine/1")
    consumer = lib.Consumer("t", "c", config=base, msg_timeout=30.0, nsqd_tcp_addresses=ADDRESSES)
    assert consumer.config.max_in_flight == 7
    assert consumer.config.msg_timeout == 30.0  # the keyword wins
    assert consumer.config.user_agent == "mine/1"  # what the user set stays
    assert consumer.config.client_id  # filled in from this machine, as without config=
    producer = lib.Producer(config=ProducerConfig(pool_size=3), nsqd_tcp_addresses=ADDRESSES)
    assert producer.config.pool_size == 3
    assert producer.config.user_agent == f"nsq-sansio/{__version__}"
    with pytest.raises(ConfigError, match="config must be a ConsumerConfig, not ProducerConfig"):
        lib.Consumer("t", "c", config=ProducerConfig())
    with pytest.raises(ConfigError, match="max_in_flight"):  # checked as always
        lib.Consumer("t", "c", config=base, max_in_flight=-1, nsqd_tcp_addresses=ADDRESSES)


@pytest.mark.parametrize(
    ("options", "config"),
    [(nsq_client.ConsumerOptions, ConsumerConfig), (nsq_client.ProducerOptions, ProducerConfig)],
)
def test_the_typed_options_are_the_configs_fields(options: type, config: type) -> None:
    fields = {f.name: f for f in dataclasses.fields(config)}
    keys = typing.get_type_hints(options)
    assert set(keys) == set(fields) - {"tls_v1"}
    hints = typing.get_type_hints(config)
    for name, hint in keys.items():
        if name != "auth_secret":  # a str is taken too, and encoded
            assert hint == hints[name], name


@pytest.mark.anyio
async def test_async_with_gives_the_object_and_stats_are_json_ready(lib: ModuleType) -> None:
    import json

    async with serve_emulator(lookupd=False) as cluster:
        addresses = cluster.nsqd_tcp_addresses
        consumer = lib.Consumer("t", "c", nsqd_tcp_addresses=addresses)
        async with consumer as entered:
            assert entered is consumer
            stats = json.loads(json.dumps(consumer.stats()))
            assert stats["topic"] == "t" and stats["connections"][0]["address"] in addresses
        async with lib.Producer(nsqd_tcp_addresses=addresses) as producer:
            await producer.publish("t", b"x")
            (conn,) = producer.stats()["connections"]
            assert conn["address"] in addresses


def test_the_classes_name_their_public_module(lib: ModuleType) -> None:
    assert lib.Consumer.__module__ == lib.__name__
    assert lib.Producer.__module__ == lib.__name__
    assert lib.Message is nsq_client.Message
    assert repr(nsq_client.Message).endswith("'nsq_client.Message'>")
    assert nsq_client.Consumer.__module__ == "nsq_client"


def test_the_shared_client_needs_a_backend_the_adapters_bring_theirs(lib: ModuleType) -> None:
    with pytest.raises(ConfigError, match=r"Consumer needs backend=\.\.\."):
        nsq_client.Consumer("t", "c", nsqd_tcp_addresses=ADDRESSES)
    with pytest.raises(ConfigError, match=r"Producer needs backend=\.\.\."):
        nsq_client.Producer(nsqd_tcp_addresses=ADDRESSES)
    backend = lib.Consumer.default_backend
    assert backend is not None
    consumer = nsq_client.Consumer("t", "c", backend=backend, nsqd_tcp_addresses=ADDRESSES)
    assert consumer.config.max_in_flight == 1


class _StallingStream:
    """A stream whose writes hang once ``stall`` is set (a peer that stopped reading)."""

    def __init__(self, inner: nsq_client.Stream, owner: _StallingBackend) -> None:
        self.inner = inner
        self.owner = owner

    async def send(self, data: bytes) -> None:
        if self.owner.stall:
            await anyio.sleep_forever()
        await self.inner.send(data)

    async def receive(self) -> bytes:
        return await self.inner.receive()

    async def aclose(self) -> None:
        await self.inner.aclose()


class _StallingBackend(AnyioBackend):
    """nsq_anyio's backend with streams that can stop taking writes: a custom backend, as a
    user brings one to nsq_client."""

    stall = False

    async def connect_tcp(self, host: str, port: int) -> Any:
        return _StallingStream(await super().connect_tcp(host, port), self)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_write_over_write_timeout_fails_the_connection(anyio_backend: str) -> None:
    backend = _StallingBackend()
    async with serve_emulator(lookupd=False) as cluster:
        async with nsq_client.Producer(
            backend=backend,
            nsqd_tcp_addresses=cluster.nsqd_tcp_addresses,
            write_timeout=0.3,
            publish_timeout=10.0,
            max_publish_attempts=1,
        ) as producer:
            await producer.publish("t", b"before")
            backend.stall = True
            started = anyio.current_time()
            with pytest.raises(ConnectionClosedError, match=r"writing to .* took over 0.3 s"):
                await producer.publish("t", b"stalled")
            # the connection failed at the write's deadline, not at publish_timeout
            assert anyio.current_time() - started < 3.0
        assert cluster.nsqds[0].topic_stats("t").message_count == 1
    with pytest.raises(ConfigError, match="write_timeout must be a positive number"):
        ProducerConfig(write_timeout=0)


class _BrokenPipeStream:
    """Writes ``MPUB`` data, waits for the peer's answer to arrive, then fails the write as
    the kernel does once the peer closed (``EPIPE``): the state a client is in when nsqd
    refused a command with an error frame and closed the connection."""

    def __init__(self, inner: nsq_client.Stream) -> None:
        self.inner = inner
        self.written: anyio.Event | None = None

    async def receive(self) -> bytes:
        data = await self.inner.receive()
        if self.written is not None:
            await self.written.wait()  # what came during the write is read after it failed
        return data

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def send(self, data: bytes) -> None:
        if not data.startswith(b"MPUB "):
            await self.inner.send(data)
            return
        self.written = anyio.Event()
        try:
            await self.inner.send(data)
            await anyio.sleep(0.2)  # nsqd's error frame and its close are in our socket now
            raise BrokenPipeError(32, "Broken pipe")
        finally:
            self.written.set()


class _BrokenPipeNowaitStream(_BrokenPipeStream):
    """The same on the asyncio stream, which takes bytes without waiting and hands reads
    over from its callback: the ``MPUB`` goes out through ``send_nowait``, which then fails
    with ``EPIPE``, and nsqd's answer comes in a pushed read."""

    inner: AsyncioStream

    def send_nowait(self, data: bytes) -> bool:
        taken = self.inner.send_nowait(data)
        if taken and data.startswith(b"MPUB "):
            raise BrokenPipeError(32, "Broken pipe")
        return taken

    def start_pushing(self, on_data: Any, on_end: Any) -> None:
        self.inner.start_pushing(on_data, on_end)

    def stop_pushing(self) -> None:
        self.inner.stop_pushing()


class _WrappingBackend(AnyioBackend):
    """anyio's backend, each of its streams wrapped in ``wrap``."""

    def __init__(self, wrap: Any) -> None:
        self.wrap = wrap

    async def connect_tcp(self, host: str, port: int) -> Any:
        return self.wrap(await super().connect_tcp(host, port))


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("anyio_backend", "stream"),
    [
        ("asyncio", _BrokenPipeStream),
        ("trio", _BrokenPipeStream),
        ("asyncio", _BrokenPipeNowaitStream),
    ],
    ids=["asyncio-send", "trio-send", "asyncio-send_nowait-pushed"],
)
async def test_a_failed_write_does_not_hide_the_error_nsqd_sent_before_closing(
    anyio_backend: str, stream: Any
) -> None:
    async with serve_emulator(lookupd=False) as cluster:
        async with nsq_client.Producer(
            backend=_WrappingBackend(stream),
            nsqd_tcp_addresses=cluster.nsqd_tcp_addresses,
            max_publish_attempts=1,
        ) as producer:
            await producer.publish("t", b"before")
            # over nsqd's max_msg_size: nsqd answers E_BAD_MESSAGE and closes; the user sees
            # that answer, not the broken pipe of the write it interrupted
            with pytest.raises(ServerError) as info:
                await producer.publish_many("t", [b"x" * 2_000_000])
            assert info.value.code == "E_BAD_MESSAGE"
            assert producer.stats()["pending"] == 0


class _RecordingStream:
    def __init__(self, inner: nsq_client.Stream, sent: list[bytes]) -> None:
        self.inner = inner
        self.sent = sent

    async def send(self, data: bytes) -> None:
        await self.inner.send(data)
        self.sent.append(data)

    async def receive(self) -> bytes:
        return await self.inner.receive()

    async def aclose(self) -> None:
        await self.inner.aclose()


class _RecordingBackend(AnyioBackend):
    def __init__(self) -> None:
        self.sent: list[bytes] = []

    async def connect_tcp(self, host: str, port: int) -> Any:
        return _RecordingStream(await super().connect_tcp(host, port), self.sent)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_the_last_held_answer_is_on_the_wire_when_finish_returns(
    anyio_backend: str,
) -> None:
    backend = _RecordingBackend()
    async with serve_emulator(lookupd=False) as cluster:
        addresses = cluster.nsqd_tcp_addresses
        async with nsq_client.Producer(backend=backend, nsqd_tcp_addresses=addresses) as producer:
            await producer.publish_many("t", [b"a", b"b", b"c"])
        async with nsq_client.Consumer(
            "t", "c", backend=backend, nsqd_tcp_addresses=addresses, max_in_flight=1
        ) as consumer:
            with anyio.fail_after(5):
                async for message in consumer:
                    await message.finish()
                    # nothing else held: no other answer can share the write, so it is not
                    # left for later (with max_in_flight=1 the next message waits for it)
                    assert b"FIN " + message.id + b"\n" in b"".join(backend.sent)
                    if message.body == b"c":
                        break


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_the_last_held_requeue_is_on_the_wire_when_requeue_returns(
    anyio_backend: str,
) -> None:
    backend = _RecordingBackend()
    async with serve_emulator(lookupd=False) as cluster:
        addresses = cluster.nsqd_tcp_addresses
        async with nsq_client.Producer(backend=backend, nsqd_tcp_addresses=addresses) as producer:
            await producer.publish("t", b"again")
        async with nsq_client.Consumer(
            "t", "c", backend=backend, nsqd_tcp_addresses=addresses, max_in_flight=1
        ) as consumer:
            with anyio.fail_after(5):
                async for message in consumer:
                    if message.attempts == 1:
                        await message.requeue(0.0, backoff=False)
                        assert b"REQ " + message.id + b" 0\n" in b"".join(backend.sent)
                    else:
                        await message.finish()
                        break
        assert cluster.nsqds[0].channel_stats("t", "c").requeue_count == 1
