"""The pytest plugin that comes with the package: a user's suite, in a pytest of its own, gets
emulated servers from the ``nsq_emulator`` and ``nsq_memory_network`` fixtures."""

from __future__ import annotations

import pytest

from tests.support import ROOT

pytest_plugins = ["pytester"]

USERS_TESTS = """
import anyio
import pytest

import nsq_anyio
from nsq_proto import Consumer, MessageReceived


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_a_message_goes_through_nsqd_found_by_lookupd(nsq_emulator):
    addresses = nsq_emulator.nsqd_tcp_addresses
    async with nsq_anyio.Producer(nsqd_tcp_addresses=addresses) as producer:
        await producer.publish("orders", b"one")
    lookupds = nsq_emulator.lookupd_http_addresses
    async with nsq_anyio.Consumer("orders", "c", lookupd_http_addresses=lookupds) as consumer:
        with anyio.fail_after(10):
            async for message in consumer:
                await message.finish()
                break
    assert message.body == b"one"
    assert nsq_emulator.nsqds[0].channel_stats("orders", "c").message_count == 1


@pytest.mark.anyio
@pytest.mark.nsq_emulator(nsqd_count=2, lookupd=False)
async def test_the_marker_passes_options(nsq_emulator):
    assert len(nsq_emulator.nsqd_tcp_addresses) == 2
    assert nsq_emulator.lookupd_http_addresses == []


def test_a_core_on_the_memory_network(nsq_memory_network):
    net = nsq_memory_network
    consumer = net.attach(Consumer("t", "c", lookupd_http_addresses=["lookupd:4161"]))
    net.start()
    (nsqd,) = net.nsqds.values()
    nsqd.publish("t", b"hello", net.now)
    net.advance(5.0)
    (event,) = [e for e in net.take_events(consumer) if isinstance(e, MessageReceived)]
    assert event.message.body == b"hello"
"""


def test_a_users_suite_gets_emulated_servers_from_the_fixtures(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_users=USERS_TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-v")
    result.stdout.fnmatch_lines_random(
        [
            "*test_a_message_goes_through_nsqd_found_by_lookupd?asyncio? PASSED*",
            "*test_a_message_goes_through_nsqd_found_by_lookupd?trio? PASSED*",
            "*test_the_marker_passes_options* PASSED*",
            "*test_a_core_on_the_memory_network PASSED*",
        ]
    )
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == outcomes.get("errors", 0) == 0


def test_the_example_of_the_testing_page_passes(pytester: pytest.Pytester) -> None:
    page = (ROOT / "docs" / "testing.md").read_text()
    section = page.split("## The pytest fixtures", 1)[1]
    example = section.split("```python\n", 1)[1].split("```", 1)[0]
    pytester.makepyfile(test_example=example)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-v")
    result.stdout.fnmatch_lines(["*test_an_order_is_consumed* PASSED*"])
    assert result.ret == 0
