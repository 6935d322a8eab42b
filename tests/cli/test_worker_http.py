"""``nsq-sansio worker --http-address``: its liveness and readiness probes and its Prometheus
metrics, served by the worker process (a process of its own, as a user runs it) against a
real nsqd and nsqlookupd, on asyncio and on trio; a slow or broken HTTP client; an address
that is taken; the metrics extra missing; and docs/production.md's commands, run."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.cli.worker_support import (
    HANDLERS,
    PY,
    SCRIPT,
    connected,
    handled,
    listener,
    publish,
    wait_until,
    worker,
)
from tests.support import ROOT
from tests.support.extras import program_without
from tests.support.net import free_port
from tests.support.servers import MISSING, NSQD, NSQLOOKUPD, Lookupd, Nsqd

#: the tests that need a real nsqd and nsqlookupd are marked with both
real_nsqd = pytest.mark.real_nsqd
needs_nsqd = pytest.mark.skipif(not (NSQD and NSQLOOKUPD), reason=MISSING)

PAGE = ROOT / "docs" / "production.md"

#: the worker, run as ``python -m nsq_cli`` runs it
_MAIN = 'from nsq_cli import main\n\nsys.exit(main(prog="python -m nsq_cli"))\n'


def without(*modules: str) -> list[str]:
    """The worker's command where ``modules`` cannot be imported (as where not installed)."""
    return program_without(modules, _MAIN)


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[Lookupd, Nsqd]]:
    lookupd = Lookupd()
    nsqd = Nsqd("--mem-queue-size=10000", "--msg-timeout=120s", lookupd=lookupd)
    lookupd.start()
    try:
        nsqd.start()
        yield lookupd, nsqd
    finally:
        nsqd.cleanup()
        lookupd.stop()


@pytest.fixture
def app(tmp_path: Path) -> Path:
    (tmp_path / "handlers.py").write_text(HANDLERS)
    return tmp_path


_topics = iter(range(1_000_000))


@pytest.fixture
def topic() -> str:
    return f"probe{os.getpid()}_{next(_topics)}"


def get(port: int, path: str, method: str = "GET") -> tuple[int, str, dict[str, str]]:
    """The status, body and headers of one request (an error status is an answer)."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            return response.status, response.read().decode(), dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(), dict(exc.headers)


def wait_answer(port: int, path: str, status: int, body: str, timeout: float = 30) -> None:
    """Poll ``path`` until it answers ``status`` with ``body`` (and a newline)."""
    seen: list[Any] = []

    def answered() -> bool:
        got: tuple[int | None, str]
        try:
            got = get(port, path)[:2]
        except OSError as exc:  # not listening yet
            got = (None, repr(exc))
        seen[:] = [got]
        return got == (status, body + "\n")

    try:
        wait_until(answered, timeout, f"{path} answering {status} {body!r}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last answer: {seen}") from None


def samples(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """The samples of /metrics, parsed by prometheus_client: (name, labels) -> value."""
    status, text, _ = get(port, "/metrics")
    assert status == 200, text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def sample(port: int, name: str, **labels: str) -> float | None:
    found = [v for (n, ls), v in samples(port).items() if n == name and set(labels.items()) <= ls]
    assert len(found) <= 1, found
    return found[0] if found else None


def http_args(topic: str, channel: str, port: int, *more: str) -> list[str]:
    return [
        "handlers:handle",
        "--topic",
        topic,
        "--channel",
        channel,
        "--http-address",
        f"127.0.0.1:{port}",
        *more,
    ]


# -- readiness ---------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@real_nsqd
@needs_nsqd
def test_readyz_follows_nsqd_down_up_killed_and_the_stop(
    app: Path, topic: str, backend: str
) -> None:
    """nsqd down at the start: live, not ready; nsqd started: ready; nsqd killed: not ready
    within seconds, still live; back: ready; SIGTERM with a handler holding a message:
    ``stopping`` (still live) until the stop ends."""
    nsqd = Nsqd("--msg-timeout=120s")  # not started yet
    port = free_port()
    args = http_args(topic, "ready", port, "--nsqd-tcp-address", nsqd.tcp_address)
    args += ["--backend", backend, "--reconnect-delay", "0.2", "--max-reconnect-delay", "1"]
    args += ["--stop-timeout", "60"]
    try:
        with worker(app, *args, env={"HANDLER_DELAY": "60"}) as running:
            running.wait_for(f"serving /healthz, /readyz and /metrics on http://127.0.0.1:{port}")
            assert get(port, "/healthz")[:2] == (200, "ok\n")
            wait_answer(port, "/readyz", 503, "not connected to any nsqd")
            assert sample(port, "nsq_worker_ready") == 0
            nsqd.start()
            wait_answer(port, "/readyz", 200, "ok")
            assert sample(port, "nsq_worker_ready") == 1
            nsqd.kill9()
            wait_answer(port, "/readyz", 503, "not connected to any nsqd")
            assert get(port, "/healthz")[:2] == (200, "ok\n")
            nsqd.start()
            wait_answer(port, "/readyz", 200, "ok")
            publish(nsqd, topic, 1)
            wait_until(lambda: sample(port, "nsq_handlers_running") == 1, 30, "a handler running")
            running.signal(signal.SIGTERM)
            wait_answer(port, "/readyz", 503, "stopping")
            assert get(port, "/healthz")[:2] == (200, "ok\n")
            assert sample(port, "nsq_worker_ready") == 0
            assert running.proc.poll() is None  # waiting for its handler
            running.signal(signal.SIGTERM)
            code, _ = running.wait(timeout=30)
            assert code == 143, running.stderr
            assert "Traceback" not in running.stderr
    finally:
        nsqd.cleanup()


@real_nsqd
@needs_nsqd
def test_readyz_is_ready_while_waiting_for_a_topic_created_late(
    cluster: tuple[Lookupd, Nsqd], app: Path, topic: str
) -> None:
    lookupd, nsqd = cluster
    port = free_port()
    args = http_args(topic, "late", port, "--lookupd-http-address", lookupd.http_address)
    args += ["--lookupd-poll-interval", "1"]
    with worker(app, *args) as running:
        # ready (a rollout must not wait for the topic's first publish), and says so
        wait_answer(
            port,
            "/readyz",
            200,
            f"waiting for topic {topic} to exist (nsqlookupd has no producer for it)",
        )
        assert get(port, "/healthz")[:2] == (200, "ok\n")
        publish(nsqd, topic, 3)
        wait_answer(port, "/readyz", 200, "ok", timeout=60)
        wait_until(lambda: len(handled(app)) == 3, 60, "3 messages handled")
        running.signal(signal.SIGTERM)
        assert running.wait(timeout=45)[0] == 0, running.stderr


# -- metrics -----------------------------------------------------------------------------------


def documented_metrics() -> set[str]:
    section = PAGE.read_text().split("### Metrics\n", 1)[1]
    return set(re.findall(r"^\| `(nsq_[a-z_]+)` \| (?:counter|gauge) \|", section, re.M))


@real_nsqd
@needs_nsqd
def test_metrics_count_what_nsqd_counts(
    cluster: tuple[Lookupd, Nsqd], app: Path, topic: str
) -> None:
    """After N messages, /metrics (parsed by prometheus_client) says N received and N
    finished, as nsqd's own /stats does; every metric is on docs/production.md."""
    _, nsqd = cluster
    count = 40
    publish(nsqd, topic, count)
    port = free_port()
    args = http_args(topic, "metered", port, "--nsqd-tcp-address", nsqd.tcp_address)
    args += ["--backend", "trio", "--max-in-flight", "7"]
    with worker(app, *args) as running:
        running.wait_for(f"serving /healthz, /readyz and /metrics on http://127.0.0.1:{port}")
        labels = {"topic": topic, "channel": "metered"}
        wait_until(
            lambda: sample(port, "nsq_messages_finished_total", **labels) == count,
            60,
            f"{count} messages finished",
        )
        status, text, headers = get(port, "/metrics")
        assert status == 200
        assert headers["Content-Type"].startswith("text/plain; version=")
        families = {f.name: f for f in text_string_to_metric_families(text)}
        values = {
            s.name: s.value for f in families.values() for s in f.samples if s.labels == labels
        }
        assert values["nsq_messages_received_total"] == count
        assert values["nsq_messages_finished_total"] == count
        assert values["nsq_messages_requeued_total"] == 0
        assert values["nsq_messages_given_up_total"] == 0
        assert values["nsq_messages_in_flight"] == 0
        assert values["nsq_handlers_running"] == 0
        assert values["nsq_connections"] == 1
        assert values["nsq_connections_subscribed"] == 1
        assert values["nsq_backoff_level"] == 0
        assert values["nsq_worker_ready"] == 1
        per_nsqd = {**labels, "nsqd": nsqd.tcp_address}
        rdy = [s for s in families["nsq_connection_rdy"].samples if s.labels == per_nsqd]
        assert [s.value for s in rdy] == [7]
        in_flight = families["nsq_connection_in_flight"].samples
        assert [(s.labels, s.value) for s in in_flight] == [(per_nsqd, 0)]
        assert families["nsq_messages_finished"].type == "counter"
        assert families["nsq_handlers_running"].type == "gauge"
        # nsqd counts the same messages on the channel
        channel = nsqd.channel(topic, "metered")
        assert channel is not None
        assert channel["message_count"] == count
        # each metric is documented, and each documented metric is served
        served = {s.name for f in families.values() for s in f.samples}
        assert served == documented_metrics()
        running.signal(signal.SIGTERM)
        assert running.wait(timeout=45)[0] == 0, running.stderr


@real_nsqd
@needs_nsqd
def test_without_prometheus_client_the_probes_answer_and_metrics_says_what_to_install(
    cluster: tuple[Lookupd, Nsqd], app: Path, topic: str
) -> None:
    _, nsqd = cluster
    publish(nsqd, topic, 2)
    port = free_port()
    args = http_args(topic, "bare", port, "--nsqd-tcp-address", nsqd.tcp_address)
    missing = '/metrics needs prometheus_client, which is not installed: pip install "nsq-sansio[metrics]"'
    with worker(app, *args, program=without("prometheus_client")) as running:
        line = running.wait_for("serving /healthz and /readyz on")
        assert line.rstrip().endswith(f"/metrics answers 501: {missing}"), line
        assert get(port, "/healthz")[:2] == (200, "ok\n")
        wait_answer(port, "/readyz", 200, "ok")
        assert get(port, "/metrics")[:2] == (501, missing + "\n")
        wait_until(lambda: len(handled(app)) == 2, 60, "2 messages handled")
        running.signal(signal.SIGTERM)
        assert running.wait(timeout=45)[0] == 0, running.stderr
    assert running.stderr.count("nsq-sansio[metrics]") == 1, running.stderr
    assert "Traceback" not in running.stderr


@real_nsqd
@needs_nsqd
def test_without_http_address_nothing_of_it_is_loaded(
    cluster: tuple[Lookupd, Nsqd], app: Path, topic: str
) -> None:
    """The HTTP and metrics modules cannot even be imported here: the worker runs as ever."""
    _, nsqd = cluster
    publish(nsqd, topic, 3)
    args = ["handlers:handle", "--topic", topic, "--channel", "plain"]
    args += ["--nsqd-tcp-address", nsqd.tcp_address]
    program = without("prometheus_client", "nsq_cli._probes", "nsq_cli._metrics")
    with worker(app, *args, program=program) as running:
        wait_until(lambda: len(handled(app)) == 3, 60, "3 messages handled")
        running.signal(signal.SIGTERM)
        assert running.wait(timeout=45)[0] == 0, running.stderr
    assert "Traceback" not in running.stderr
    assert "serving" not in running.stderr
    assert "http_address=- " in running.stderr


# -- HTTP ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("how", "backend"), [("flag", "asyncio"), ("env", "trio")])
def test_an_http_address_in_use_is_one_error_line_and_exit_2_before_any_connection(
    app: Path, how: str, backend: str
) -> None:
    with socket.socket() as taken, listener() as (nsqd_address, nsqd):
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        args = ["handlers:handle", "--topic", "t", "--channel", "c"]
        args += ["--nsqd-tcp-address", nsqd_address, "--backend", backend]
        env = {}
        if how == "flag":
            args += ["--http-address", address]
        else:
            env["NSQ_HTTP_ADDRESS"] = address
        with worker(app, *args, env=env) as running:
            code, _ = running.wait(timeout=30)
        assert code == 2, running.stderr
        assert running.stderr.splitlines() == [
            f"python -m nsq_cli worker: error: cannot listen on {address} (--http-address): "
            "Address already in use"
        ]
        assert not connected(nsqd)


def read_until_closed(sock: socket.socket, timeout: float) -> bytes:
    """What the peer sent until it closed (a reset after an answer counts as closed)."""
    sock.settimeout(timeout)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    return data


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_slow_or_broken_client_does_not_hold_the_probes_up(app: Path, backend: str) -> None:
    """Half a request, then silence: other clients are answered meanwhile, and the silent one
    is closed after 10 s; a request head over 16 KiB is refused (431); other paths and
    methods are 404 and 405."""
    port = free_port()
    nowhere = f"127.0.0.1:{free_port()}"  # no nsqd: the probes are answered all the same
    args = http_args("t", "c", port, "--nsqd-tcp-address", nowhere, "--backend", backend)
    with worker(app, *args) as running:
        wait_answer(port, "/healthz", 200, "ok")
        opened = time.monotonic()
        with socket.create_connection(("127.0.0.1", port)) as silent:
            silent.sendall(b"GET /healthz HTTP/1.1\r\nHost: wor")
            for _ in range(3):
                assert get(port, "/healthz")[:2] == (200, "ok\n")
            assert get(port, "/readyz")[0] == 503
            assert get(port, "/healthz", method="HEAD")[:2] == (200, "")
            assert get(port, "/nowhere")[0] == 404
            status, body, headers = get(port, "/healthz", method="POST")
            assert (status, body) == (405, "method POST is not allowed: GET or HEAD\n")
            assert headers["Allow"] == "GET, HEAD"
            with socket.create_connection(("127.0.0.1", port)) as big:
                big.sendall(b"GET /healthz HTTP/1.1\r\nHost: w\r\nX-Big: " + b"a" * 20000)
                answer = read_until_closed(big, 60)
            assert answer == b"" or answer.startswith(b"HTTP/1.1 431 "), answer
            assert get(port, "/healthz")[:2] == (200, "ok\n")
            # the silent client, closed by the worker once its 10 s are over
            assert read_until_closed(silent, 60) == b""
            assert time.monotonic() - opened > 9.5
        assert get(port, "/healthz")[:2] == (200, "ok\n")
        running.signal(signal.SIGTERM)
        assert running.wait(timeout=45)[0] == 0, running.stderr
    assert "Traceback" not in running.stderr


# -- docs/production.md ------------------------------------------------------------------------


def sh_blocks(text: str) -> list[str]:
    return re.findall(r"^```sh\n(.*?)^```", text, re.S | re.M)


@real_nsqd
@needs_nsqd
def test_the_production_pages_commands_run_as_written(
    cluster: tuple[Lookupd, Nsqd], tmp_path: Path, topic: str
) -> None:
    """The page's worker command (its addresses replaced by this test's), with the page's
    handler module, then its curl commands: each prints what its comment says."""
    if shutil.which("curl") is None:
        pytest.skip("no curl")
    lookupd, nsqd = cluster
    text = PAGE.read_text()
    handler = re.search(r"^```python\n(# myapp/handlers\.py\n.*?)^```", text, re.S | re.M)
    assert handler is not None
    (tmp_path / "myapp").mkdir()
    (tmp_path / "myapp" / "handlers.py").write_text(handler[1])
    port = free_port()

    def local(line: str) -> str:
        line = line.replace("127.0.0.1:4161", lookupd.http_address)
        line = line.replace("127.0.0.1:9000", f"127.0.0.1:{port}")
        return line.replace("clicks", topic)

    run, probes = (b for b in sh_blocks(text) if "nsq-sansio worker" in b or "curl" in b)
    command = " ".join(
        line.rstrip("\\ ")
        for line in run.splitlines()
        if line.strip() and not line.startswith("pip install")
    )
    argv = shlex.split(local(command))
    assert argv[:2] == ["nsq-sansio", "worker"], argv
    publish(nsqd, topic, 3)
    with worker(tmp_path, *argv[2:], program=SCRIPT) as running:
        wait_answer(port, "/readyz", 200, "ok", timeout=60)
        wait_until(
            lambda: sample(port, "nsq_messages_finished_total") == 3, 60, "3 messages finished"
        )
        lines = [line for line in probes.splitlines() if line.strip()]
        assert len(lines) == 3
        for line in lines:
            shell, _, expected = local(line).partition("  # ")
            out = subprocess.run(
                ["bash", "-c", shell], capture_output=True, text=True, timeout=30, check=False
            )
            assert out.stdout.strip() == expected, (line, out.stdout, out.stderr)
        running.signal(signal.SIGTERM)
        assert running.wait(timeout=45)[0] == 0, running.stderr
    assert "Traceback" not in running.stderr


def test_the_kubernetes_example_stops_within_its_grace_period_and_probes_the_worker() -> None:
    """The page's Deployment: parsed as YAML, its grace period above the worker's stop
    timeout, its probes on the worker's HTTP port, the scrape annotations on that port."""
    yaml: Any = pytest.importorskip("yaml")
    block = re.search(r"^```yaml\n(.*?)^```", PAGE.read_text(), re.S | re.M)
    assert block is not None
    deployment = yaml.safe_load(block[1])
    assert deployment["kind"] == "Deployment"
    pod = deployment["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    assert container["args"][:2] == ["nsq-sansio", "worker"]
    env = {e["name"]: e["value"] for e in container["env"]}
    stop_timeout = float(env["NSQ_STOP_TIMEOUT"])
    assert pod["spec"]["terminationGracePeriodSeconds"] > stop_timeout
    host, _, port = env["NSQ_HTTP_ADDRESS"].rpartition(":")
    assert host == "0.0.0.0"
    (named,) = container["ports"]
    assert named["containerPort"] == int(port)
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": named["name"]}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": named["name"]}
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == port
    assert annotations["prometheus.io/path"] == "/metrics"
    # the options it sets are the worker's: its variables
    for name in env:
        assert f"`{name}`" in (ROOT / "docs" / "cli.md").read_text(), name


def test_the_help_and_the_pages_name_the_http_address() -> None:
    out = subprocess.run(
        [*PY, "worker", "--help"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0, out.stderr
    assert "--http-address HOST:PORT" in out.stdout
    assert "(env NSQ_HTTP_ADDRESS)" in " ".join(out.stdout.split())
    for page in ("cli.md", "production.md"):
        assert "| `--http-address` | `NSQ_HTTP_ADDRESS` |" in (ROOT / "docs" / page).read_text()
