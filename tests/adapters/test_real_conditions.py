"""What users meet in their first week, on every adapter against the emulator on loopback:
handlers that await, many at once; redelivered messages; failures that retrying cannot heal."""

from __future__ import annotations

import re
import ssl
import time
from contextlib import suppress
from types import ModuleType
from typing import Any

import anyio
import anyio.abc
import pytest
import trustme

from nsq_emulator import Authorization, AuthState, static_authorizer
from nsq_emulator.loopback import serve_emulator
from nsq_proto.wire import encode_frame
from tests.support.net import free_port

pytestmark = pytest.mark.anyio

TIMEOUT = 15


async def test_run_runs_n_awaiting_handlers_at_once_and_returns_on_stop(lib: ModuleType) -> None:
    n_messages, concurrency = 200, 20
    async with serve_emulator(lookupd=False) as cluster:
        addresses = cluster.nsqd_tcp_addresses
        async with lib.Producer(nsqd_tcp_addresses=addresses) as producer:
            await producer.publish_many("t", [b"%d" % i for i in range(n_messages)])
        running = peak = done = 0

        async def handler(message: Any) -> None:
            nonlocal running, peak, done
            running += 1
            peak = max(peak, running)
            try:
                await anyio.sleep(0.05)
            finally:
                running -= 1
            done += 1

        async with lib.Consumer(
            "t", "c", nsqd_tcp_addresses=addresses, max_in_flight=n_messages
        ) as consumer:
            returned_after: float | None = None
            with anyio.fail_after(TIMEOUT):
                async with anyio.create_task_group() as tg:

                    async def run() -> None:
                        nonlocal returned_after
                        await consumer.run(handler, concurrency=concurrency)
                        returned_after = time.monotonic()

                    tg.start_soon(run)
                    while done < n_messages:
                        await anyio.sleep(0.01)
                    stop_at = time.monotonic()
                    await consumer.stop()
            assert returned_after is not None
            assert returned_after - stop_at < 2.0
        assert peak == concurrency
        stats = cluster.nsqds[0].channel_stats("t", "c")
        assert (stats.depth, stats.in_flight_count, stats.message_count) == (0, 0, n_messages)


async def test_run_returns_when_stopped_while_idle(lib: ModuleType) -> None:
    async with serve_emulator(lookupd=False) as cluster:
        addresses = cluster.nsqd_tcp_addresses

        async def handler(message: Any) -> None:
            raise AssertionError("no message was published")

        async with lib.Consumer("t", "c", nsqd_tcp_addresses=addresses) as consumer:
            with anyio.fail_after(5):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(consumer.run, handler, 10)
                    await anyio.sleep(0.2)
                    await consumer.stop()


async def test_a_handler_slower_than_msg_timeout_sees_a_redelivery_and_nothing_breaks(
    lib: ModuleType,
) -> None:
    # nsqd times the first delivery out and delivers the message again while the first
    # handler still runs: both copies get answered; neither answer may raise or drop the link
    async with serve_emulator(lookupd=False) as cluster:
        addresses = cluster.nsqd_tcp_addresses
        async with lib.Producer(nsqd_tcp_addresses=addresses) as producer:
            await producer.publish_many("t", [b"a", b"b", b"c"])
        seen: list[tuple[bytes, int]] = []

        async def handler(message: Any) -> None:
            seen.append((message.body, message.attempts))
            if message.attempts == 1:
                # past msg_timeout: held until nsqd has delivered the message again (a new
                # channel's timeouts fire from nsqd's first 5 s queue-scan refresh on)
                with anyio.fail_after(TIMEOUT):
                    while (message.body, 2) not in seen:
                        await anyio.sleep(0.05)
            if message.body == b"c" and message.attempts == 1:
                raise RuntimeError("the stale copy fails, the newer one succeeds")

        stats = cluster.nsqds[0].channel_stats
        async with lib.Consumer(
            "t",
            "c",
            nsqd_tcp_addresses=addresses,
            max_in_flight=10,
            msg_timeout=1.0,
            backoff=False,
        ) as consumer:
            with anyio.fail_after(TIMEOUT):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(consumer.run, handler, 10)
                    while len(seen) < 6 or stats("t", "c").in_flight_count:
                        await anyio.sleep(0.05)
                    await anyio.sleep(0.2)
                    tg.cancel_scope.cancel()
            assert [s["state"] for s in consumer.stats()["connections"]] == ["SUBSCRIBED"]
        assert sorted(seen) == [(b"a", 1), (b"a", 2), (b"b", 1), (b"b", 2), (b"c", 1), (b"c", 2)]
        final = stats("t", "c")
        assert (final.depth, final.in_flight_count, final.deferred_count) == (0, 0, 0)
        assert final.timeout_count == 3
        # nothing was requeued: the failing stale copy of c did not undo its newer delivery
        assert final.requeue_count == 0


def _tls_pair() -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A server context with a certificate for 127.0.0.1, and a client context that trusts it."""
    ca = trustme.CA()
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_ctx)
    client_ctx = ssl.create_default_context()
    ca.configure_trust(client_ctx)
    return server_ctx, client_ctx


async def test_an_untrusted_certificate_fails_publishes_at_once_with_the_cause(
    lib: ModuleType,
) -> None:
    server_ctx, _ = _tls_pair()
    async with serve_emulator(lookupd=False, tls_context=server_ctx) as cluster:
        async with lib.Producer(
            nsqd_tcp_addresses=cluster.nsqd_tcp_addresses,
            tls=ssl.create_default_context(),  # the system CAs: the test CA is not among them
        ) as producer:
            for _ in range(2):  # the pending publish, then a new one
                started = time.monotonic()
                with pytest.raises(lib.TransportError) as info:
                    await producer.publish("t", b"x")
                assert time.monotonic() - started < 3.0  # not the 30 s publish_timeout
                assert "CERTIFICATE_VERIFY_FAILED" in str(info.value)
                assert isinstance(info.value.__cause__, ssl.SSLError) or isinstance(
                    info.value.__cause__.__cause__, ssl.SSLError
                )
        with pytest.raises(KeyError):
            cluster.nsqds[0].topic_stats("t")  # nothing was published


async def test_tls_required_but_not_configured_fails_at_once(lib: ModuleType) -> None:
    server_ctx, _ = _tls_pair()
    async with serve_emulator(
        lookupd=False, tls_context=server_ctx, nsqd_options={"tls_required": True}
    ) as cluster:
        async with lib.Producer(nsqd_tcp_addresses=cluster.nsqd_tcp_addresses) as producer:
            for _ in range(2):
                started = time.monotonic()
                with pytest.raises(lib.ServerError) as info:
                    await producer.publish("t", b"x")
                assert time.monotonic() - started < 3.0
                assert info.value.code == "E_INVALID" and "TLS required" in str(info.value)


async def test_a_wrong_auth_secret_fails_at_once_and_is_never_logged(
    lib: ModuleType, caplog: pytest.LogCaptureFixture
) -> None:
    authorizer = static_authorizer(
        {"good": AuthState(identity="u", authorizations=(Authorization(topic=".*"),))}
    )
    async with serve_emulator(lookupd=False, nsqd_options={"auth": authorizer}) as cluster:
        addresses = cluster.nsqd_tcp_addresses
        async with lib.Producer(nsqd_tcp_addresses=addresses, auth_secret="hunter2") as p:
            for _ in range(2):
                started = time.monotonic()
                with pytest.raises(lib.ServerError) as info:
                    await p.publish("t", b"x")
                assert time.monotonic() - started < 3.0
                assert info.value.code == "E_AUTH_FAILED"
        async with lib.Consumer(
            "t", "c", nsqd_tcp_addresses=addresses, auth_secret="hunter2", reconnect_delay=0.1
        ) as consumer:
            with anyio.fail_after(5):
                while consumer.stats()["last_error"] is None:
                    await anyio.sleep(0.05)
            assert "E_AUTH_FAILED" in consumer.stats()["last_error"]
    assert "hunter2" not in caplog.text


async def test_a_consumer_reports_a_tls_failure_and_keeps_retrying(lib: ModuleType) -> None:
    server_ctx, _ = _tls_pair()
    async with serve_emulator(lookupd=False, tls_context=server_ctx) as cluster:
        async with lib.Consumer(
            "t",
            "c",
            nsqd_tcp_addresses=cluster.nsqd_tcp_addresses,
            tls=ssl.create_default_context(),
            reconnect_delay=0.1,
            reconnect_jitter=0.0,
        ) as consumer:
            with anyio.fail_after(5):
                while len(consumer.connection_errors) < 3:
                    await anyio.sleep(0.05)
            assert "CERTIFICATE_VERIFY_FAILED" in consumer.stats()["last_error"]
            assert all(isinstance(e, lib.NSQError) for e in consumer.connection_errors)


@pytest.mark.parametrize(
    "answer",
    [
        b"[" * 100_000,
        b'{"max_rdy_count": "many", "version": "1.3.0"}',
        b'{"deflate": true, "deflate_level": [6]}',
        b'{"max_msg_timeout": 1' + b"0" * 400 + b"}",
        b"\xff\xfe{",
    ],
    ids=["deep", "rdy-type", "level-type", "huge", "garbage"],
)
async def test_a_hostile_handshake_fails_its_connection_only(
    lib: ModuleType, answer: bytes
) -> None:
    async def hostile(client: Any) -> None:
        async with client:
            with anyio.move_on_after(5), suppress(anyio.EndOfStream, anyio.BrokenResourceError):
                await client.receive()  # magic and IDENTIFY
                await client.send(encode_frame(0, answer))
                while await client.receive():
                    pass

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with listener, anyio.create_task_group() as server_tg:
        server_tg.start_soon(listener.serve, hostile)
        async with serve_emulator(lookupd=False) as cluster:
            good = cluster.nsqd_tcp_addresses[0]
            async with lib.Producer(nsqd_tcp_addresses=[good]) as producer:
                await producer.publish("t", b"fine")
            async with lib.Consumer(
                "t",
                "c",
                nsqd_tcp_addresses=[f"127.0.0.1:{port}", good],
                deflate=True,
                reconnect_delay=0.2,
            ) as consumer:
                with anyio.fail_after(TIMEOUT):
                    async for message in consumer:
                        await message.finish()
                        break
                    while not consumer.connection_errors:
                        await anyio.sleep(0.05)
                assert message.body == b"fine"
                assert all(
                    isinstance(e, lib.RemoteProtocolError) for e in consumer.connection_errors
                )
        server_tg.cancel_scope.cancel()


async def test_a_publish_to_an_nsqd_that_stopped_answering_times_out_on_time(
    lib: ModuleType,
) -> None:
    async def silent_after_the_handshake(client: Any) -> None:
        # a frozen nsqd: the handshake is answered, then nothing (SIGSTOP)
        async with client:
            with suppress(anyio.EndOfStream, anyio.BrokenResourceError):
                await client.receive()  # magic and IDENTIFY
                await client.send(encode_frame(0, b'{"max_rdy_count":2500,"version":"1.3.0"}'))
                while await client.receive():
                    pass

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with listener, anyio.create_task_group() as server_tg:
        server_tg.start_soon(listener.serve, silent_after_the_handshake)
        async with lib.Producer(
            nsqd_tcp_addresses=[f"127.0.0.1:{port}"], publish_timeout=0.5, max_publish_attempts=1
        ) as producer:
            with pytest.raises(lib.PublishTimeout):
                await producer.publish("t", b"first")  # connects: the pump had no deadline
            # the connection is up and idle, its pump asleep until a far deadline (the read
            # timeout); a new publish's own, nearer deadline is still kept
            started = anyio.current_time()
            with anyio.fail_after(5), pytest.raises(lib.PublishTimeout):
                await producer.publish("t", b"second")
            assert 0.4 <= anyio.current_time() - started < 1.5
        server_tg.cancel_scope.cancel()


async def test_a_connection_that_never_opened_is_not_logged_as_lost(
    lib: ModuleType, caplog: pytest.LogCaptureFixture
) -> None:
    """Nothing listens at the address: the consumer says it could not connect (and tries
    again), not that a connection closed or was lost."""
    address = f"127.0.0.1:{free_port()}"
    async with lib.Consumer("t", "c", nsqd_tcp_addresses=[address], reconnect_delay=0.1) as c:
        with anyio.fail_after(5):
            while c.stats()["last_error"] is None:
                await anyio.sleep(0.02)
    said = f"connecting to {address} failed: connection refused"
    assert c.stats()["last_error"] == said
    lines = [
        r.getMessage()
        for r in caplog.records
        if r.name == "nsq.consumer" and address in r.getMessage()
    ]
    assert lines, caplog.text
    for line in lines:
        assert re.fullmatch(rf"connection \d+: {re.escape(said)}", line), line
