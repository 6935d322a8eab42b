"""The public API against a real nsqd/nsqlookupd.  Runs when ``NSQD`` and ``NSQLOOKUPD`` point
at the binaries (or they are on PATH); skipped otherwise, with the reason."""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import anyio
import pytest

from nsq_client import Message
from tests.support.backends import anyio_backend, lib, way
from tests.support.net import start_server
from tests.support.servers import MISSING, NSQD, NSQLOOKUPD, Lookupd, Nsqd, auth_server

__all__ = ["anyio_backend", "lib", "way"]

pytestmark = [
    pytest.mark.real_nsqd,
    pytest.mark.skipif(not (NSQD and NSQLOOKUPD), reason=MISSING),
]


@dataclass
class Servers:
    nsqd_tcp: str
    nsqd_http: str
    lookupd_http: str

    def stats(self, topic: str) -> dict[str, Any]:
        url = f"http://{self.nsqd_http}/stats?format=json&topic={topic}"
        with urllib.request.urlopen(url, timeout=5) as response:
            data: dict[str, Any] = json.load(response)
        return data


@pytest.fixture(scope="module")
def servers() -> Iterator[Servers]:
    assert NSQD and NSQLOOKUPD
    lookupd = Lookupd()
    nsqd = Nsqd(lookupd=lookupd, durable=False)
    try:
        lookupd.start()
        nsqd.start()
        yield Servers(nsqd.tcp_address, f"127.0.0.1:{nsqd.http}", lookupd.http_address)
    finally:
        nsqd.cleanup()
        lookupd.stop()


async def consume(consumer: Any, n: int) -> list[Any]:
    got = []
    with anyio.fail_after(20):
        async for message in consumer:
            got.append(message)
            await message.finish()
            if len(got) == n:
                break
    return got


@pytest.mark.anyio
@pytest.mark.parametrize("compression", [None, "snappy", "deflate"])
async def test_round_trip_via_lookupd(
    servers: Servers, lib: ModuleType, way: tuple[str, str], compression: str | None
) -> None:
    topic = f"rt_{way[0]}_{way[1]}_{compression}"
    options: dict[str, Any] = {compression: True} if compression else {}
    async with lib.Producer(nsqd_tcp_addresses=[servers.nsqd_tcp], **options) as producer:
        await producer.publish(topic, b"one")
        await producer.publish_many(topic, [b"two", b"three"])
        await producer.publish(topic, b"deferred", delay=0.3)
    async with lib.Consumer(
        topic, "c", lookupd_http_addresses=[servers.lookupd_http], max_in_flight=10, **options
    ) as consumer:
        got = await consume(consumer, 4)
    assert sorted(m.body for m in got) == [b"deferred", b"one", b"three", b"two"]


@pytest.mark.anyio
async def test_graceful_stop_loses_nothing(
    servers: Servers, lib: ModuleType, way: tuple[str, str]
) -> None:
    topic = f"stop_{way[0]}_{way[1]}"
    bodies = [b"%d" % i for i in range(40)]
    async with lib.Producer(nsqd_tcp_addresses=[servers.nsqd_tcp]) as producer:
        await producer.publish_many(topic, bodies)
    finished: list[bytes] = []
    async with lib.Consumer(
        topic, "c", nsqd_tcp_addresses=[servers.nsqd_tcp], max_in_flight=10, stop_timeout=1.0
    ) as consumer:
        held: list[Message] = []
        with anyio.fail_after(20):
            async for message in consumer:
                if len(held) < 3:
                    held.append(message)
                    continue
                await message.finish()
                finished.append(message.body)
                if len(finished) == 10:
                    break
    async with lib.Consumer(
        topic, "c", nsqd_tcp_addresses=[servers.nsqd_tcp], max_in_flight=50
    ) as consumer:
        rest = await consume(consumer, len(bodies) - len(finished))
    assert sorted(finished + [m.body for m in rest]) == sorted(bodies)


@pytest.mark.anyio
async def test_a_consumer_started_before_its_topic_gets_the_first_message_within_seconds(
    servers: Servers, lib: ModuleType, way: tuple[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    """lookupd answers TOPIC_NOT_FOUND until nsqd has the topic: the consumer asks again soon
    (not at the next 60 s poll), and says once, at INFO, that the topic does not exist yet."""
    topic = f"later_{way[0]}_{way[1]}_{time.monotonic_ns()}"
    got: list[float] = []

    async def handler(message: Any) -> None:
        got.append(time.monotonic())

    caplog.set_level(logging.INFO, logger="nsq")
    async with lib.Consumer(topic, "c", lookupd_http_addresses=[servers.lookupd_http]) as consumer:
        async with anyio.create_task_group() as tg:
            tg.start_soon(consumer.run, handler)
            await anyio.sleep(2.5)  # several lookups find nothing meanwhile
            async with lib.Producer(nsqd_tcp_addresses=[servers.nsqd_tcp]) as producer:
                await producer.publish(topic, b"first")
            published = time.monotonic()
            with anyio.fail_after(30):
                while not got:
                    await anyio.sleep(0.05)
            tg.cancel_scope.cancel()
    said = [r.getMessage() for r in caplog.records if "does not exist yet" in r.getMessage()]
    assert len(said) == 1 and topic in said[0]
    assert got[0] - published < 10.0  # the next 60 s poll would be 57+ s away


@pytest.mark.anyio
async def test_bad_topic_is_a_typed_error(servers: Servers, lib: ModuleType) -> None:
    async with lib.Producer(nsqd_tcp_addresses=[servers.nsqd_tcp]) as producer:
        with pytest.raises(lib.ServerError) as info:
            await producer.publish_many("t", [b"x" * (1024 * 1024 + 1)])
    assert info.value.code == "E_BAD_MESSAGE"


@pytest.mark.anyio
async def test_many_concurrent_single_publishes_and_one_bad_body(
    servers: Servers, lib: ModuleType, way: tuple[str, str]
) -> None:
    """200 tasks publish at once through one producer, as a service does: the waiting ones go
    out together, and the one body over nsqd's --max-msg-size (1 MiB) fails alone."""
    topic = f"many_{way[0]}_{way[1]}_{time.monotonic_ns()}"
    bodies = [b"%d" % i for i in range(200)]
    bodies[123] = b"x" * (1024 * 1024 + 1)
    outcome: dict[int, object] = {}

    async def publish(producer: Any, i: int) -> None:
        try:
            await producer.publish(topic, bodies[i])
            outcome[i] = "ok"
        except lib.ServerError as exc:
            outcome[i] = exc.code

    async with lib.Producer(nsqd_tcp_addresses=[servers.nsqd_tcp]) as producer:
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                for i in range(len(bodies)):
                    tg.start_soon(publish, producer, i)
    assert outcome.pop(123) == "E_BAD_MESSAGE"
    assert set(outcome.values()) == {"ok"} and len(outcome) == 199
    (stats,) = servers.stats(topic)["topics"]
    assert stats["message_count"] == 199


def test_many_threads_publish_through_the_blocking_api(servers: Servers) -> None:
    """50 threads each publish 20 messages one at a time through one blocking producer; one
    body too large fails in its own thread alone."""
    import threading

    from nsq_anyio import ServerError
    from nsq_anyio.blocking import Producer

    topic = f"threads_{time.monotonic_ns()}"
    errors: list[str] = []
    done: list[int] = []

    def work(producer: Producer, n: int) -> None:
        for i in range(20):
            body = b"x" * (1024 * 1024 + 1) if (n, i) == (7, 3) else b"%d-%d" % (n, i)
            try:
                producer.publish(topic, body)
                done.append(n)
            except ServerError as exc:
                errors.append(exc.code)

    with Producer(nsqd_tcp_addresses=[servers.nsqd_tcp]) as producer:
        threads = [threading.Thread(target=work, args=(producer, n)) for n in range(50)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert not any(thread.is_alive() for thread in threads)
    assert errors == ["E_BAD_MESSAGE"]
    assert len(done) == 999
    (stats,) = servers.stats(topic)["topics"]
    assert stats["message_count"] == 999


@dataclass
class SecureServers:
    nsqd_tcp: str
    ca: Any


@pytest.fixture(scope="module")
def secure_servers() -> Iterator[SecureServers]:
    import trustme

    assert NSQD
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    tmp = tempfile.mkdtemp(prefix="nsqd-tls-")
    cert_path = os.path.join(tmp, "cert.pem")
    key_path = os.path.join(tmp, "key.pem")
    cert.cert_chain_pems[0].write_to_path(cert_path)
    cert.private_key_pem.write_to_path(key_path)

    auth = auth_server("^sec")
    proc, (tcp, _http) = start_server(
        lambda p: [
            NSQD,
            f"--tcp-address=127.0.0.1:{p[0]}",
            f"--http-address=127.0.0.1:{p[1]}",
            "--https-address=",
            f"--data-path={tmp}",
            f"--tls-cert={cert_path}",
            f"--tls-key={key_path}",
            f"--auth-http-address=127.0.0.1:{auth.server_address[1]}",
        ],
        2,
        lambda p: f"http://127.0.0.1:{p[1]}/ping",
    )
    try:
        yield SecureServers(f"127.0.0.1:{tcp}", ca)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        auth.shutdown()
        auth.server_close()
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.anyio
async def test_tls_snappy_and_auth(
    secure_servers: SecureServers, lib: ModuleType, way: tuple[str, str]
) -> None:
    import ssl

    context = ssl.create_default_context()
    secure_servers.ca.configure_trust(context)
    topic = f"sec_{way[0]}_{way[1]}"
    options: dict[str, Any] = {
        "nsqd_tcp_addresses": [secure_servers.nsqd_tcp],
        "tls": context,
        "snappy": True,
        "auth_secret": "good",
    }
    async with lib.Producer(**options) as producer:
        await producer.publish(topic, b"secret message")
        with pytest.raises(lib.ServerError) as info:
            await producer.publish("other", b"not allowed")
        assert info.value.code == "E_UNAUTHORIZED"
    async with lib.Consumer(topic, "c", **options) as consumer:
        (message,) = await consume(consumer, 1)
    assert message.body == b"secret message"
    async with lib.Producer(
        nsqd_tcp_addresses=[secure_servers.nsqd_tcp],
        tls=context,
        auth_secret="bad",
        publish_timeout=3.0,
        max_publish_attempts=1,
    ) as producer:
        with pytest.raises(lib.NSQError):
            await producer.publish(topic, b"x")


def test_spark_source_holds_max_in_flight_over_several_connections(servers: Servers) -> None:
    # nsqd's default --max-rdy-count (2500) per connection: the source opens more connections
    # to hold a batch of 6000, and everything is finished once committed
    pytest.importorskip("pyspark")
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from nsq_anyio.blocking import Producer
    from nsq_spark import SCHEMA, NSQInputPartition, NSQStreamReader
    from nsq_spark._options import parse_source_options

    def rows_in(parts: Sequence[object]) -> int:
        """The rows of a batch's partitions (each one the source's own, which has a length)."""
        rows = 0
        for part in parts:
            assert isinstance(part, NSQInputPartition), part
            rows += len(part)
        return rows

    topic = "spark_pool"
    with Producer(nsqd_tcp_addresses=[servers.nsqd_tcp]) as producer:
        for i in range(0, 6500, 500):
            producer.publish_many(topic, [b"%d" % n for n in range(i, i + 500)])
    options = {
        "topic": topic,
        "channel": "c",
        "nsqd_tcp_addresses": servers.nsqd_tcp,
        "max_in_flight": "6000",
        "read_mode": "driver",  # the driver-side reader's connection pool
    }
    reader = NSQStreamReader(parse_source_options(options), SCHEMA, handle_sigterm=False)
    try:
        start = reader.initialOffset()
        end = start
        deadline = time.monotonic() + 20
        while end["seq"] < 6000 and time.monotonic() < deadline:
            time.sleep(0.05)
            end = reader.latestOffset(start, ReadAllAvailable())
        assert end == {"seq": 6000}  # all it may hold, and not one more
        channel = servers.stats(topic)["topics"][0]["channels"][0]
        assert (channel["in_flight_count"], len(channel["clients"])) == (6000, 3)
        assert all(c["ready_count"] <= 2500 for c in channel["clients"])
        rows = rows_in(reader.partitions(start, end))
        end2 = end
        while end2["seq"] < 6500 and time.monotonic() < deadline:
            time.sleep(0.05)
            end2 = reader.latestOffset(end, ReadAllAvailable())
        rows += rows_in(reader.partitions(end, end2))
        reader.commit(end2)
        while time.monotonic() < deadline:
            channel = servers.stats(topic)["topics"][0]["channels"][0]
            if channel["in_flight_count"] == 0:
                break
            time.sleep(0.05)
    finally:
        reader.stop()
    assert rows == 6500
    assert (channel["depth"], channel["in_flight_count"], channel["requeue_count"]) == (0, 0, 0)
    assert channel["message_count"] == 6500
