"""The partitioned extension against a real single-node partitioned cluster (youzan/nsq nsqd and
nsqlookupd, and etcd with the v2 API; ``tests/support/partitioned.py``), on loopback.

Runs when ``NSQD_PARTITIONED``, ``NSQLOOKUPD_PARTITIONED`` and ``ETCD`` point at the binaries;
skipped otherwise, with the reason.  The emulator twins of these scenarios run everywhere
(``tests/proto/test_producer_x_emulator.py``, ``test_ext_filter.py``,
``test_start_positions_x_emulator.py``).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

import nsq_anyio
from nsq_proto import ExtFilter, LocalProtocolError, ServerError, StartFrom
from nsq_proto.wire import partition_for_key
from tests.support import ROOT
from tests.support.partitioned import (
    NEEDS_CLUSTER,
    PartitionedCluster,
    collect,
    partitioned_cluster,
)

pytestmark = [pytest.mark.real_nsqd, NEEDS_CLUSTER]


@pytest.fixture(scope="module")
def cluster() -> Iterator[PartitionedCluster]:
    with partitioned_cluster() as running:
        yield running


def test_ordered_publishes_arrive_in_call_order_per_partition(cluster: PartitionedCluster) -> None:
    cluster.create_topic("ordered_calls", orderedmulti="true")
    keys = [f"customer-{i}" for i in range(6)]
    sent = [(keys[i % len(keys)], f"{keys[i % len(keys)]}:{i}".encode()) for i in range(120)]

    async def main() -> list[nsq_anyio.Message]:
        async with nsq_anyio.Producer(
            lookupd_http_addresses=[cluster.lookupd_http], max_outstanding=8
        ) as producer:
            async with anyio.create_task_group() as tg:
                # concurrent publishers, one per key: each key's calls are ordered
                for key in keys:

                    async def publish_key(key: str = key) -> None:
                        for k, body in sent:
                            if k == key:
                                await producer.publish("ordered_calls", body, sharding_key=k)

                    tg.start_soon(publish_key)
        return await collect(cluster, "ordered_calls", len(sent), ordered=True)

    got = anyio.run(main)
    bodies = [m.body for m in got]
    assert sorted(bodies) == sorted(body for _, body in sent)
    for key in keys:
        mine = [b for b in bodies if b.startswith(key.encode() + b":")]
        assert mine == [body for k, body in sent if k == key]  # call order, no duplicate
    by_partition = {m.partition for m in got}
    assert by_partition == {0, 1}


def test_a_refused_publish_fails_alone_and_its_neighbours_are_stored_once(
    cluster: PartitionedCluster,
) -> None:
    # E_EXT_NOT_SUPPORT (a header to a plain topic) is non-fatal: the pipelined publishes
    # behind it were stored; before, the connection closed and they were sent again
    cluster.create_topic("refusals")

    async def main() -> tuple[list[Any], list[nsq_anyio.Message]]:
        async with nsq_anyio.Producer(
            lookupd_http_addresses=[cluster.lookupd_http], max_outstanding=8
        ) as producer:
            results: list[Any] = [None] * 5

            async def one(i: int) -> None:
                ext = {"k": "v"} if i == 1 else None
                try:
                    results[i] = await producer.publish(
                        "refusals", b"r%d" % i, partition=0, ext=ext
                    )
                except ServerError as exc:
                    results[i] = exc

            async with anyio.create_task_group() as tg:
                for i in range(5):
                    tg.start_soon(one, i)
        return results, await collect(cluster, "refusals", 5, timeout=5.0)

    results, got = anyio.run(main)
    assert isinstance(results[1], ServerError) and results[1].code == "E_EXT_NOT_SUPPORT"
    assert sorted(m.body for m in got) == [b"r0", b"r2", b"r3", b"r4"]


def test_concurrent_publishes_with_headers_keep_each_its_own_header(
    cluster: PartitionedCluster,
) -> None:
    """One command on the wire at a time (max_outstanding=1): the publishes that wait go as
    MPUB_EXT, each message with its own header, to the partition asked for."""
    cluster.create_topic("headers_many", extend="true")
    bodies = [b"h%d" % i for i in range(40)]

    async def main() -> list[nsq_anyio.Message]:
        async with nsq_anyio.Producer(
            lookupd_http_addresses=[cluster.lookupd_http], max_outstanding=1
        ) as producer:
            async with anyio.create_task_group() as tg:
                for i, body in enumerate(bodies):
                    tg.start_soon(
                        functools.partial(
                            producer.publish, "headers_many", body, partition=1, ext={"n": str(i)}
                        )
                    )
        return await collect(cluster, "headers_many", len(bodies))

    got = anyio.run(main)
    assert sorted(m.body for m in got) == sorted(bodies)
    assert all(m.ext == {"n": m.body[1:].decode()} for m in got)
    assert {m.partition for m in got} == {1}


def test_the_server_filters_by_the_json_header(cluster: PartitionedCluster) -> None:
    cluster.create_topic("filtered", extend="true")

    async def main() -> list[nsq_anyio.Message]:
        async with nsq_anyio.Producer(lookupd_http_addresses=[cluster.lookupd_http]) as p:
            for i, region in enumerate(["eu", "us", "eu", "ap"]):
                await p.publish("filtered", b"f%d" % i, partition=0, ext={"region": region})
        return await collect(
            cluster, "filtered", 2, timeout=5.0, ext_filter=ExtFilter.exact("region", "eu")
        )

    got = anyio.run(main)
    assert sorted(m.body for m in got) == [b"f0", b"f2"]


def test_keys_go_where_the_hasher_says(cluster: PartitionedCluster) -> None:
    cluster.create_topic("hashed", orderedmulti="true")
    keys = ["hello", "publish_test_case", "order-10001", "12345"]

    async def main() -> list[nsq_anyio.Message]:
        async with nsq_anyio.Producer(lookupd_http_addresses=[cluster.lookupd_http]) as p:
            for key in keys:
                await p.publish("hashed", key.encode(), sharding_key=key)
        return await collect(cluster, "hashed", len(keys), ordered=True)

    got = anyio.run(main)
    assert {m.body.decode(): m.partition for m in got} == {
        key: partition_for_key(key, 2) for key in keys
    }


def test_unroutable_and_deferred_publishes_fail_at_once(cluster: PartitionedCluster) -> None:
    cluster.create_topic("routes")

    async def main() -> None:
        async with nsq_anyio.Producer(
            lookupd_http_addresses=[cluster.lookupd_http], publish_timeout=30.0
        ) as p:
            await p.publish("routes", b"x", partition=1)  # the route is known from here on
            started = time.monotonic()
            with pytest.raises(LocalProtocolError, match="no partition 7"):
                await p.publish("routes", b"x", partition=7)
            with pytest.raises(LocalProtocolError, match="DPUB"):
                await p.publish("routes", b"x", delay=1.0)
            assert time.monotonic() - started < 1.0

    anyio.run(main)


def test_internal_ids_of_a_partition_count_from_its_commit_log_start(
    cluster: PartitionedCluster,
) -> None:
    # what the emulator reproduces: partition p's ids start at p << 50
    cluster.create_topic("ids")

    async def main() -> list[int]:
        async with nsq_anyio.Producer(lookupd_http_addresses=[cluster.lookupd_http]) as p:
            receipts = [await p.publish("ids", b"x", partition=q, trace_id=1) for q in (0, 1)]
        return [r.internal_id for r in receipts if r is not None]

    ids = anyio.run(main)
    assert [i >> 50 for i in ids] == [0, 1]
    print(
        f"first internal ids: partition 0 -> {ids[0]}, partition 1 -> {ids[1] - (1 << 50)} + 1<<50"
    )


def test_the_example_of_the_partitioned_page_runs_against_the_cluster(
    cluster: PartitionedCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    """The page's nsq_anyio example (which the docs runner cannot serve: it needs a
    partitioned cluster behind nsqlookupd) runs here, as written, against the real one."""
    page = (ROOT / "docs" / "partitioned.md").read_text()
    code = page.split("With `nsq_anyio` the same reads:", 1)[1]
    code = code.split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict[str, Any] = {"__name__": "docs_partitioned"}
    exec(compile(code, "docs/partitioned.md", "exec"), namespace)
    cluster.create_topic("orders", orderedmulti="true", extend="true")

    async def main() -> None:
        with anyio.move_on_after(5.0):  # the consumer runs until it is stopped
            await namespace["ship"](cluster.lookupd_http)

    anyio.run(main)
    printed = capsys.readouterr().out
    assert "TraceReceipt(" in printed, printed


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
