"""The programs in ``examples/``, run as a user runs them: separate processes talking to an
emulated nsqd on loopback (its loop in a background thread of this process, so the tests can
look at its channels)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal

from nsq_emulator import ChannelStats, TopicStats
from nsq_emulator.loopback import EmulatorCluster, serve_emulator

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
T = TypeVar("T")


class Emulator:
    def __init__(self, portal: BlockingPortal, cluster: EmulatorCluster) -> None:
        self.portal = portal
        self.address = cluster.nsqd_tcp_addresses[0]
        self.nsqd = cluster.nsqds[0]

    def _on_loop(self, func: Callable[..., T], *args: Any) -> T:
        async def run() -> T:
            return func(*args)

        return self.portal.call(run)

    def topic_stats(self, topic: str) -> TopicStats:
        return self._on_loop(self.nsqd.topic_stats, topic)

    def channel_stats(self, topic: str, channel: str) -> ChannelStats:
        return self._on_loop(self.nsqd.channel_stats, topic, channel)


@pytest.fixture(scope="module")
def emulator() -> Iterator[Emulator]:
    with (
        start_blocking_portal() as portal,
        portal.wrap_async_context_manager(serve_emulator(lookupd=False)) as cluster,
    ):
        yield Emulator(portal, cluster)


def run_example(name: str, *args: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONIOENCODING": "utf-8"}
    return subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )


def publish(emulator: Emulator, topic: str, bodies: list[str]) -> None:
    out = run_example("selectors_producer.py", emulator.address, topic, *bodies)
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"published {len(bodies)} messages to {topic!r}\n"
    assert out.stderr == ""


def test_the_producer_publishes_every_body_then_exits_0(emulator: Emulator) -> None:
    publish(emulator, "ex_pub", ["one", "two words", "three"])
    stats = emulator.topic_stats("ex_pub")
    # no channel yet: the topic keeps them
    assert (stats.message_count, stats.depth, stats.message_bytes) == (3, 3, 17)


def test_the_consumer_prints_each_body_in_order_and_leaves_nothing_behind(
    emulator: Emulator,
) -> None:
    bodies = [f"message {i}" for i in range(1, 21)]
    publish(emulator, "ex_all", bodies)
    out = run_example("selectors_consumer.py", emulator.address, "ex_all", "archive", "20")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == bodies
    assert out.stderr == ""
    stats = emulator.channel_stats("ex_all", "archive")
    assert (stats.depth, stats.in_flight_count, stats.requeue_count) == (0, 0, 0)
    assert stats.message_count == 20
    assert stats.client_count == 0  # it closed its connection on the way out


def test_the_consumer_stops_after_count_and_the_rest_stays_queued(emulator: Emulator) -> None:
    bodies = ["a", "b", "c", "d", "e"]
    publish(emulator, "ex_part", bodies)
    out = run_example("selectors_consumer.py", emulator.address, "ex_part", "archive", "2")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["a", "b"]
    stats = emulator.channel_stats("ex_part", "archive")
    # it sent CLS before its last FIN: no third message was handed out (and requeued)
    assert (stats.depth, stats.in_flight_count, stats.requeue_count) == (3, 0, 0)
    out = run_example("selectors_consumer.py", emulator.address, "ex_part", "archive", "3")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["c", "d", "e"]
    stats = emulator.channel_stats("ex_part", "archive")
    assert (stats.depth, stats.in_flight_count) == (0, 0)


def test_the_producer_exits_1_when_nsqd_cannot_be_reached() -> None:
    with socket.socket() as sock:  # a loopback port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out = run_example("selectors_producer.py", f"127.0.0.1:{port}", "t", "x", "--timeout", "1")
    assert out.returncode == 1
    assert out.stdout == ""
    # the refusal itself, as soon as the connection attempt failed (not at --timeout)
    assert f"message 1 failed: could not connect to any nsqd: 127.0.0.1:{port}: " in out.stderr
    assert "Connection refused" in out.stderr


def test_the_full_client_runs_on_a_backend_of_the_users_own(emulator: Emulator) -> None:
    count = 300
    out = run_example("metered_backend.py", emulator.address, "ex_metered", str(count))
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""
    lines = [line.split() for line in out.stdout.splitlines()]
    # one connection each: every byte of both clients went through the user's streams
    assert [(role, address) for role, address, _, _ in lines] == [
        ("producer", emulator.address),
        ("consumer", emulator.address),
    ]
    (_, _, pub_sent, pub_received), (_, _, sub_sent, sub_received) = (
        (role, address, int(sent), int(received)) for role, address, sent, received in lines
    )
    bodies = [b"message %d" % i for i in range(count)]
    # MPUB: a length before each body; answered with a few small frames
    assert pub_sent > sum(4 + len(body) for body in bodies)
    assert 0 < pub_received < 1000
    # each message frame: size, frame type, timestamp, attempts, id, body; a FIN for each
    assert sub_received > sum(4 + 4 + 8 + 2 + 16 + len(body) for body in bodies)
    assert sub_sent > count * len(b"FIN 0123456789abcdef\n")
    stats = emulator.channel_stats("ex_metered", "metered")
    assert (stats.message_count, stats.depth, stats.in_flight_count) == (count, 0, 0)
    assert stats.requeue_count == 0
