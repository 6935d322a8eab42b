"""End-to-end scenarios: the public API over real loopback TCP against the emulator, on every
anyio backend and with nsq_trio."""

from __future__ import annotations

import ssl
from types import ModuleType
from typing import Any

import anyio
import pytest
import trustme

from nsq_client import Message
from nsq_emulator import Authorization, AuthState, static_authorizer
from nsq_emulator.loopback import serve_emulator
from nsq_proto import ConfigError, LocalProtocolError

pytestmark = pytest.mark.anyio

TIMEOUT = 15


async def consume(consumer: Any, n: int) -> list[Any]:
    got = []
    with anyio.fail_after(TIMEOUT):
        async for message in consumer:
            got.append(message)
            await message.finish()
            if len(got) == n:
                break
    return got


async def test_pub_mpub_dpub_round_trip(lib: ModuleType) -> None:
    async with serve_emulator(lookupd=False) as cluster:
        addresses = cluster.nsqd_tcp_addresses
        async with lib.Producer(nsqd_tcp_addresses=addresses) as producer:
            assert await producer.publish("t", b"one") is None
            await producer.publish_many("t", [b"two", b"three"])
            await producer.publish("t", b"later", delay=0.2)
        async with lib.Consumer("t", "c", nsqd_tcp_addresses=addresses, max_in_flight=5) as c:
            got = await consume(c, 4)
        assert sorted(m.body for m in got) == [b"later", b"one", b"three", b"two"]
        assert all(m.attempts == 1 and m.nsqd_address == addresses[0] for m in got)
        stats = cluster.nsqds[0].channel_stats("t", "c")
        assert (stats.depth, stats.in_flight_count, stats.deferred_count) == (0, 0, 0)


async def test_lookupd_discovers_every_nsqd_and_max_in_flight_holds(lib: ModuleType) -> None:
    async with serve_emulator(nsqd_count=3) as cluster:
        for address in cluster.nsqd_tcp_addresses:
            async with lib.Producer(nsqd_tcp_addresses=[address]) as producer:
                await producer.publish_many("t", [address.encode()] * 20)
        async with lib.Consumer(
            "t", "c", lookupd_http_addresses=cluster.lookupd_http_addresses, max_in_flight=6
        ) as consumer:
            got = []
            with anyio.fail_after(TIMEOUT):
                async for message in consumer:
                    got.append(message)
                    # the server's view: RDY over every connection never exceeds max_in_flight
                    ready = sum(
                        s.ready_count
                        for n in cluster.nsqds
                        for s in n.client_stats()
                        if not s.closed
                    )
                    assert ready <= 6
                    await message.finish()
                    if len(got) == 60:
                        break
        assert {m.body.decode() for m in got} == set(cluster.nsqd_tcp_addresses)


async def test_handler_style_backoff_and_give_up(lib: ModuleType) -> None:
    given_up: list[Any] = []
    async with serve_emulator(lookupd=False) as cluster:
        addresses = cluster.nsqd_tcp_addresses
        async with lib.Producer(nsqd_tcp_addresses=addresses) as producer:
            await producer.publish("t", b"poison")
        attempts: list[int] = []

        async def handler(message: Any) -> None:
            attempts.append(message.attempts)
            raise RuntimeError("always fails")

        async with lib.Consumer(
            "t",
            "c",
            nsqd_tcp_addresses=addresses,
            max_attempts=3,
            default_requeue_delay=0.0,
            backoff_multiplier=0.05,
            on_give_up=given_up.append,
        ) as consumer:
            with anyio.move_on_after(TIMEOUT):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(consumer.run, handler, 2)
                    while not given_up:
                        await anyio.sleep(0.05)
                    assert consumer.stats()["backoff_level"] >= 1 or attempts == [1, 2, 3]
                    tg.cancel_scope.cancel()
        assert attempts == [1, 2, 3]
        assert [m.attempts for m in given_up] == [4]
        stats = cluster.nsqds[0].channel_stats("t", "c")
        assert stats.depth == 0 and stats.in_flight_count == 0  # FINished on give-up


@pytest.mark.parametrize("compression", ["snappy", "deflate"])
async def test_compression(lib: ModuleType, compression: str) -> None:
    async with serve_emulator(lookupd=False) as cluster:
        options: dict[str, Any] = {compression: True}
        addresses = cluster.nsqd_tcp_addresses
        async with lib.Producer(nsqd_tcp_addresses=addresses, **options) as producer:
            await producer.publish_many("t", [b"abc" * 100, b"x"])
        async with lib.Consumer("t", "c", nsqd_tcp_addresses=addresses, **options) as c:
            got = await consume(c, 2)
        assert sorted(m.body for m in got) == [b"abc" * 100, b"x"]


async def test_tls_with_verification(lib: ModuleType) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(server_ctx)
    client_ctx = ssl.create_default_context()
    ca.configure_trust(client_ctx)
    async with serve_emulator(lookupd=False, tls_context=server_ctx) as cluster:
        addresses = cluster.nsqd_tcp_addresses
        async with lib.Producer(
            nsqd_tcp_addresses=addresses, tls=client_ctx, snappy=True
        ) as producer:
            await producer.publish("t", b"secret")
        async with lib.Consumer("t", "c", nsqd_tcp_addresses=addresses, tls=client_ctx) as consumer:
            (message,) = await consume(consumer, 1)
        assert message.body == b"secret"


async def test_tls_verification_failure_is_typed(lib: ModuleType) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(server_ctx)
    async with serve_emulator(lookupd=False, tls_context=server_ctx) as cluster:
        async with lib.Producer(
            nsqd_tcp_addresses=cluster.nsqd_tcp_addresses,
            tls=ssl.create_default_context(),  # does not trust the test CA
            publish_timeout=2.0,
            max_publish_attempts=1,
        ) as producer:
            with pytest.raises(lib.NSQError):
                await producer.publish("t", b"x")


async def test_auth(lib: ModuleType) -> None:
    authorizer = static_authorizer(
        {"good": AuthState(identity="u", authorizations=(Authorization(topic="^t$"),))}
    )
    async with serve_emulator(lookupd=False, nsqd_options={"auth": authorizer}) as cluster:
        addresses = cluster.nsqd_tcp_addresses
        async with lib.Producer(nsqd_tcp_addresses=addresses, auth_secret="good") as p:
            await p.publish("t", b"allowed")
            with pytest.raises(lib.ServerError) as info:
                await p.publish("forbidden", b"x")
            assert info.value.code == "E_UNAUTHORIZED"
        async with lib.Consumer(
            "t", "c", nsqd_tcp_addresses=addresses, auth_secret=b"good"
        ) as consumer:
            (message,) = await consume(consumer, 1)
        assert message.body == b"allowed"


async def test_heartbeats_keep_the_connection_alive(lib: ModuleType) -> None:
    async with serve_emulator(lookupd=False) as cluster:
        addresses = cluster.nsqd_tcp_addresses
        async with lib.Consumer(
            "t", "c", nsqd_tcp_addresses=addresses, heartbeat_interval=1.0
        ) as consumer:
            await anyio.sleep(3.5)  # several heartbeats; nsqd drops a silent client after 2
            (client,) = [s for s in cluster.nsqds[0].client_stats() if not s.closed]
            async with lib.Producer(nsqd_tcp_addresses=addresses) as producer:
                await producer.publish("t", b"still here")
            (message,) = await consume(consumer, 1)
            assert message.body == b"still here"
            assert next(s.id for s in cluster.nsqds[0].client_stats() if not s.closed) == client.id


async def test_nsqd_restart_consumer_reconnects_and_producer_fails_over(lib: ModuleType) -> None:
    async with serve_emulator(nsqd_count=2, lookupd=False) as cluster:
        first, second = cluster.nsqd_tcp_addresses
        async with lib.Producer(
            nsqd_tcp_addresses=[first, second], reconnect_delay=0.1, publish_timeout=10.0
        ) as producer:
            async with lib.Producer(nsqd_tcp_addresses=[first]) as direct:
                await direct.publish("t", b"before")
            async with lib.Consumer(
                "t", "c", nsqd_tcp_addresses=[first], reconnect_delay=0.2, reconnect_jitter=0.0
            ) as consumer:
                (m,) = await consume(consumer, 1)
                assert m.body == b"before"
                with anyio.fail_after(TIMEOUT):  # the FIN has reached nsqd
                    while cluster.nsqds[0].channel_stats("t", "c").in_flight_count:
                        await anyio.sleep(0.01)
                cluster.nsqds[0].stop(cluster.now())
                cluster.kick()
                # the producer fails over to the other nsqd while the first is down
                for _ in range(5):
                    await producer.publish("t", b"during")
                assert cluster.nsqds[1].topic_stats("t").message_count >= 5
                cluster.nsqds[0].start(cluster.now())
                with anyio.fail_after(TIMEOUT):
                    while not [
                        s
                        for s in cluster.nsqds[0].client_stats()
                        if not s.closed and s.subscription
                    ]:
                        await anyio.sleep(0.05)
                async with lib.Producer(nsqd_tcp_addresses=[first]) as direct:
                    await direct.publish("t", b"after")
                (m,) = await consume(consumer, 1)
                assert m.body == b"after"


async def test_answers_are_confirmed_by_a_graceful_stop_and_not_when_a_connection_is_lost(
    lib: ModuleType,
) -> None:
    async with serve_emulator(lookupd=False) as cluster:
        addresses = cluster.nsqd_tcp_addresses[:1]
        async with lib.Producer(nsqd_tcp_addresses=addresses) as producer:
            await producer.publish_many("t", [b"a", b"b", b"c"])
        async with lib.Consumer("t", "c", nsqd_tcp_addresses=addresses) as consumer:
            await consume(consumer, 3)
            assert consumer.answers_confirmed is False  # not stopped yet
        assert consumer.answers_confirmed is True
        stats = cluster.nsqds[0].channel_stats("t", "c")
        assert (stats.depth, stats.in_flight_count) == (0, 0)
        # the connection lost after a FIN was written: nsqd may not have processed it
        async with lib.Producer(nsqd_tcp_addresses=addresses) as producer:
            await producer.publish("t", b"d")
        async with lib.Consumer(
            "t", "c", nsqd_tcp_addresses=addresses, reconnect_delay=60.0, stop_timeout=1.0
        ) as consumer:
            await consume(consumer, 1)
            cluster.nsqds[0].stop(cluster.now())
            cluster.kick()
            with anyio.fail_after(TIMEOUT):
                while consumer.stats()["connections"]:  # gone, until it reconnects
                    await anyio.sleep(0.01)
        assert consumer.answers_confirmed is False


async def test_graceful_stop_loses_nothing(lib: ModuleType) -> None:
    async with serve_emulator(lookupd=False) as cluster:
        addresses = cluster.nsqd_tcp_addresses
        bodies = [b"%d" % i for i in range(50)]
        async with lib.Producer(nsqd_tcp_addresses=addresses) as producer:
            await producer.publish_many("t", bodies)
        finished: list[bytes] = []
        async with lib.Consumer(
            "t", "c", nsqd_tcp_addresses=addresses, max_in_flight=20, stop_timeout=1.0
        ) as consumer:
            held: list[Message] = []
            with anyio.fail_after(TIMEOUT):
                async for message in consumer:
                    if len(held) < 5:
                        held.append(message)  # never answered: must come back
                        continue
                    await message.finish()
                    finished.append(message.body)
                    if len(finished) == 10:
                        break
        with anyio.fail_after(TIMEOUT):  # the last REQs travel to the server
            while cluster.nsqds[0].channel_stats("t", "c").in_flight_count:
                await anyio.sleep(0.01)
        assert cluster.nsqds[0].channel_stats("t", "c").depth == len(bodies) - len(finished)
        # a second consumer gets exactly the rest
        async with lib.Consumer("t", "c", nsqd_tcp_addresses=addresses, max_in_flight=50) as c:
            rest = await consume(c, len(bodies) - len(finished))
        assert sorted(finished + [m.body for m in rest]) == sorted(bodies)


async def test_cancelling_the_scope_requeues_unanswered_messages(lib: ModuleType) -> None:
    async with serve_emulator(lookupd=False) as cluster:
        addresses = cluster.nsqd_tcp_addresses
        async with lib.Producer(nsqd_tcp_addresses=addresses) as producer:
            await producer.publish_many("t", [b"a", b"b", b"c"])
        with anyio.move_on_after(1.0):
            async with lib.Consumer(
                "t", "c", nsqd_tcp_addresses=addresses, max_in_flight=3
            ) as consumer:
                async for _message in consumer:
                    await anyio.sleep_forever()  # cancelled while holding a message
        with anyio.fail_after(TIMEOUT):  # the REQs travel to the server
            while cluster.nsqds[0].channel_stats("t", "c").in_flight_count:
                await anyio.sleep(0.01)
        stats = cluster.nsqds[0].channel_stats("t", "c")
        assert stats.depth == 3
        assert stats.requeue_count >= 1


async def test_unreachable_nsqd_fails_publish_with_a_typed_error(lib: ModuleType) -> None:
    async with serve_emulator(lookupd=False) as cluster:
        address = cluster.nsqd_tcp_addresses[0]
        cluster.nsqds[0].stop(cluster.now())
        async with lib.Producer(nsqd_tcp_addresses=[address], publish_timeout=0.5) as producer:
            with pytest.raises(lib.NSQError):
                await producer.publish("t", b"x")


async def test_errors_in_the_body_come_out_unwrapped(lib: ModuleType) -> None:
    async with serve_emulator(lookupd=False) as cluster:
        with pytest.raises(lib.ServerError) as info:
            async with lib.Producer(nsqd_tcp_addresses=cluster.nsqd_tcp_addresses) as producer:
                await producer.publish_many("t", [b"x" * 2_000_000])  # over max_msg_size
        assert info.value.code == "E_BAD_MESSAGE"
        with pytest.raises(KeyError):
            async with lib.Consumer("t", "c", nsqd_tcp_addresses=cluster.nsqd_tcp_addresses):
                raise KeyError("mine")


async def test_an_answer_given_right_before_cancellation_is_not_lost(lib: ModuleType) -> None:
    async with serve_emulator(lookupd=False) as cluster:
        addresses = cluster.nsqd_tcp_addresses
        async with lib.Producer(nsqd_tcp_addresses=addresses) as producer:
            await producer.publish_many("t", [b"a", b"b", b"c"])
        with anyio.CancelScope() as scope:
            async with lib.Consumer(
                "t", "c", nsqd_tcp_addresses=addresses, max_in_flight=3, msg_timeout=1.0
            ) as consumer:
                async for message in consumer:
                    await message.finish()  # queued, not yet written ...
                    scope.cancel()  # ... when everything is cancelled
                    await anyio.sleep(1)
        with anyio.fail_after(TIMEOUT):
            while cluster.nsqds[0].channel_stats("t", "c").in_flight_count:
                await anyio.sleep(0.01)
        stats = cluster.nsqds[0].channel_stats("t", "c")
        # one finished; the others requeued (or, if still on the wire, timed out after 1 s)
        assert stats.depth == 2


async def test_touch_many_keeps_held_messages_past_msg_timeout(lib: ModuleType) -> None:
    async with serve_emulator(lookupd=False) as cluster:
        addresses = cluster.nsqd_tcp_addresses
        async with lib.Producer(nsqd_tcp_addresses=addresses) as producer:
            await producer.publish_many("t", [b"%d" % i for i in range(20)])
        async with lib.Consumer(
            "t", "c", nsqd_tcp_addresses=addresses, max_in_flight=20, msg_timeout=1.0
        ) as c:
            got: list[Any] = []
            with anyio.fail_after(TIMEOUT):
                while len(got) < 20:
                    got.extend(await c.get_many(20))
            for _ in range(5):  # 2.5 s held, over twice msg_timeout
                await anyio.sleep(0.5)
                await c.touch_many(got)
            stats = cluster.nsqds[0].channel_stats("t", "c")
            assert (stats.in_flight_count, stats.timeout_count) == (20, 0)
            await got[0].finish()
            with pytest.raises(LocalProtocolError, match="already been answered"):
                await c.touch_many(got)
            async with lib.Consumer("t", "other", nsqd_tcp_addresses=addresses) as other:
                with pytest.raises(LocalProtocolError, match="another consumer"):
                    await other.touch_many(got[1:])
            await c.finish_many(got[1:])
            with anyio.fail_after(TIMEOUT):
                while (s := cluster.nsqds[0].channel_stats("t", "c")).in_flight_count:
                    await anyio.sleep(0.01)
            assert (s.depth, s.timeout_count, s.requeue_count) == (0, 0, 0)


async def test_get_many_and_finish_many(lib: ModuleType) -> None:
    async with serve_emulator(lookupd=False) as cluster:
        addresses = cluster.nsqd_tcp_addresses
        async with lib.Producer(nsqd_tcp_addresses=addresses) as producer:
            await producer.publish_many("t", [b"%d" % i for i in range(30)])
        async with lib.Consumer("t", "c", nsqd_tcp_addresses=addresses, max_in_flight=30) as c:
            got: list[Any] = []
            with anyio.fail_after(TIMEOUT):
                while len(got) < 30:
                    batch = await c.get_many(7)
                    assert 1 <= len(batch) <= 7
                    got.extend(batch)
            assert sorted(m.body for m in got) == sorted(b"%d" % i for i in range(30))
            with pytest.raises(ConfigError):
                await c.get_many(0)
            await got[0].finish()
            # one message answered already: nothing is sent, nothing is marked
            with pytest.raises(LocalProtocolError, match="already been answered"):
                await c.finish_many(got)
            assert not any(m.has_responded for m in got[1:])
            async with lib.Consumer("t", "other", nsqd_tcp_addresses=addresses) as other:
                with pytest.raises(LocalProtocolError, match="another consumer"):
                    await other.finish_many(got[1:])
            # one message given twice, after others: none is marked
            with pytest.raises(LocalProtocolError, match="already been answered"):
                await c.finish_many([*got[1:4], got[2]])
            assert not any(m.has_responded for m in got[1:])
            await c.finish_many(got[1:])
            assert all(m.has_responded for m in got)
            with anyio.fail_after(TIMEOUT):
                while (s := cluster.nsqds[0].channel_stats("t", "c")).in_flight_count:
                    await anyio.sleep(0.01)
            assert (s.depth, s.message_count, s.requeue_count) == (0, 30, 0)
        # a stopped consumer gives an empty list
        assert await c.get_many(5) == []


async def test_leaving_the_producer_waits_for_the_publishes_of_other_tasks(lib: ModuleType) -> None:
    """Leaving ``async with`` waits until every publish in flight is answered; a publisher
    cancelled meanwhile holds nothing up."""
    async with serve_emulator(lookupd=False) as cluster:
        answered: list[int] = []

        async def one(producer: Any, i: int) -> None:
            await producer.publish("t", b"%d" % i)
            answered.append(i)

        with anyio.fail_after(TIMEOUT):
            async with anyio.create_task_group() as tg:
                async with lib.Producer(nsqd_tcp_addresses=cluster.nsqd_tcp_addresses) as p:
                    await p.publish("t", b"connected")
                    cluster.nsqds[0].delay_output(0.3)
                    doomed = anyio.CancelScope()

                    async def cancelled() -> None:
                        with doomed:
                            await p.publish("t", b"cancelled")

                    tg.start_soon(cancelled)
                    for i in range(4):
                        tg.start_soon(one, p, i)
                    await anyio.sleep(0.05)
                    doomed.cancel()
                assert sorted(answered) == [0, 1, 2, 3]
