"""Faults against real nsqd/nsqlookupd processes, on every adapter: kill -9, SIGSTOP/SIGCONT,
restarts, slow handlers, stops under load, TLS and AUTH misconfiguration, many idle
connections.  Runs when ``NSQD`` and ``NSQLOOKUPD`` point at the binaries; skipped otherwise,
with the reason.  The figures (recovery times, duplicates, memory) are printed at the end."""

from __future__ import annotations

import json
import os
import ssl
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import anyio
import anyio.to_thread
import pytest

from ._figures import report
from ._servers import MISSING, NSQD, NSQLOOKUPD, Lookupd, Nsqd

pytestmark = [
    pytest.mark.real_nsqd,
    pytest.mark.anyio,
    pytest.mark.skipif(not (NSQD and NSQLOOKUPD), reason=MISSING),
]

WAIT = 30.0


@pytest.fixture
def topic(way: tuple[str, str]) -> str:
    return f"f_{way[0]}_{way[1]}_{uuid.uuid4().hex[:8]}"


@pytest.fixture
def nsqd() -> Iterator[Nsqd]:
    server = Nsqd()
    server.start()
    yield server
    server.cleanup()


async def publish_all(lib: ModuleType, address: str, topic: str, bodies: list[bytes]) -> None:
    async with lib.Producer(nsqd_tcp_addresses=[address]) as producer:
        for i in range(0, len(bodies), 200):
            await producer.publish_many(topic, bodies[i : i + 200])


async def until(predicate: Any, timeout: float = WAIT, step: float = 0.02) -> float:
    """Wait for ``predicate()``; returns how long it took."""
    start = time.monotonic()
    with anyio.fail_after(timeout):
        while not predicate():
            await anyio.sleep(step)
    return time.monotonic() - start


async def test_kill9_mid_consume_direct(
    nsqd: Nsqd, lib: ModuleType, way: tuple[str, str], topic: str
) -> None:
    before = [b"a%d" % i for i in range(2000)]
    after = [b"b%d" % i for i in range(300)]
    await publish_all(lib, nsqd.tcp_address, topic, before)
    seen: Counter[bytes] = Counter()
    first_after: list[float] = []

    async def handler(message: Any) -> None:
        seen[message.body] += 1
        if message.body.startswith(b"b") and not first_after:
            first_after.append(time.monotonic())
        await anyio.sleep(0)

    async with lib.Consumer(
        topic,
        "c",
        nsqd_tcp_addresses=[nsqd.tcp_address],
        max_in_flight=50,
        reconnect_delay=0.25,
        max_reconnect_delay=1.0,
        reconnect_jitter=0.0,
    ) as consumer:
        async with anyio.create_task_group() as tg:
            tg.start_soon(consumer.run, handler, 10)
            await until(lambda: len(seen) >= 500)
            nsqd.kill9()
            await anyio.sleep(1.0)
            await anyio.to_thread.run_sync(nsqd.start)
            restarted = time.monotonic()
            await publish_all(lib, nsqd.tcp_address, topic, after)
            await until(lambda: all(b in seen for b in after))
            # the rest of what nsqd still had (on disk) arrives too
            await until(lambda: (nsqd.channel(topic, "c") or {}).get("depth") == 0)
            await until(lambda: (nsqd.channel(topic, "c") or {}).get("in_flight_count") == 0)
            await consumer.stop()
    lost = [b for b in before if b not in seen]
    duplicates = sum(n - 1 for n in seen.values())
    report(
        f"kill -9 mid-consume, direct [{way[0]}/{way[1]}]",
        reconnect_s=first_after[0] - restarted,
        lost_in_nsqd_memory=len(lost),
        duplicates=duplicates,
    )
    # kill -9 loses what nsqd held in memory only: the messages in flight (max_in_flight)
    assert len(lost) <= 52
    assert first_after[0] - restarted < 5.0


async def test_kill9_through_lookupd_with_two_nsqd(
    lib: ModuleType, way: tuple[str, str], topic: str
) -> None:
    lookupd = Lookupd()
    lookupd.start()
    nsqds = [Nsqd(lookupd=lookupd), Nsqd(lookupd=lookupd)]
    try:
        for server in nsqds:
            server.start()
            await publish_all(lib, server.tcp_address, topic, [b"x"] * 500)
        await anyio.sleep(0.3)  # registrations reach lookupd
        seen: Counter[str] = Counter()
        fresh: list[float] = []

        async def handler(message: Any) -> None:
            seen[message.nsqd_address] += 1
            if message.body == b"fresh" and not fresh:
                fresh.append(time.monotonic())

        async with lib.Consumer(
            topic,
            "c",
            lookupd_http_addresses=[lookupd.http_address],
            max_in_flight=20,
        ) as consumer:
            async with anyio.create_task_group() as tg:
                tg.start_soon(consumer.run, handler, 5)
                await until(lambda: seen[nsqds[0].tcp_address] >= 100)
                nsqds[0].kill9()
                other = seen[nsqds[1].tcp_address]
                # the survivor keeps delivering meanwhile
                await until(lambda: seen[nsqds[1].tcp_address] > other + 50)
                await anyio.sleep(2.0)
                await anyio.to_thread.run_sync(nsqds[0].start)
                restarted = time.monotonic()
                await publish_all(lib, nsqds[0].tcp_address, topic, [b"fresh"])
                await until(lambda: bool(fresh))
                await consumer.stop()
        report(
            f"kill -9 one of two nsqd behind lookupd [{way[0]}/{way[1]}]",
            rediscovery_s=fresh[0] - restarted,
        )
        assert fresh[0] - restarted < 15.0  # not the 60 s lookupd poll interval
    finally:
        for server in nsqds:
            server.cleanup()
        lookupd.stop()


async def test_producer_failover_while_one_nsqd_is_killed(
    lib: ModuleType, way: tuple[str, str], topic: str
) -> None:
    servers = [Nsqd(), Nsqd()]
    try:
        for server in servers:
            server.start()
        acked: list[bytes] = []
        failed = 0

        async with lib.Producer(
            nsqd_tcp_addresses=[s.tcp_address for s in servers],
            reconnect_delay=0.2,
            publish_timeout=5.0,
        ) as producer:

            async def publisher(k: int) -> None:
                nonlocal failed
                for i in range(100):
                    body = b"%d-%d" % (k, i)
                    try:
                        await producer.publish(topic, body)
                    except lib.NSQError:
                        failed += 1
                    else:
                        acked.append(body)
                    if k == 0 and i == 30:
                        servers[0].kill9()

            async with anyio.create_task_group() as tg:
                for k in range(20):
                    tg.start_soon(publisher, k)
        await anyio.to_thread.run_sync(servers[0].start)
        seen: Counter[bytes] = Counter()
        async with lib.Consumer(
            topic, "c", nsqd_tcp_addresses=[s.tcp_address for s in servers], max_in_flight=200
        ) as consumer:
            with anyio.move_on_after(WAIT):
                async for message in consumer:
                    seen[message.body] += 1
                    await message.finish()
                    if all(b in seen for b in acked):
                        break
        missing = [b for b in acked if b not in seen]
        report(
            f"producer failover, kill -9 one of two [{way[0]}/{way[1]}]",
            acked=len(acked),
            failed=failed,
            duplicates=sum(n - 1 for n in seen.values()),
            missing=len(missing),
        )
        assert not missing  # every acknowledged publish is there
        assert len(acked) >= 1900
    finally:
        for server in servers:
            server.cleanup()


async def test_sigstop_sigcont(
    nsqd: Nsqd, lib: ModuleType, way: tuple[str, str], topic: str
) -> None:
    got: list[float] = []

    async def handler(message: Any) -> None:
        if message.body == b"after":
            got.append(time.monotonic())

    async with (
        lib.Consumer(
            topic,
            "c",
            nsqd_tcp_addresses=[nsqd.tcp_address],
            heartbeat_interval=1.0,
            handshake_timeout=2.0,
            reconnect_delay=0.5,
            max_reconnect_delay=2.0,
        ) as consumer,
        lib.Producer(nsqd_tcp_addresses=[nsqd.tcp_address], publish_timeout=3.0) as producer,
    ):
        await producer.publish(topic, b"before")
        async with anyio.create_task_group() as tg:
            tg.start_soon(consumer.run, handler, 4)
            await anyio.sleep(0.5)
            nsqd.freeze()
            try:
                started = time.monotonic()
                with pytest.raises(lib.PublishTimeout):
                    await producer.publish(topic, b"frozen")
                timed_out = time.monotonic() - started
                detected = await until(lambda: consumer.stats()["last_error"] is not None)
                await anyio.sleep(4.0)  # reconnects meanwhile time out in the handshake
            finally:
                nsqd.thaw()
            thawed = time.monotonic()
            with anyio.fail_after(WAIT):
                while True:
                    try:
                        await producer.publish(topic, b"after")
                        break
                    except lib.NSQError:
                        await anyio.sleep(0.1)
            await until(lambda: bool(got))
            tg.cancel_scope.cancel()
    report(
        f"SIGSTOP/SIGCONT [{way[0]}/{way[1]}]",
        publish_timeout_after_s=timed_out,
        consumer_detected_after_s=timed_out + detected,
        recovery_after_sigcont_s=got[0] - thawed,
    )
    assert 2.9 <= timed_out < 4.0
    assert got[0] - thawed < 5.0


@pytest.mark.parametrize("touch", [False, True])
async def test_handlers_slower_than_msg_timeout(
    nsqd: Nsqd, lib: ModuleType, way: tuple[str, str], topic: str, touch: bool
) -> None:
    await publish_all(lib, nsqd.tcp_address, topic, [b"%d" % i for i in range(5)])
    attempts: list[int] = []

    async def handler(message: Any) -> None:
        attempts.append(message.attempts)
        if message.attempts == 1:
            for _ in range(6):  # 1.5 s in all, msg_timeout is 1 s
                await anyio.sleep(0.25)
                if touch:
                    await message.touch()

    async with lib.Consumer(
        topic, "c", nsqd_tcp_addresses=[nsqd.tcp_address], max_in_flight=10, msg_timeout=1.0
    ) as consumer:
        async with anyio.create_task_group() as tg:
            tg.start_soon(consumer.run, handler, 10)
            await until(lambda: (nsqd.channel(topic, "c") or {}).get("message_count") == 5)
            await until(
                lambda: (
                    (nsqd.channel(topic, "c") or {}).get("in_flight_count") == 0
                    and (nsqd.channel(topic, "c") or {}).get("depth") == 0
                )
            )
            await anyio.sleep(0.3)
            tg.cancel_scope.cancel()
        state = [s["state"] for s in consumer.stats()["connections"]]
    channel = nsqd.channel(topic, "c") or {}
    report(
        f"handlers past msg_timeout, touch={touch} [{way[0]}/{way[1]}]",
        deliveries=len(attempts),
        timeouts=channel.get("timeout_count"),
    )
    assert state == ["SUBSCRIBED"]  # no connection lost on the way
    if touch:
        assert sorted(attempts) == [1] * 5 and channel.get("timeout_count") == 0
    else:
        assert sorted(attempts) == [1] * 5 + [2] * 5 and channel.get("timeout_count") == 5


@pytest.mark.parametrize("how", ["stop", "cancel"])
async def test_stop_under_load(
    nsqd: Nsqd, lib: ModuleType, way: tuple[str, str], topic: str, how: str
) -> None:
    bodies = [b"%d" % i for i in range(3000)]
    await publish_all(lib, nsqd.tcp_address, topic, bodies)
    finished: Counter[bytes] = Counter()
    running = peak = 0

    async def handler(message: Any) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        try:
            await anyio.sleep(0.01)
        finally:
            running -= 1
        finished[message.body] += 1

    stopping = 0.0
    async with lib.Consumer(
        topic, "c", nsqd_tcp_addresses=[nsqd.tcp_address], max_in_flight=200, stop_timeout=5.0
    ) as consumer:
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(consumer.run, handler, 50)
                await until(lambda: len(finished) >= 500)
                stopping = time.monotonic()
                if how == "stop":
                    await consumer.stop()
                else:
                    scope.cancel()
    stop_s = time.monotonic() - stopping
    rest: Counter[bytes] = Counter()
    async with lib.Consumer(
        topic, "c", nsqd_tcp_addresses=[nsqd.tcp_address], max_in_flight=500
    ) as consumer:
        with anyio.move_on_after(WAIT):
            async for message in consumer:
                rest[message.body] += 1
                await message.finish()
                if set(finished) | set(rest) >= set(bodies):
                    break
    report(
        f"{how} under load, concurrency 50 [{way[0]}/{way[1]}]",
        peak_concurrency=peak,
        stop_s=stop_s,
        finished_before=len(finished),
    )
    assert peak == 50
    assert stop_s < 5.0
    assert set(finished) | set(rest) == set(bodies)  # nothing lost


# ---------------------------------------------------------------------------------- TLS, AUTH


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    import trustme

    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1")
    client = ca.issue_cert("client@example.com")
    d = tmp_path_factory.mktemp("pki")
    paths = {
        "cert": d / "cert.pem",
        "key": d / "key.pem",
        "ca": d / "ca.pem",
    }
    server.cert_chain_pems[0].write_to_path(str(paths["cert"]))
    server.private_key_pem.write_to_path(str(paths["key"]))
    ca.cert_pem.write_to_path(str(paths["ca"]))
    return {"ca": ca, "client": client, **{k: str(v) for k, v in paths.items()}}


def tls_nsqd(pki: dict[str, Any], *extra: str) -> Nsqd:
    server = Nsqd(f"--tls-cert={pki['cert']}", f"--tls-key={pki['key']}", *extra)
    server.start()
    return server


async def test_tls_untrusted_trusted_client_cert_and_required(
    pki: dict[str, Any], lib: ModuleType, way: tuple[str, str], topic: str
) -> None:
    trusted = ssl.create_default_context()
    pki["ca"].configure_trust(trusted)
    server = tls_nsqd(pki)
    try:
        started = time.monotonic()
        async with lib.Producer(
            nsqd_tcp_addresses=[server.tcp_address], tls=ssl.create_default_context()
        ) as producer:
            with pytest.raises(lib.TransportError) as info:
                await producer.publish(topic, b"x")
        untrusted_s = time.monotonic() - started
        assert "CERTIFICATE_VERIFY_FAILED" in str(info.value)
        async with lib.Producer(nsqd_tcp_addresses=[server.tcp_address], tls=trusted) as producer:
            await producer.publish(topic, b"x")
    finally:
        server.cleanup()
    server = tls_nsqd(
        pki, f"--tls-root-ca-file={pki['ca']}", "--tls-client-auth-policy=require-verify"
    )
    try:
        with_cert = ssl.create_default_context()
        pki["ca"].configure_trust(with_cert)
        pki["client"].configure_cert(with_cert)
        async with lib.Producer(nsqd_tcp_addresses=[server.tcp_address], tls=with_cert) as p:
            await p.publish(topic, b"with a client certificate")
        started = time.monotonic()
        async with lib.Producer(
            nsqd_tcp_addresses=[server.tcp_address], tls=trusted, publish_timeout=3.0
        ) as p:
            with pytest.raises(lib.NSQError) as refused:
                await p.publish(topic, b"without")
        no_cert_s = time.monotonic() - started
    finally:
        server.cleanup()
    server = tls_nsqd(pki, "--tls-required=true")
    try:
        started = time.monotonic()
        async with lib.Producer(nsqd_tcp_addresses=[server.tcp_address]) as producer:
            with pytest.raises(lib.ServerError) as required:
                await producer.publish(topic, b"plain")
        required_s = time.monotonic() - started
        assert required.value.code == "E_INVALID"
    finally:
        server.cleanup()
    report(
        f"TLS [{way[0]}/{way[1]}]",
        untrusted_fails_after_s=untrusted_s,
        no_client_cert_fails_after_s=no_cert_s,
        no_client_cert_error=type(refused.value).__name__,
        tls_required_fails_after_s=required_s,
    )
    assert untrusted_s < 3.0 and required_s < 3.0


async def test_auth_with_a_wrong_secret(
    lib: ModuleType, way: tuple[str, str], topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            good = "secret=good" in self.path
            body = json.dumps(
                {
                    "ttl": 3600,
                    "identity": "tester",
                    "authorizations": [
                        {"topic": ".*", "channels": [".*"], "permissions": ["publish"]}
                    ],
                }
            ).encode()
            self.send_response(200 if good else 403)
            self.send_header("Content-Length", str(len(body) if good else 0))
            self.end_headers()
            if good:
                self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    auth = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=auth.serve_forever, daemon=True).start()
    server = Nsqd(f"--auth-http-address=127.0.0.1:{auth.server_address[1]}")
    server.start()
    try:
        async with lib.Producer(nsqd_tcp_addresses=[server.tcp_address], auth_secret="good") as p:
            await p.publish(topic, b"allowed")
        started = time.monotonic()
        async with lib.Producer(
            nsqd_tcp_addresses=[server.tcp_address], auth_secret="s3cr3t-wrong"
        ) as p:
            with pytest.raises(lib.ServerError) as info:
                await p.publish(topic, b"x")
        wrong_s = time.monotonic() - started
    finally:
        server.cleanup()
        auth.shutdown()
        auth.server_close()
    report(f"AUTH wrong secret [{way[0]}/{way[1]}]", fails_after_s=wrong_s)
    assert info.value.code == "E_AUTH_FAILED"
    assert wrong_s < 3.0
    assert "s3cr3t-wrong" not in caplog.text


# ---------------------------------------------------------------------------------- memory


def rss_bytes() -> int:
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def test_a_thousand_idle_connections(
    nsqd: Nsqd, lib: ModuleType, way: tuple[str, str]
) -> None:
    n = 1000
    # warm up: the first connection pays for imports and one-off buffers
    async with lib.Producer(nsqd_tcp_addresses=[nsqd.tcp_address], pool_size=10) as producer:
        await until(
            lambda: sum(c["state"] == "READY" for c in producer.stats()["connections"]) == 10
        )
    before = rss_bytes()
    async with lib.Producer(nsqd_tcp_addresses=[nsqd.tcp_address], pool_size=n) as producer:
        await until(
            lambda: sum(c["state"] == "READY" for c in producer.stats()["connections"]) == n
        )
        await anyio.sleep(0.5)
        per_connection = (rss_bytes() - before) / n
    report(
        f"{n} idle connections [{way[0]}/{way[1]}]", rss_per_connection_kib=per_connection / 1024
    )
    assert per_connection < 64 * 1024
