"""``start_from`` (``_start_from.py``): where a consumer of the partitioned server starts, per
partition; the positions and their wire form, the core's calls to nsqd, against the emulator,
then (marked ``real_nsqd``) against a real partitioned cluster.  Every start-from test but the
Spark source's (``tests/spark``) is here.

The position is set over the leader's HTTP API (``/channel/setoffset``) before the first
subscription to a partition: the TCP form (``SUB_ADVANCED`` with five tokens) is read by the
server without its partition token and would move whichever partition the node leads first.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import anyio
import pytest

import nsq_anyio
from nsq_emulator import Cluster, MemoryNetwork
from nsq_proto import (
    ConfigError,
    Connect,
    Consumer,
    ConsumerConfig,
    HttpRequest,
    MessageReceived,
    StartFrom,
    StartFromApplied,
    StartFromFailed,
)
from tests.support.partitioned import (
    NEEDS_CLUSTER,
    PartitionedCluster,
    collect,
    partitioned_cluster,
)

from .helpers import PARTITIONED_LOOKUP, http_response, of_type, requests_by_target

# -- the positions, and the core's calls to nsqd (sans-IO) ------------------------------------


def test_start_from_positions_and_their_wire_form() -> None:
    assert StartFrom.end().token() == b"special:-1"
    assert StartFrom.timestamp(1700000000.9).token() == b"timestamp:1700000000"
    when = datetime(2024, 1, 2, 3, 4, 5, tzinfo=timezone(timedelta(hours=1)))
    assert StartFrom.timestamp(when) == StartFrom("timestamp", 1704161045)
    assert StartFrom.queue_offset(4096).token() == b"virtual_queue:4096"
    assert StartFrom.message_count(1).token() == b"msgcount:1"
    assert StartFrom.parse(" end ") == StartFrom.end()
    assert StartFrom.parse("msgcount:12") == StartFrom.message_count(12)
    assert StartFrom.parse("timestamp:5") == StartFrom.timestamp(5)
    assert StartFrom.timestamp(datetime(2024, 1, 1, tzinfo=UTC)).value == 1704067200


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda: StartFrom("offset", 1), "unknown start position kind 'offset'"),  # type: ignore[arg-type]
        (lambda: StartFrom("msgcount", True), "a start position is an int, not True"),
        (lambda: StartFrom("special", 0), "the only special start position is -1 (the end)"),
        (lambda: StartFrom.queue_offset(-1), "a virtual_queue start position must be 0..2^63-1"),
        (lambda: StartFrom.message_count(1 << 63), "a msgcount start position must be 0..2^63-1"),
        (lambda: StartFrom.timestamp(True), "a start time is Unix seconds or a datetime"),
        (lambda: StartFrom.timestamp("today"), "a start time is Unix seconds or a datetime"),  # type: ignore[arg-type]
        (lambda: StartFrom.timestamp(datetime(2024, 1, 1)), "give an aware datetime"),
        (lambda: StartFrom.timestamp(float("nan")), "a start time must be finite, not nan"),
        (lambda: StartFrom.parse("12"), "a start position reads 'end' or 'kind:value'"),
        (lambda: StartFrom.parse("msgcount:x"), "start position 'msgcount:x': 'x' is not an int"),
    ],
)
def test_start_from_refuses_what_the_server_would(make: Any, says: str) -> None:
    with pytest.raises(ConfigError) as info:
        make()
    assert str(info.value).startswith(says)


def test_start_from_sets_each_partitions_position_before_subscribing() -> None:
    core = Consumer(
        "t",
        "c",
        ConsumerConfig(start_from=StartFrom.message_count(5)),
        lookupd_http_addresses=["l:4161"],
    )
    core.start(0.0)
    (lookup,) = of_type(core.outputs(), HttpRequest)
    core.http_data(lookup.request_id, http_response(PARTITIONED_LOOKUP), 0.1)
    out = core.outputs()
    assert not of_type(out, Connect)  # no subscription before the position is set
    calls = requests_by_target(out)
    assert set(calls) == {
        ("l", "/listlookup"),  # a partitioned answer: learn the cluster's other lookupd
        ("n1", "/channel/setoffset"),
        ("n2", "/channel/setoffset"),
    }
    first, second = calls[("n1", "/channel/setoffset")], calls[("n2", "/channel/setoffset")]
    assert first.port == 4151 and first.data.endswith(b"\r\n\r\nmsgcount:5")
    assert b"?topic=t&partition=0&channel=c " in first.data
    # partition 0: set; its connection opens
    core.http_data(first.request_id, http_response(b"OK"), 0.2)
    out = core.outputs()
    assert out[0] == StartFromApplied(("n1", 4150), 0)
    assert [(o.host, o.port) for o in of_type(out, Connect)] == [("n1", 4150)]
    # partition 1: the channel does not exist yet: created, then its position set
    core.http_data(second.request_id, http_response(b"CHANNEL_NOT_FOUND", b"404 Not Found"), 0.3)
    create = requests_by_target(core.outputs())[("n2", "/channel/create")]
    core.http_data(create.request_id, http_response(b""), 0.4)
    again = requests_by_target(core.outputs())[("n2", "/channel/setoffset")]
    core.http_data(again.request_id, http_response(b"boom", b"500 Internal Server Error"), 0.5)
    out = core.outputs()
    (failed,) = of_type(out, StartFromFailed)
    assert (failed.address, failed.partition) == (("n2", 4150), 1)
    assert str(failed.error) == (
        "start_from for partition 1: /channel/setoffset answered HTTP 500: boom"
    )
    assert not of_type(out, Connect)  # not consumed from until a later lookup sets it


def test_an_nsqd_call_cut_short_is_a_failed_start_from() -> None:
    core = Consumer(
        "t", "c", ConsumerConfig(start_from=StartFrom.end()), lookupd_http_addresses=["l:4161"]
    )
    core.start(0.0)
    (lookup,) = of_type(core.outputs(), HttpRequest)
    core.http_data(lookup.request_id, http_response(PARTITIONED_LOOKUP), 0.1)
    calls = requests_by_target(core.outputs())
    setoffset = calls[("n1", "/channel/setoffset")]
    assert setoffset.data.endswith(b"special:-1")
    core.http_data(setoffset.request_id, b"", 0.2)  # EOF before a byte of the answer
    (failed,) = of_type(core.outputs(), StartFromFailed)
    assert (failed.address, failed.partition) == (("n1", 4150), 0)
    assert str(failed.error) == "the connection closed before an HTTP response arrived"
    setoffset = calls[("n2", "/channel/setoffset")]
    core.http_data(setoffset.request_id, b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nOK", 0.3)
    assert core.outputs() == []  # half a response: waiting for the rest
    core.http_failed(setoffset.request_id, OSError("connection reset"), 0.4)
    (failed,) = of_type(core.outputs(), StartFromFailed)
    assert failed.partition == 1 and str(failed.error).endswith(": connection reset")
    assert not of_type(core.outputs(), Connect)


# -- against the emulator --------------------------------------------------------------------

LOOKUPD = ["127.0.0.1:4161"]


def backlog(*, channel: bool = True, nodes: int = 1) -> tuple[MemoryNetwork, Cluster]:
    """A 2-partition topic (both led by one node unless ``nodes`` > 1) with 5 old messages
    on each partition."""
    net = MemoryNetwork()
    cluster = net.add_cluster(Cluster(nodes=nodes))
    cluster.create_topic("events", net.now, partitions=2)
    if channel:
        cluster.create_channel("events", "c", net.now)
    for p in (0, 1):
        leader = cluster.leader("events", p)
        assert leader is not None
        for i in range(5):
            leader.publish("events", b"old-%d-%d" % (p, i), net.now, partition=p)
    net.advance(10.0)
    return net, cluster


def consume(
    net: MemoryNetwork, start_from: StartFrom | Mapping[int, StartFrom]
) -> tuple[Consumer, list[tuple[int | None, bytes]], list[object]]:
    consumer = Consumer(
        "events",
        "c",
        ConsumerConfig(max_in_flight=20, start_from=start_from),
        lookupd_http_addresses=LOOKUPD,
    )
    got: list[tuple[int | None, bytes]] = []
    events: list[object] = []

    def on_event(event: object) -> None:
        events.append(event)
        if isinstance(event, MessageReceived):
            stats = consumer.connection_stats(event.conn_id)
            got.append((stats.partition if stats else None, event.message.body))
            consumer.finish(event.conn_id, event.message.id, net.now)

    net.attach(consumer, on_event)
    consumer.start(net.now)
    net.run_until_idle()
    return consumer, got, events


def publish_new(net: MemoryNetwork, cluster: Cluster) -> None:
    for p in (0, 1):
        leader = cluster.leader("events", p)
        assert leader is not None
        leader.publish("events", b"new-%d" % p, net.now, partition=p)
    net.advance(5.0)


@pytest.mark.parametrize("channel", [True, False], ids=["channel", "no-channel-yet"])
def test_start_from_the_end_skips_the_backlog_of_every_partition(channel: bool) -> None:
    # one node leads both partitions: the five-token SUB_ADVANCED would move only one
    net, cluster = backlog(channel=channel)
    _, got, events = consume(net, StartFrom.end())
    publish_new(net, cluster)
    assert sorted(got) == [(0, b"new-0"), (1, b"new-1")]
    applied = sorted(e.partition for e in events if isinstance(e, StartFromApplied))
    assert applied == [0, 1]


def test_start_positions_per_partition() -> None:
    net, _ = backlog(nodes=2)
    # msgcount:4 is the partition's fourth message (the server counts from 1)
    start = {0: StartFrom.message_count(4), 1: StartFrom.queue_offset(0)}
    _, got, _ = consume(net, start)
    assert [b for p, b in got if p == 0] == [b"old-0-3", b"old-0-4"]
    assert [b for p, b in got if p == 1] == [b"old-1-%d" % i for i in range(5)]


def test_a_position_applies_once_not_on_every_reconnect() -> None:
    net, cluster = backlog()
    _, got, events = consume(net, StartFrom.end())
    publish_new(net, cluster)
    leader = cluster.leader("events", 0)
    assert leader is not None
    leader.publish("events", b"while away", net.now, partition=0)
    leader.drop_connections(net.now)
    net.advance(30.0)
    assert (0, b"while away") in got
    assert len([e for e in events if isinstance(e, StartFromApplied)]) == 2


def test_a_refused_position_is_reported_and_its_partition_not_consumed() -> None:
    net, cluster = backlog()
    leader = cluster.leader("events", 0)
    assert leader is not None
    server = net.nsqds.pop(("127.0.0.1", leader.options.tcp_port))  # its HTTP is unreachable
    _, got, events = consume(net, StartFrom.end())
    failed = [e for e in events if isinstance(e, StartFromFailed)]
    assert {e.partition for e in failed} == {0, 1}
    assert all(e.address[1] == leader.options.tcp_port for e in failed)
    assert got == []
    net.nsqds[("127.0.0.1", leader.options.tcp_port)] = server
    net.advance(80.0)  # the next lookup sets the position, then consumes
    assert got == []  # the position was set before anything was consumed
    publish_new(net, cluster)
    assert sorted(got) == [(0, b"new-0"), (1, b"new-1")]


def test_start_from_needs_lookupd_and_valid_positions() -> None:
    with pytest.raises(ConfigError, match="lookupd"):
        Consumer(
            "events",
            "c",
            ConsumerConfig(start_from=StartFrom.end()),
            nsqd_tcp_addresses=["127.0.0.1:4150"],
        )
    for bad in (
        lambda: StartFrom("special", 0),
        lambda: StartFrom.queue_offset(-1),
        lambda: StartFrom.timestamp(float("nan")),
        lambda: ConsumerConfig(start_from={0: "end"}),  # type: ignore[dict-item]
        lambda: StartFrom.parse("latest"),
    ):
        with pytest.raises(ConfigError):
            bad()
    assert StartFrom.parse("end") == StartFrom.end()
    assert StartFrom.parse("timestamp:1700000000").token() == b"timestamp:1700000000"


# -- the real twins: against a real partitioned cluster (tests/support/partitioned.py) --------


@pytest.fixture(scope="module")
def cluster() -> Iterator[PartitionedCluster]:
    with partitioned_cluster() as running:
        yield running


@pytest.mark.real_nsqd
@NEEDS_CLUSTER
def test_start_from_the_end_of_both_partitions_of_one_node(cluster: PartitionedCluster) -> None:
    # both partitions are led by the one nsqd: the five-token SUB_ADVANCED would move one
    cluster.create_topic("start_end")

    async def main() -> list[nsq_anyio.Message]:
        async with nsq_anyio.Producer(lookupd_http_addresses=[cluster.lookupd_http]) as p:
            for partition in (0, 1):
                for i in range(5):
                    await p.publish("start_end", b"old-%d-%d" % (partition, i), partition=partition)
        async with nsq_anyio.Consumer(
            "start_end",
            "c",
            lookupd_http_addresses=[cluster.lookupd_http],
            start_from=StartFrom.end(),
            max_in_flight=50,
        ) as consumer:
            await anyio.sleep(2.0)  # positions set, subscribed
            async with nsq_anyio.Producer(lookupd_http_addresses=[cluster.lookupd_http]) as p:
                for partition in (0, 1):
                    await p.publish("start_end", b"new-%d" % partition, partition=partition)
            got = []
            with anyio.move_on_after(5.0):
                async for message in consumer:
                    got.append(message)
                    await message.finish()
            return got

    got = anyio.run(main)
    bodies = [(m.partition, m.body) for m in got]
    assert (0, b"new-0") in bodies and (1, b"new-1") in bodies
    # the server's quirk: a channel's reader holds the next message before the move and still
    # hands it out once after it (at most one stale message per partition)
    stale = [b for b in bodies if b[1].startswith(b"old")]
    assert len({p for p, _ in stale}) == len(stale) <= 2


@pytest.mark.real_nsqd
@NEEDS_CLUSTER
def test_start_from_a_message_count_per_partition(cluster: PartitionedCluster) -> None:
    cluster.create_topic("start_count")

    async def main() -> list[nsq_anyio.Message]:
        async with nsq_anyio.Producer(lookupd_http_addresses=[cluster.lookupd_http]) as p:
            for partition in (0, 1):
                for i in range(5):
                    await p.publish("start_count", b"m-%d-%d" % (partition, i), partition=partition)
        # the count covers the partition's whole history: create_topic's probe came first
        # msgcount:N starts at the partition's N-th message: the probe, m-0-0, m-0-1, m-0-2
        # come before the fifth
        start = {0: StartFrom.message_count(5)}
        return await collect(cluster, "start_count", 100, timeout=6.0, start_from=start)

    got = anyio.run(main)
    bodies = sorted((m.partition, m.body) for m in got)
    expected = [(0, b"m-0-3"), (0, b"m-0-4")] + [(1, b"m-1-%d" % i) for i in range(5)]
    assert set(expected) <= set(bodies)
    assert len(bodies) - len(expected) <= 1  # the stale message the reader held, at most
