"""Mistakes users make get one clear error, early, the same on every adapter (the core decides):
bad addresses in the constructor, a refused nsqd as the refusal, nsqd's HTTP port as what it
is."""

from __future__ import annotations

import socket
import threading
from types import ModuleType

import anyio
import pytest

from nsq_anyio import blocking
from nsq_emulator.loopback import serve_emulator
from nsq_proto import ConfigError, ConnectionClosedError, RemoteProtocolError
from tests.support.served import server

__all__ = ["server"]

TIMEOUT = 20

BAD_NSQD = [
    ("http://127.0.0.1:4150", "'http://127.0.0.1:4150' is not host:port (no scheme, no path)"),
    ("127.0.0.1", "'127.0.0.1' is not host:port (it needs a port number)"),
    ("127.0.0.1:65536", "'127.0.0.1:65536' is not host:port (the port must be 1..65535)"),
]


@pytest.mark.parametrize(("address", "message"), BAD_NSQD)
def test_a_bad_nsqd_address_is_a_config_error_in_the_constructor(
    lib: ModuleType, address: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=r"^nsqd_tcp_addresses: address ") as info:
        lib.Producer(nsqd_tcp_addresses=[address])
    assert message in str(info.value)
    with pytest.raises(ConfigError, match=r"^nsqd_tcp_addresses: address ") as info:
        lib.Consumer("t", "c", nsqd_tcp_addresses=[address])
    assert message in str(info.value)


@pytest.mark.parametrize(("address", "message"), BAD_NSQD)
def test_the_blocking_api_refuses_a_bad_address_in_the_constructor(
    address: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=r"^nsqd_tcp_addresses: address ") as info:
        blocking.Producer(nsqd_tcp_addresses=[address])
    assert message in str(info.value)
    with pytest.raises(ConfigError, match=r"^nsqd_tcp_addresses: address ") as info:
        blocking.Consumer("t", "c", nsqd_tcp_addresses=[address])
    assert message in str(info.value)
    with pytest.raises(ConfigError, match=r"^lookupd_http_addresses: address "):
        blocking.Consumer("t", "c", lookupd_http_addresses=["https://127.0.0.1:4161"])


def test_a_string_for_a_list_is_a_config_error(lib: ModuleType) -> None:
    expected = (
        'nsqd_tcp_addresses must be a list of "host:port" strings, not the string '
        "'127.0.0.1:4150' (write ['127.0.0.1:4150'])"
    )
    for make in (
        lambda: lib.Producer(nsqd_tcp_addresses="127.0.0.1:4150"),
        lambda: lib.Consumer("t", "c", nsqd_tcp_addresses="127.0.0.1:4150"),
        lambda: blocking.Producer(nsqd_tcp_addresses="127.0.0.1:4150"),
    ):
        with pytest.raises(ConfigError) as info:
            make()
        assert str(info.value) == expected
    with pytest.raises(ConfigError, match=r"^lookupd_http_addresses must be a list"):
        lib.Consumer("t", "c", lookupd_http_addresses="127.0.0.1:4161")


@pytest.mark.anyio
async def test_lookupd_may_be_given_as_http_host_port(lib: ModuleType) -> None:
    async with serve_emulator() as cluster:
        async with lib.Producer(nsqd_tcp_addresses=cluster.nsqd_tcp_addresses) as producer:
            await producer.publish("t", b"found")
        lookupd = [f"http://{a}" for a in cluster.lookupd_http_addresses]
        async with lib.Consumer("t", "c", lookupd_http_addresses=lookupd) as consumer:
            with anyio.fail_after(TIMEOUT):
                async for message in consumer:
                    await message.finish()
                    break
        assert message.body == b"found"


def _closed_port() -> int:
    """A loopback port nothing listens on (it refuses connections)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@pytest.mark.anyio
async def test_a_publish_to_refusing_nsqd_fails_with_the_refusal(lib: ModuleType) -> None:
    address = f"127.0.0.1:{_closed_port()}"
    async with lib.Producer(nsqd_tcp_addresses=[address], publish_timeout=120.0) as producer:
        with anyio.fail_after(TIMEOUT), pytest.raises(ConnectionClosedError) as info:
            await producer.publish("t", b"x")  # long before publish_timeout
    text = str(info.value)
    assert (
        text == f"could not connect to any nsqd: connecting to {address} failed: connection refused"
    )
    assert "not acknowledged in time" not in text


@pytest.mark.anyio
async def test_a_publish_fails_over_while_one_nsqd_refuses(lib: ModuleType) -> None:
    async with serve_emulator(lookupd=False) as cluster:
        addresses = [f"127.0.0.1:{_closed_port()}", *cluster.nsqd_tcp_addresses]
        async with lib.Producer(nsqd_tcp_addresses=addresses) as producer:
            with anyio.fail_after(TIMEOUT):
                for _ in range(5):
                    await producer.publish("t", b"x")
        assert cluster.nsqds[0].topic_stats("t").message_count == 5


@pytest.mark.anyio
async def test_nsqd_http_port_is_named_as_such(lib: ModuleType) -> None:
    async with serve_emulator(lookupd=False) as cluster:
        (http,) = cluster.nsqd_http_addresses
        async with lib.Producer(nsqd_tcp_addresses=[http], publish_timeout=120.0) as producer:
            with anyio.fail_after(TIMEOUT), pytest.raises(RemoteProtocolError) as info:
                await producer.publish("t", b"x")
    assert str(info.value) == (
        f"{http} answered with HTTP: is this nsqd's HTTP port rather than its TCP port?"
    )


def test_the_blocking_producer_reports_a_refusal() -> None:
    address = f"127.0.0.1:{_closed_port()}"
    with blocking.Producer(nsqd_tcp_addresses=[address], publish_timeout=120.0) as producer:
        with pytest.raises(ConnectionClosedError, match=r"^could not connect to any nsqd: "):
            producer.publish("t", b"x")


def test_the_blocking_run_raises_max_in_flight_to_its_threads(server: dict[str, str]) -> None:
    n = 4
    nsqd = server["nsqd TCP"]
    with blocking.Producer(nsqd_tcp_addresses=[nsqd]) as producer:
        producer.publish_many("threads", [b"%d" % i for i in range(2 * n)])
    lock = threading.Lock()
    running = peak = done = 0
    all_running = threading.Event()
    with blocking.Consumer("threads", "c", nsqd_tcp_addresses=[nsqd]) as consumer:

        def handler(message: blocking.Message) -> None:
            nonlocal running, peak, done
            with lock:
                running += 1
                peak = max(peak, running)
                if running == n:
                    all_running.set()
            all_running.wait(2)
            with lock:
                running -= 1
                done += 1
                if done == 2 * n:
                    threading.Thread(target=consumer.stop).start()

        consumer.run(handler, threads=n)
        assert consumer.stats()["max_in_flight"] == n
    assert peak == n
