"""Without OpenTelemetry installed, the client imports and runs as before, and
``nsq_client.otel`` says what to install."""

from __future__ import annotations

import logging
import os
import subprocess

import pytest

from nsq_client import _telemetry
from tests.support import ROOT
from tests.support.extras import program_with

PROGRAM = """
import anyio
import nsq_anyio
from nsq_emulator.loopback import serve_emulator

try:
    import nsq_client.otel
except ModuleNotFoundError as missing:
    print("otel:", missing, missing.name)

async def main():
    async with serve_emulator(nsqd_count=1, lookupd=False) as cluster:
        addresses = cluster.nsqd_tcp_addresses
        async with nsq_anyio.Producer(nsqd_tcp_addresses=addresses) as producer:
            await producer.publish("t", b"one")
            await producer.publish_many("t", [b"two", b"three"])
        got = []
        async with nsq_anyio.Consumer("t", "c", nsqd_tcp_addresses=addresses) as consumer:

            async def handler(message):
                got.append(message.body)
                if len(got) == 2:
                    await consumer.stop()

            with anyio.fail_after(20):
                await consumer.run(handler)
            async with nsq_anyio.Producer(nsqd_tcp_addresses=addresses) as producer:
                await producer.publish("t", b"four")
        async with nsq_anyio.Consumer("t", "c", nsqd_tcp_addresses=addresses) as consumer:
            with anyio.fail_after(20):
                async for message in consumer:
                    got.append(message.body)
                    await message.finish()
                    if len(got) == 4:
                        break
    print("handled", sorted(got))
    print("opentelemetry imported:", any(m.startswith("opentelemetry") for m in sys.modules))

anyio.run(main)
"""


def test_without_opentelemetry_the_client_runs_and_otel_says_what_to_install() -> None:
    out = subprocess.run(
        program_with(["anyio"], PROGRAM),
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines == [
        "otel: nsq_client.otel needs OpenTelemetry's API: pip install "
        '"nsq-sansio[otel]" (or "opentelemetry-api>=1.25") opentelemetry',
        "handled [b'four', b'one', b'three', b'two']",
        "opentelemetry imported: False",
    ]


def test_instrument_twice_warns_and_keeps_the_first_providers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from opentelemetry.sdk.trace import TracerProvider

    import nsq_client.otel

    first = TracerProvider()
    nsq_client.otel.instrument(tracer_provider=first)
    try:
        hooks = _telemetry.hooks.active
        with caplog.at_level(logging.WARNING, logger="nsq.otel"):
            nsq_client.otel.instrument(tracer_provider=TracerProvider())
        assert [r.getMessage() for r in caplog.records] == [
            "nsq_client.otel is already instrumented: call uninstrument() first"
        ]
        assert _telemetry.hooks.active is hooks
        assert nsq_client.otel.is_instrumented()
    finally:
        nsq_client.otel.uninstrument()
    assert not nsq_client.otel.is_instrumented()
    assert _telemetry.hooks.active is None
