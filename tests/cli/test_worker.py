"""``nsq-sansio worker``, run as a user runs it (a process of its own, a handler module in a
directory of the application's), against a real nsqd and nsqlookupd: signals and exit
statuses, nothing lost under load, the handler loaded or refused before any connection, the
options from flags and environment variables, the summary lines."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

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
from tests.support.servers import MISSING, NSQD, NSQLOOKUPD, Lookupd, Nsqd

pytestmark = [
    pytest.mark.real_nsqd,
    pytest.mark.skipif(not (NSQD and NSQLOOKUPD), reason=MISSING),
]


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[Lookupd, Nsqd]]:
    lookupd = Lookupd()
    # messages in memory (the load tests publish thousands), and a short --msg-timeout: what a
    # killed worker held comes back after 3 s rather than a minute
    nsqd = Nsqd(
        "--mem-queue-size=100000", "--sync-every=10000", "--msg-timeout=3s", lookupd=lookupd
    )
    lookupd.start()
    try:
        nsqd.start()
        yield lookupd, nsqd
    finally:
        nsqd.cleanup()
        lookupd.stop()


@pytest.fixture
def app(tmp_path: Path) -> Path:
    """The application's directory, holding its handler module ``handlers``."""
    (tmp_path / "handlers.py").write_text(HANDLERS)
    return tmp_path


_topics = iter(range(1_000_000))


@pytest.fixture
def topic() -> str:
    return f"work{os.getpid()}_{next(_topics)}"


def channel_stats(nsqd: Nsqd, topic: str, channel: str) -> dict[str, Any]:
    found = nsqd.channel(topic, channel)
    assert found is not None, f"no channel {topic}/{channel} on nsqd"
    return found


def in_flight_zero(nsqd: Nsqd, topic: str, channel: str) -> bool:
    return int(channel_stats(nsqd, topic, channel)["in_flight_count"]) == 0


# -- stopping ----------------------------------------------------------------------------------


def test_sigterm_under_load_stops_gracefully_and_loses_nothing(
    cluster: tuple[Lookupd, Nsqd], app: Path, topic: str
) -> None:
    """Thousands of messages, hundreds in flight, handlers sleeping: SIGTERM ends the worker
    with exit status 0 within --stop-timeout; every message was handled once or waits in the
    channel, nothing in flight; a second worker handles the rest, each message once in all."""
    lookupd, nsqd = cluster
    bodies = publish(nsqd, topic, 5000)
    args = (
        "handlers:handle",
        "--topic",
        topic,
        "--channel",
        "load",
        "--lookupd-http-address",
        lookupd.http_address,
        "--max-in-flight",
        "300",
        "--concurrency",
        "300",
        "--stop-timeout",
        "15",
        "--stats-interval",
        "1",
    )
    env = {"HANDLER_DELAY": "0.05"}
    with worker(app, *args, env=env) as first:
        wait_until(lambda: len(handled(app)) >= 500, 60, "500 messages handled")
        assert len(handled(app)) < len(bodies)  # still under load
        first.signal(signal.SIGTERM)
        code, seconds = first.wait(timeout=15 + 30)
        assert code == 0, first.stderr
        assert seconds < 15 + 10, first.stderr
        assert "SIGTERM: stopping gracefully" in first.stderr
        assert "Traceback" not in first.stderr
    done = handled(app)
    assert not [body for body, n in Counter(done).items() if n > 1]  # each once
    # the worker's last line counts what nsqd sees: every message received was answered
    last = re.search(
        r"worker stopped: received (\d+), finished (\d+), requeued (\d+)", first.stderr
    )
    assert last is not None, first.stderr
    received, finished, requeued = map(int, last.groups())
    assert finished == len(done)
    assert received == finished + requeued
    assert set(done) <= set(bodies)
    wait_until(lambda: in_flight_zero(nsqd, topic, "load"), 5, "nothing in flight")
    stats = channel_stats(nsqd, topic, "load")
    assert len(done) + int(stats["depth"]) + int(stats["deferred_count"]) == len(bodies)
    # the rest, handled by the next worker: every message once in all
    with worker(app, *args) as second:
        wait_until(lambda: len(handled(app)) >= len(bodies), 120, "every message handled")
        second.signal(signal.SIGTERM)
        assert second.wait(timeout=45)[0] == 0, second.stderr
    assert sorted(handled(app)) == sorted(bodies)


def test_sigkill_then_restart_handles_every_message_at_least_once(
    cluster: tuple[Lookupd, Nsqd], app: Path, topic: str
) -> None:
    """A worker killed with SIGKILL answers nothing more: nsqd delivers again what it held
    (after msg_timeout), and the worker started again handles every message."""
    _, nsqd = cluster
    bodies = publish(nsqd, topic, 3000)
    args = (
        "handlers:handle",
        "--topic",
        topic,
        "--channel",
        "kill",
        "--nsqd-tcp-address",
        nsqd.tcp_address,
        "--max-in-flight",
        "200",
        "--concurrency",
        "200",
    )
    with worker(app, *args, env={"HANDLER_DELAY": "0.05"}) as first:
        wait_until(lambda: len(handled(app)) >= 300, 60, "300 messages handled")
        first.proc.kill()
        first.wait(timeout=10)
    assert len(set(handled(app))) < len(bodies)
    with worker(app, *args, "--stats-interval", "1") as second:
        wait_until(lambda: set(handled(app)) >= set(bodies), 120, "every message handled")
        second.signal(signal.SIGTERM)
        assert second.wait(timeout=45)[0] == 0, second.stderr
    assert set(handled(app)) == set(bodies)
    wait_until(lambda: in_flight_zero(nsqd, topic, "kill"), 10, "nothing in flight")
    assert int(channel_stats(nsqd, topic, "kill")["depth"]) == 0


@pytest.mark.parametrize(
    ("signum", "status", "handler"),
    [(signal.SIGTERM, 143, "handlers:handle"), (signal.SIGINT, 130, "handlers:plain")],
    ids=["TERM-async", "INT-plain"],
)
def test_a_second_signal_stops_at_once_and_requeues_what_was_held(
    cluster: tuple[Lookupd, Nsqd], app: Path, topic: str, signum: int, status: int, handler: str
) -> None:
    """Handlers that would take a minute (async, or plain in threads): the first signal waits
    for them (up to --stop-timeout), the second ends the worker at once with 128 + the
    signal's number, and the messages held go back to nsqd (none left in flight) without
    being handled."""
    _, nsqd = cluster
    publish(nsqd, topic, 200)
    args = (
        handler,
        "--topic",
        topic,
        "--channel",
        "twice",
        "--nsqd-tcp-address",
        nsqd.tcp_address,
        "--max-in-flight",
        "50",
        "--concurrency",
        "50",
        "--stop-timeout",
        "60",
        "--msg-timeout",
        "120",
    )
    with worker(app, *args, env={"HANDLER_DELAY": "60"}) as running:
        wait_until(
            lambda: (nsqd.channel(topic, "twice") or {}).get("in_flight_count") == 50,
            30,
            "50 messages in flight",
        )
        running.signal(signum)
        running.wait_for("stopping gracefully")
        time.sleep(0.5)
        assert running.proc.poll() is None  # waiting for its handlers
        running.signal(signum)
        code, seconds = running.wait(timeout=30)
        assert code == status, running.stderr
        assert seconds < 15, running.stderr
        # its own way out, every message held given back (not the 10 s backstop's exit)
        assert "worker stopped: received 50, finished 0, requeued 50," in running.stderr
        assert "Traceback" not in running.stderr
    wait_until(lambda: in_flight_zero(nsqd, topic, "twice"), 10, "nothing in flight")
    stats = channel_stats(nsqd, topic, "twice")
    assert int(stats["depth"]) + int(stats["deferred_count"]) == 200
    assert handled(app) == []


@pytest.mark.parametrize(
    ("signum", "handler", "backend"),
    [
        (signal.SIGTERM, "handlers:handle", "asyncio"),
        (signal.SIGINT, "handlers:plain", "trio"),
    ],
    ids=["TERM-async-asyncio", "INT-plain-trio"],
)
def test_handlers_still_running_at_the_stop_timeout_have_their_messages_requeued(
    cluster: tuple[Lookupd, Nsqd], app: Path, topic: str, signum: int, handler: str, backend: str
) -> None:
    """A graceful stop waits --stop-timeout for the handlers in progress, no longer: their
    messages go back to nsqd, the worker says so and ends with exit status 0."""
    _, nsqd = cluster
    publish(nsqd, topic, 100)
    args = [handler, "--topic", topic, "--channel", "late", "--backend", backend]
    args += ["--nsqd-tcp-address", nsqd.tcp_address, "--concurrency", "10"]
    args += ["--max-in-flight", "20", "--stop-timeout", "2", "--msg-timeout", "120"]
    with worker(app, *args, env={"HANDLER_DELAY": "60"}) as running:
        wait_until(
            lambda: (nsqd.channel(topic, "late") or {}).get("in_flight_count") == 20,
            30,
            "20 messages in flight",
        )
        running.signal(signum)
        code, seconds = running.wait(timeout=40)
        assert code == 0, running.stderr
        assert 1.5 < seconds < 2 + 15, running.stderr
        assert "10 handlers still running after --stop-timeout" in running.stderr
        assert "Traceback" not in running.stderr
    wait_until(lambda: in_flight_zero(nsqd, topic, "late"), 10, "nothing in flight")
    stats = channel_stats(nsqd, topic, "late")
    assert int(stats["depth"]) + int(stats["deferred_count"]) == 100
    assert handled(app) == []


def test_a_plain_handler_runs_in_threads_bounded_by_concurrency(
    cluster: tuple[Lookupd, Nsqd], app: Path, topic: str
) -> None:
    """A plain function runs in worker threads, at most --concurrency at once, and its
    messages are finished; the summary line counts them."""
    _, nsqd = cluster
    bodies = publish(nsqd, topic, 60)
    args = (
        "handlers:plain",
        "--topic",
        topic,
        "--channel",
        "threads",
        "--nsqd-tcp-address",
        nsqd.tcp_address,
        "--concurrency",
        "4",
        "--max-in-flight",
        "20",
        "--stats-interval",
        "1",
    )
    with worker(app, *args, env={"HANDLER_DELAY": "0.05"}) as running:
        line = running.wait_for("worker starting")
        assert "handler=handlers:plain (plain, run in threads)" in line
        running.wait_for("finished 60,", timeout=60)
        running.signal(signal.SIGTERM)
        assert running.wait(timeout=45)[0] == 0, running.stderr
    records = [line.split() for line in handled(app)]
    assert sorted(r[0] for r in records) == sorted(bodies)
    assert all(r[1] == b"other" for r in records)  # not the event loop's thread
    busy = [int(r[2]) for r in records]
    assert max(busy) <= 4
    assert max(busy) > 1  # they did run side by side
    assert int(channel_stats(nsqd, topic, "threads")["depth"]) == 0


def test_the_summary_line_counts_messages_every_interval(
    cluster: tuple[Lookupd, Nsqd], app: Path, topic: str
) -> None:
    """One line per --stats-interval on the nsq.worker logger, and one when it stops."""
    _, nsqd = cluster
    publish(nsqd, topic, 25)
    args = ["handlers:handle", "--topic", topic, "--channel", "sum"]
    args += ["--nsqd-tcp-address", nsqd.tcp_address, "--stats-interval", "1"]
    with worker(app, *args, program=SCRIPT) as running:
        line = running.wait_for("received 25, finished 25,", timeout=60)
        assert " INFO nsq.worker: " in line
        for part in ("requeued 0", "given up 0", "msgs/s", "in flight 0", "backoff level 0"):
            assert part in line
        assert "connections 1 subscribed of 1" in line
        running.wait_for("received 25, finished 25, requeued 0, given up 0, 0.0 msgs/s")
        running.signal(signal.SIGINT)
        assert running.wait(timeout=45)[0] == 0, running.stderr
    assert "worker stopped: received 25, finished 25" in running.stderr


def test_a_worker_started_before_its_topic_exists_says_so_then_consumes_it(
    cluster: tuple[Lookupd, Nsqd], app: Path, topic: str
) -> None:
    lookupd, nsqd = cluster
    args = ["handlers:handle", "--topic", topic, "--channel", "early"]
    args += ["--lookupd-http-address", lookupd.http_address, "--stats-interval", "1"]
    with worker(app, *args) as running:
        running.wait_for(
            "connections 0 subscribed of 0, waiting for nsqlookupd to list the topic", timeout=30
        )
        bodies = publish(nsqd, topic, 3)
        line = running.wait_for("received 3, finished 3,", timeout=60)
        assert line.rstrip().endswith("connections 1 subscribed of 1"), line
        running.signal(signal.SIGTERM)
        assert running.wait(timeout=45)[0] == 0, running.stderr
    assert sorted(handled(app)) == bodies


# -- the handler -------------------------------------------------------------------------------


BAD_HANDLERS = [
    ("missing_module:handle", "cannot import handler module 'missing_module': ModuleNotFoundError"),
    ("broken:handle", "cannot import handler module 'broken': ImportError: no such thing"),
    ("syntax:handle", "cannot import handler module 'syntax': SyntaxError"),
    ("handlers:not_callable", "handler 'handlers:not_callable' is not callable"),
    ("handlers:nothing", "module 'handlers' has no attribute 'nothing'"),
    ("handlers", "handler 'handlers' is not MODULE:FUNCTION"),
]


@pytest.mark.parametrize(("spec", "error"), BAD_HANDLERS, ids=[s for s, _ in BAD_HANDLERS])
def test_a_handler_that_cannot_be_used_is_one_error_line_before_any_connection(
    app: Path, spec: str, error: str
) -> None:
    (app / "broken.py").write_text("raise ImportError('no such thing')\n")
    (app / "syntax.py").write_text("def handle(message):\n  return (\n")
    with listener() as (address, sock):
        args = (spec, "--topic", "t", "--channel", "c", "--nsqd-tcp-address", address)
        with worker(app, *args, "--lookupd-http-address", address) as running:
            code, _ = running.wait(timeout=30)
        assert code == 2, running.stderr
        lines = running.stderr.splitlines()
        assert len(lines) == 1, running.stderr
        assert lines[0].startswith("python -m nsq_cli worker: error: "), lines
        assert error in lines[0]
        assert not connected(sock)


# -- the options -------------------------------------------------------------------------------


def test_options_come_from_the_environment_flags_win_and_the_secret_is_masked(
    cluster: tuple[Lookupd, Nsqd], app: Path, topic: str
) -> None:
    _, nsqd = cluster
    publish(nsqd, topic, 5)
    env = {
        "NSQ_TOPIC": topic,
        "NSQ_CHANNEL": "from-env",
        "NSQD_TCP_ADDRESSES": f" {nsqd.tcp_address} ,",
        "NSQ_MAX_IN_FLIGHT": "7",
        "NSQ_CONCURRENCY": "3",
        "NSQ_STOP_TIMEOUT": "12.5",
        "NSQ_BACKOFF": "false",
        "NSQ_AUTH_SECRET": "hunter2-secret",
    }
    with worker(app, "handlers:handle", "--max-in-flight", "9", "--backoff", env=env) as running:
        line = running.wait_for("worker starting")
        for part in (
            f"topic={topic} ",
            "channel=from-env ",
            f"nsqd_tcp_address={nsqd.tcp_address} ",
            "max_in_flight=9 ",  # the flag, not NSQ_MAX_IN_FLIGHT
            "concurrency=3 ",
            "stop_timeout=12.5 ",
            "backoff=True ",  # --backoff, not NSQ_BACKOFF
            "auth_secret=*** ",
            "handler=handlers:handle (async)",
        ):
            assert part in line, line
        wait_until(lambda: len(handled(app)) == 5, 60, "5 messages handled")
        running.signal(signal.SIGTERM)
        assert running.wait(timeout=45)[0] == 0, running.stderr
    assert "hunter2" not in running.stderr
    assert running.stderr.count("worker starting:") == 1
    assert channel_stats(nsqd, topic, "from-env")["depth"] == 0


def run_worker(app: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    with worker(app, *args, env=env) as running:
        code, _ = running.wait(timeout=30)
    return code, running.stderr


def assert_usage_error(code: int, stderr: str, *words: str) -> None:
    assert code == 2, stderr
    assert stderr.startswith("usage: python -m nsq_cli worker "), stderr
    last = stderr.rstrip("\n").splitlines()[-1]
    assert last.startswith("python -m nsq_cli worker: error: "), stderr
    for word in words:
        assert word in last, stderr


@pytest.mark.parametrize(
    ("args", "env", "words"),
    [
        (["--channel", "c"], {"NSQD_TCP_ADDRESSES": "127.0.0.1:4150"}, ["--topic", "NSQ_TOPIC"]),
        (["--topic", "t"], {"NSQD_TCP_ADDRESSES": "127.0.0.1:4150"}, ["NSQ_CHANNEL"]),
        (["--topic", "t", "--channel", "c"], {}, ["NSQ_LOOKUPD_HTTP_ADDRESSES"]),
        (
            ["--topic", "t", "--channel", "c", "--nsqd-tcp-address", "127.0.0.1:4150"],
            {"NSQ_MAX_IN_FLIGHT": "lots"},
            ["NSQ_MAX_IN_FLIGHT", "'lots'"],
        ),
        (
            ["--topic", "t", "--channel", "c"],
            {"NSQD_TCP_ADDRESSES": "http://127.0.0.1:4150/"},
            ["NSQD_TCP_ADDRESSES"],
        ),
        (
            ["--topic", "t", "--channel", "c", "--nsqd-tcp-address", "127.0.0.1:4150"],
            {"NSQ_BACKOFF": "maybe"},
            ["NSQ_BACKOFF", "'maybe'"],
        ),
        (
            ["--channel", "c", "--nsqd-tcp-address", "127.0.0.1:4150"],
            {"NSQ_TOPIC": "a b"},
            ["NSQ_TOPIC"],
        ),
    ],
    ids=[
        "no topic",
        "no channel",
        "no address",
        "bad count",
        "bad address",
        "bad boolean",
        "bad topic",
    ],
)
def test_a_missing_or_bad_setting_is_a_usage_error(
    app: Path, args: list[str], env: dict[str, str], words: list[str]
) -> None:
    code, stderr = run_worker(app, "handlers:handle", *args, env=env)
    assert_usage_error(code, stderr, *words)


def test_the_help_names_each_options_variable_and_the_page_lists_them(app: Path) -> None:
    out = subprocess.run(
        [*PY, "worker", "--help"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    pairs = re.findall(
        r"(--[a-z-]+)(?:, --no-[a-z-]+)?(?: [A-Z:]+)? [^()]*\(env (NSQD?_[A-Z_]+)", text
    )
    assert len(pairs) >= 20, text
    page = " ".join((ROOT / "docs" / "cli.md").read_text().split())
    for flag, variable in pairs:
        assert f"`{flag}`" in page and f"`{variable}`" in page, (flag, variable)


def test_a_tls_ca_that_cannot_be_read_is_one_runtime_error_before_any_connection(
    app: Path,
) -> None:
    with listener() as (address, sock):
        args = ["handlers:handle", "--topic", "t", "--channel", "c"]
        args += ["--nsqd-tcp-address", address, "--tls-ca", str(app / "missing.pem")]
        code, stderr = run_worker(app, *args)
        assert code == 1, stderr
        assert stderr.splitlines() == [
            f"nsq: error: cannot read --tls-ca {app / 'missing.pem'}: No such file or directory"
        ]
        assert not connected(sock)
