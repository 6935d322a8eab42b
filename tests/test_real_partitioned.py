"""The partitioned extension against a real single-node partitioned cluster (youzan/nsq nsqd and
nsqlookupd, and etcd with the v2 API), on loopback.

Runs when ``NSQD_PARTITIONED``, ``NSQLOOKUPD_PARTITIONED`` and ``ETCD`` point at the binaries;
skipped otherwise, with the reason.  The emulator twins of these scenarios run everywhere
(``tests/core_x_emulator/test_publish_retries.py``, ``test_start_from.py``, ``test_ext_filter.py``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest

import nsq_anyio
from nsq_proto import ExtFilter, LocalProtocolError, ServerError, StartFrom
from nsq_proto.wire import partition_for_key
from tests.support.net import free_port, wait_http

NSQD = os.environ.get("NSQD_PARTITIONED")
NSQLOOKUPD = os.environ.get("NSQLOOKUPD_PARTITIONED")
ETCD = os.environ.get("ETCD") or shutil.which("etcd")

pytestmark = [
    pytest.mark.real_nsqd,
    pytest.mark.skipif(
        not (NSQD and NSQLOOKUPD and ETCD),
        reason=(
            "no real partitioned cluster: set NSQD_PARTITIONED and NSQLOOKUPD_PARTITIONED to "
            "youzan/nsq's binaries and ETCD to an etcd with the v2 API to run these"
        ),
    ),
]

#: how long a new topic of the real cluster may take to accept writes
WRITABLE_WITHIN = 180.0


def http(method: str, url: str, body: bytes | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@dataclass
class PartitionedCluster:
    lookupd_http: str
    nsqd_tcp: str
    nsqd_http: str

    def create_topic(self, topic: str, partitions: int = 2, **flags: str) -> None:
        """Create ``topic`` and channel ``c`` on each partition, once the topic takes writes.

        A new topic refuses writes (``E_FAILED_ON_NOT_LEADER``) until nsqlookupd's check has
        run, which it skips when its last full check was under 6 s ago: the create is sent
        again every 7 s.  A probe message tells when a partition takes writes; the channel,
        created afterwards, starts at the end and never sees the probes."""
        query = f"topic={topic}&partition_num={partitions}&replicator=1&multipart=true"
        for key, value in flags.items():
            query += f"&{key}={value}"
        create = f"http://{self.lookupd_http}/topic/create?{query}"
        status, body = http("POST", create)
        assert status == 200, body
        deadline = time.monotonic() + WRITABLE_WITHIN
        last_create = time.monotonic()
        for p in range(partitions):
            probe = f"http://{self.nsqd_http}/pub?topic={topic}&partition={p}"
            while http("POST", probe, b"probe")[0] != 200:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"topic {topic!r} not writable after {WRITABLE_WITHIN} s")
                if time.monotonic() - last_create > 7.0:
                    http("POST", create)
                    last_create = time.monotonic()
                time.sleep(0.5)
        for p in range(partitions):
            channel = (
                f"http://{self.nsqd_http}/channel/create?topic={topic}&partition={p}&channel=c"
            )
            while http("POST", channel)[0] != 200:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no channel on {topic!r} after {WRITABLE_WITHIN} s")
                time.sleep(0.5)
        lookup = f"http://{self.lookupd_http}/lookup?topic={topic}&access=w&metainfo=true"
        while True:
            status, body = http("GET", lookup)
            answer = json.loads(body) if status == 200 else {}
            answer = answer.get("data", answer)  # the legacy envelope, without an Accept
            if len(answer.get("partitions", {})) == partitions:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"lookupd does not list {topic!r} for writes: {body!r}")
            time.sleep(0.5)


@pytest.fixture(scope="module")
def cluster() -> Iterator[PartitionedCluster]:
    assert NSQD and NSQLOOKUPD and ETCD
    root = tempfile.mkdtemp(prefix="pcluster-test-")
    (etcd_client, etcd_peer, lk_tcp, lk_http, lk_rpc, lk_metric) = (free_port() for _ in range(6))
    (nd_tcp, nd_http, nd_https, nd_rpc, nd_metric) = (free_port() for _ in range(5))
    cluster_id = f"test-{os.getpid()}"
    etcd_url = f"http://127.0.0.1:{etcd_client}"
    commands = [
        (
            [
                ETCD,
                "--name=pcluster",
                f"--data-dir={root}/etcd",
                "--enable-v2",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls=http://127.0.0.1:{etcd_peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}",
                f"--initial-cluster=pcluster=http://127.0.0.1:{etcd_peer}",
            ],
            f"{etcd_url}/health",
        ),
        (
            [
                NSQLOOKUPD,
                f"--tcp-address=127.0.0.1:{lk_tcp}",
                f"--http-address=127.0.0.1:{lk_http}",
                f"--rpc-port={lk_rpc}",
                f"--metric-address=127.0.0.1:{lk_metric}",
                "--broadcast-interface=lo",
                "--broadcast-address=127.0.0.1",
                f"--cluster-id={cluster_id}",
                f"--cluster-leadership-addresses={etcd_url}",
                f"--log-dir={root}",
            ],
            f"http://127.0.0.1:{lk_http}/ping",
        ),
        (
            [
                NSQD,
                f"--tcp-address=127.0.0.1:{nd_tcp}",
                f"--http-address=127.0.0.1:{nd_http}",
                f"--https-address=127.0.0.1:{nd_https}",
                f"--rpc-port={nd_rpc}",
                f"--metric-address=127.0.0.1:{nd_metric}",
                "--broadcast-interface=lo",
                "--broadcast-address=127.0.0.1",
                f"--lookupd-tcp-address=127.0.0.1:{lk_tcp}",
                f"--cluster-id={cluster_id}",
                f"--cluster-leadership-addresses={etcd_url}",
                f"--data-path={root}/nsqd",
                f"--log-dir={root}",
            ],
            f"http://127.0.0.1:{nd_http}/ping",
        ),
    ]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for argv, ping in commands:
            with open(f"{root}/{os.path.basename(argv[0])}.log", "wb") as log:
                procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT))
            wait_http(ping, timeout=30.0)
        yield PartitionedCluster(
            f"127.0.0.1:{lk_http}", f"127.0.0.1:{nd_tcp}", f"127.0.0.1:{nd_http}"
        )
    finally:
        for proc in reversed(procs):
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(root, ignore_errors=True)


async def collect(
    cluster: PartitionedCluster, topic: str, count: int, timeout: float = 20.0, **options: Any
) -> list[nsq_anyio.Message]:
    """``count`` messages of ``topic``/``c`` (finished), or what came within ``timeout``."""
    got: list[nsq_anyio.Message] = []
    options.setdefault("max_in_flight", 50)  # one message per connection at least
    async with nsq_anyio.Consumer(
        topic, "c", lookupd_http_addresses=[cluster.lookupd_http], **options
    ) as consumer:
        with anyio.move_on_after(timeout):
            async for message in consumer:
                got.append(message)
                await message.finish()
                if len(got) >= count:
                    break
    return got


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
    page = (Path(__file__).parent.parent / "docs" / "partitioned.md").read_text()
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
