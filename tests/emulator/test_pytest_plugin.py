"""The pytest plugin that comes with the package: a user's suite, in a pytest of its own, gets
emulated servers from the ``nsq_emulator`` and ``nsq_memory_network`` fixtures."""

from __future__ import annotations

import pytest

from nsq_emulator import Lookupd, MemoryNetwork, Nsqd, NsqdOptions
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
    nsqd = net.nsqd("nsqd1:4150")  # as the page names it
    nsqd.publish("t", b"hello", net.now)
    net.advance(5.0)
    assert net.lookupd("lookupd:4161").producers("t")  # the consumer found nsqd there
    (event,) = [e for e in net.take_events(consumer) if isinstance(e, MessageReceived)]
    assert event.message.body == b"hello"
"""


def test_the_memory_networks_servers_by_address() -> None:
    """``net.nsqd("host:port")`` and ``net.lookupd("host:port")``, as clients name them; an
    address the network does not have is a KeyError naming those it has."""
    net = MemoryNetwork()
    nsqd = net.add_nsqd(Nsqd(NsqdOptions(broadcast_address="nsqd1")))
    other = net.add_nsqd(Nsqd(NsqdOptions(broadcast_address="nsqd2", tcp_port=4250)))
    lookupd = net.add_lookupd(Lookupd(broadcast_address="lookupd", http_port=4161))
    assert net.nsqd("nsqd1:4150") is nsqd is net.nsqds[("nsqd1", 4150)]
    assert net.nsqd("nsqd2:4250") is other
    assert net.lookupd("lookupd:4161") is lookupd is net.lookupds[("lookupd", 4161)]
    with pytest.raises(KeyError, match="nsqd1:4150, nsqd2:4250"):
        net.nsqd("nsqd1:4151")
    with pytest.raises(KeyError, match="lookupd:4161"):
        net.lookupd("nsqd1:4150")


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


def page_block(containing: str) -> str:
    """The Python block of docs/testing.md that holds ``containing``."""
    page = (ROOT / "docs" / "testing.md").read_text()
    (block,) = [b.split("```", 1)[0] for b in page.split("```python\n")[1:] if containing in b]
    return block


ON_ASYNCIO = """
import asyncio

import pytest


@pytest.mark.anyio
async def test_the_event_loop(nsq_emulator):
    asyncio.get_running_loop()  # a RuntimeError on trio
"""


def test_anyio_tests_run_on_every_backend_unless_the_conftest_of_the_page_chooses(
    pytester: pytest.Pytester,
) -> None:
    """What docs/testing.md says of the event loops: by default (anyio 4.12 and later, trio
    installed, as here) the page's example runs on asyncio and on trio; with the page's
    conftest.py, once, on asyncio."""
    example = page_block("def test_an_order_is_consumed")
    pytester.makepyfile(test_example=example)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-v")
    result.stdout.fnmatch_lines_random(
        [
            "*test_an_order_is_consumed?asyncio? PASSED*",
            "*test_an_order_is_consumed?trio? PASSED*",
        ]
    )
    assert result.parseoutcomes() == {"passed": 2}
    pytester.makeconftest(page_block("def anyio_backend"))
    pytester.makepyfile(test_loop=ON_ASYNCIO)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-v")
    result.stdout.fnmatch_lines_random(
        ["*test_an_order_is_consumed PASSED*", "*test_the_event_loop PASSED*"]
    )
    assert result.parseoutcomes() == {"passed": 2}
