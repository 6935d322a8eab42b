"""A real single-node partitioned cluster (youzan/nsq nsqd and nsqlookupd, and etcd with the v2
API) on loopback, for the tests against it (``tests/real/test_partitioned.py``).

The binaries come from ``NSQD_PARTITIONED``, ``NSQLOOKUPD_PARTITIONED`` and ``ETCD`` (etcd is
also found on PATH); :data:`NEEDS_CLUSTER` skips a test without them, with the reason."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import anyio
import pytest

import nsq_anyio

from .net import PortTaken, free_ports, http, wait_serving

NSQD = os.environ.get("NSQD_PARTITIONED")
NSQLOOKUPD = os.environ.get("NSQLOOKUPD_PARTITIONED")
ETCD = os.environ.get("ETCD") or shutil.which("etcd")

#: skips a test when a binary is missing (mark it ``real_nsqd`` too)
NEEDS_CLUSTER = pytest.mark.skipif(
    not (NSQD and NSQLOOKUPD and ETCD),
    reason=(
        "no real partitioned cluster: set NSQD_PARTITIONED and NSQLOOKUPD_PARTITIONED to "
        "youzan/nsq's binaries and ETCD to an etcd with the v2 API to run these"
    ),
)

#: how long a new topic of the real cluster may take to accept writes
WRITABLE_WITHIN = 180.0


@dataclass
class PartitionedCluster:
    lookupd_http: str
    nsqd_tcp: str
    nsqd_http: str

    def create_topic(self, topic: str, partitions: int = 2, **flags: str) -> None:
        """Create ``topic`` and channel ``c`` on each partition, once the topic takes writes.

        A new topic refuses writes (``E_FAILED_ON_NOT_LEADER``) until nsqlookupd's check has
        run, which it skips when its last full check was under 6 s ago: the create is sent
        again every 7 s.  It is refused (``No node is available``) until nsqd has registered.  A probe message tells when a partition takes writes; the channel,
        created afterwards, starts at the end and never sees the probes."""
        query = f"topic={topic}&partition_num={partitions}&replicator=1&multipart=true"
        for key, value in flags.items():
            query += f"&{key}={value}"
        create = f"http://{self.lookupd_http}/topic/create?{query}"
        deadline = time.monotonic() + WRITABLE_WITHIN
        # nsqlookupd has no node to put the partitions on until nsqd's registration (through
        # etcd) reached it, which a loaded machine delays past nsqd's /ping
        status, body = http("POST", create)
        while status != 200 and b"No node is available" in body:
            if time.monotonic() > deadline:
                break
            time.sleep(0.5)
            status, body = http("POST", create)
        assert status == 200, body
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


@contextlib.contextmanager
def partitioned_cluster() -> Iterator[PartitionedCluster]:
    """One etcd, one nsqlookupd and one nsqd of the partitioned server on free loopback
    ports, stopped (and their files removed) on leaving."""
    assert NSQD and NSQLOOKUPD and ETCD
    for attempt in range(5):
        root = tempfile.mkdtemp(prefix="pcluster-test-")
        try:
            procs, cluster = _start_cluster(root, free_ports(11))
        except PortTaken:  # another process bound one of the ports first: again on others
            shutil.rmtree(root, ignore_errors=True)
            if attempt == 4:
                raise
            continue
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise
        break
    try:
        yield cluster
    finally:
        _stop(procs)
        shutil.rmtree(root, ignore_errors=True)


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in reversed(procs):
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _start_cluster(
    root: str, ports: list[int]
) -> tuple[list[subprocess.Popen[bytes]], PartitionedCluster]:
    assert NSQD and NSQLOOKUPD and ETCD
    (etcd_client, etcd_peer, lk_tcp, lk_http, lk_rpc, lk_metric) = ports[:6]
    (nd_tcp, nd_http, nd_https, nd_rpc, nd_metric) = ports[6:]
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
            [etcd_client, etcd_peer],
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
            [lk_tcp, lk_http],
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
            [nd_tcp, nd_http],
        ),
    ]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for argv, ping, listens in commands:
            with open(f"{root}/{os.path.basename(argv[0])}.log", "wb") as log:
                procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT))
            wait_serving(procs[-1], ping, listens, timeout=30.0)
    except BaseException:
        _stop(procs)
        raise
    cluster = PartitionedCluster(
        f"127.0.0.1:{lk_http}", f"127.0.0.1:{nd_tcp}", f"127.0.0.1:{nd_http}"
    )
    return procs, cluster


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
