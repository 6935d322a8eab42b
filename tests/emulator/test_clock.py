"""The emulator's Unix time: the host's wall clock when it gives one (``serve_emulator``,
``MemoryNetwork(wall_clock=time.time)``), so that message timestamps, ``/stats``'s
``start_time`` and HTTP dates are those of now; a fixed one (``wall_clock_offset``, or
``FIXED_EPOCH`` when nothing is given) makes them the same on every run."""

from __future__ import annotations

import email.utils
import json
import time
from typing import Any

import anyio
import pytest

from nsq_emulator import FIXED_EPOCH, Lookupd, MemoryNetwork, Nsqd, NsqdOptions
from nsq_proto import Consumer, MessageReceived

#: how far from time.time() a timestamp taken during the test may be
SLACK = 60.0


def _one_message(net: MemoryNetwork, options: NsqdOptions) -> int:
    """The timestamp (ns) of a message published 2.5 s after the network started."""
    nsqd = net.add_nsqd(Nsqd(options, now=net.now))
    consumer = net.attach(Consumer("t", "c", nsqd_tcp_addresses=["nsqd1:4150"]))
    net.start()
    net.advance(2.5)
    nsqd.publish("t", b"now", net.now)
    net.run_until_idle()
    (event,) = [e for e in net.take_events(consumer) if isinstance(e, MessageReceived)]
    return event.message.timestamp


def _date(headers: list[tuple[str, str]]) -> float:
    return email.utils.parsedate_to_datetime(dict(headers)["Date"]).timestamp()


def test_given_the_wall_clock_message_timestamps_are_now() -> None:
    net = MemoryNetwork(now=5000.0, wall_clock=time.time)
    timestamp = _one_message(net, NsqdOptions(broadcast_address="nsqd1"))
    assert abs(timestamp / 1e9 - time.time()) < SLACK


def test_given_the_wall_clock_stats_and_http_dates_are_now() -> None:
    net = MemoryNetwork(now=123.0, wall_clock=time.time)
    nsqd = net.add_nsqd(Nsqd(now=123.0))
    stats = json.loads(nsqd.handle("GET", "/stats?format=json", now=124.0).body)
    assert abs(stats["start_time"] - time.time()) < SLACK
    assert abs(_date(nsqd.handle("GET", "/ping", now=125.0).headers) - time.time()) < SLACK
    lookupd = net.add_lookupd(Lookupd())
    assert abs(_date(lookupd.handle("GET", "/ping", now=126.0).headers) - time.time()) < SLACK


def test_a_fixed_offset_wins_over_the_wall_clock_and_is_the_same_on_every_run() -> None:
    options = NsqdOptions(broadcast_address="nsqd1", wall_clock_offset=1_000_000_000.0)
    for _ in range(2):
        net = MemoryNetwork(wall_clock=time.time)
        assert _one_message(net, options) == round((1_000_000_000.0 + 2.5) * 1e9)
    net = MemoryNetwork(wall_clock=time.time)
    lookupd = net.add_lookupd(Lookupd(wall_clock_offset=0.0))
    assert dict(lookupd.handle("GET", "/ping", now=1.0).headers)["Date"] == (
        "Thu, 01 Jan 1970 00:00:01 GMT"
    )


def test_without_a_wall_clock_the_time_is_the_fixed_epoch() -> None:
    timestamp = _one_message(MemoryNetwork(), NsqdOptions(broadcast_address="nsqd1"))
    assert timestamp == round((FIXED_EPOCH + 2.5) * 1e9)


def test_serve_emulator_stamps_messages_with_the_time_they_were_published(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The emulator's wall clock is read together with its loop clock: listeners that take
    0.3 s to open do not push message timestamps 0.3 s into the future."""
    from nsq_emulator import loopback

    listen = loopback._listen

    async def slow_listen(*args: Any) -> Any:
        await anyio.sleep(0.3)
        return await listen(*args)

    monkeypatch.setattr(loopback, "_listen", slow_listen)

    async def main() -> tuple[int, int, int]:
        async with loopback.serve_emulator(lookupd=False) as cluster:
            before = time.time_ns()
            # what the nsqd stamps a message published now with
            stamped = cluster.nsqds[0].unix_ns(cluster.now())
            after = time.time_ns()
            return before, stamped, after

    before, stamped, after = anyio.run(main)
    assert before - 1_000_000 <= stamped <= after + 1_000_000
