"""Faults against real nsqd/nsqlookupd processes, on every adapter: kill -9, SIGSTOP/SIGCONT,
restarts, slow handlers, stops under load, TLS and AUTH misconfiguration, many idle
connections.  Runs when ``NSQD`` and ``NSQLOOKUPD`` point at the binaries; skipped otherwise,
with the reason.  The figures (recovery times, duplicates, memory) are printed at the end."""

from __future__ import annotations

import ssl
import sys
import time
import uuid
from types import ModuleType
from typing import Any

import anyio
import anyio.to_thread
import pytest

from tests.support.servers import MISSING, NSQD, NSQLOOKUPD, Lookupd, Nsqd, auth_server

from . import _scenarios as scenario
from ._figures import report
from ._scenarios import WAIT, until
from ._targets import RealTarget

pytestmark = [
    pytest.mark.real_nsqd,
    pytest.mark.anyio,
    pytest.mark.skipif(not (NSQD and NSQLOOKUPD), reason=MISSING),
]


@pytest.fixture
def topic(way: tuple[str, str]) -> str:
    return f"f_{way[0]}_{way[1]}_{uuid.uuid4().hex[:8]}"


async def test_kill_mid_consume(
    nsqd: Nsqd, lib: ModuleType, way: tuple[str, str], topic: str
) -> None:
    await scenario.kill_mid_consume(lib, way, RealTarget([nsqd]), topic)


async def test_kill_behind_lookupd(lib: ModuleType, way: tuple[str, str], topic: str) -> None:
    lookupd = Lookupd()
    lookupd.start()
    nsqds = [Nsqd(lookupd=lookupd), Nsqd(lookupd=lookupd)]
    try:
        for server in nsqds:
            server.start()
        await scenario.kill_behind_lookupd(lib, way, RealTarget(nsqds, lookupd), topic)
    finally:
        for server in nsqds:
            server.cleanup()
        lookupd.stop()


async def test_producer_failover(lib: ModuleType, way: tuple[str, str], topic: str) -> None:
    nsqds = [Nsqd(), Nsqd()]
    try:
        for server in nsqds:
            server.start()
        await scenario.producer_failover(lib, way, RealTarget(nsqds), topic)
    finally:
        for server in nsqds:
            server.cleanup()


@pytest.mark.parametrize("touch", [False, True])
async def test_slow_handlers(
    nsqd: Nsqd, lib: ModuleType, way: tuple[str, str], topic: str, touch: bool
) -> None:
    await scenario.slow_handlers(lib, way, RealTarget([nsqd]), topic, touch)


@pytest.mark.parametrize("how", ["stop", "cancel", "cancel-block"])
async def test_stop_under_load(
    nsqd: Nsqd, lib: ModuleType, way: tuple[str, str], topic: str, how: str
) -> None:
    await scenario.stop_under_load(lib, way, RealTarget([nsqd]), topic, how)


async def test_sigstop_sigcont(
    nsqd: Nsqd, lib: ModuleType, way: tuple[str, str], topic: str
) -> None:
    """SIGSTOP: a publish fails with PublishTimeout within publish_timeout, the consumer sees
    the silence within two heartbeats, and both recover soon after SIGCONT."""
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
        f"real nsqd: SIGSTOP/SIGCONT [{way[0]}/{way[1]}]",
        publish_timeout_after_s=timed_out,
        consumer_detected_after_s=timed_out + detected,
        recovery_after_sigcont_s=got[0] - thawed,
    )
    assert 2.9 <= timed_out < 4.0
    assert got[0] - thawed < 5.0


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
        "ca_file": d / "ca.pem",
    }
    server.cert_chain_pems[0].write_to_path(str(paths["cert"]))
    server.private_key_pem.write_to_path(str(paths["key"]))
    ca.cert_pem.write_to_path(str(paths["ca_file"]))
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
        pki, f"--tls-root-ca-file={pki['ca_file']}", "--tls-client-auth-policy=require-verify"
    )
    try:
        with_cert = ssl.create_default_context()
        pki["ca"].configure_trust(with_cert)
        pki["client"].configure_cert(with_cert)
        async with lib.Producer(nsqd_tcp_addresses=[server.tcp_address], tls=with_cert) as p:
            await p.publish(topic, b"with a client certificate")
        started = time.monotonic()
        async with lib.Producer(nsqd_tcp_addresses=[server.tcp_address], tls=trusted) as p:
            with pytest.raises(lib.TransportError) as refused:
                await p.publish(topic, b"without")
        no_cert_s = time.monotonic() - started
        assert "CERTIFICATE" in str(refused.value)  # nsqd's alert: bad/required certificate
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
        f"real nsqd: TLS [{way[0]}/{way[1]}]",
        untrusted_fails_after_s=untrusted_s,
        no_client_cert_fails_after_s=no_cert_s,
        no_client_cert_error=type(refused.value).__name__,
        tls_required_fails_after_s=required_s,
    )
    assert untrusted_s < 3.0 and no_cert_s < 3.0 and required_s < 3.0


async def test_auth_with_a_wrong_secret(
    lib: ModuleType, way: tuple[str, str], topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    auth = auth_server(".*")
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
    report(f"real nsqd: AUTH wrong secret [{way[0]}/{way[1]}]", fails_after_s=wrong_s)
    assert info.value.code == "E_AUTH_FAILED"
    assert wrong_s < 3.0
    assert "s3cr3t-wrong" not in caplog.text


# ---------------------------------------------------------------------------------- memory


#: run in a fresh interpreter, so that no earlier test's freed memory hides the growth
IDLE_CONNECTIONS = """
import os, sys, anyio, importlib
lib = importlib.import_module(sys.argv[1]); address = sys.argv[3]; n = int(sys.argv[4])

def rss():
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

async def ready(producer, k):
    while sum(c["state"] == "READY" for c in producer.stats()["connections"]) < k:
        await anyio.sleep(0.02)

async def main():
    async with lib.Producer(nsqd_tcp_addresses=[address], pool_size=10) as warm:
        await ready(warm, 10)  # imports and one-off buffers are paid for here
    before = rss()
    async with lib.Producer(nsqd_tcp_addresses=[address], pool_size=n) as producer:
        await ready(producer, n)
        await anyio.sleep(0.5)
        print((rss() - before) / n)

anyio.run(main, backend=sys.argv[2])
"""


async def test_a_thousand_idle_connections(
    nsqd: Nsqd, lib: ModuleType, way: tuple[str, str]
) -> None:
    n = 1000
    argv = [sys.executable, "-c", IDLE_CONNECTIONS, way[0], way[1], nsqd.tcp_address, str(n)]
    done = await anyio.run_process(argv, check=True)
    per_connection = float(done.stdout.decode().split()[-1])
    report(
        f"real nsqd: {n} idle connections [{way[0]}/{way[1]}]",
        rss_per_connection_kib=per_connection / 1024,
    )
    assert per_connection < 64 * 1024
