"""``tail``: addresses that do not answer (an error at the start, a wait once subscribed), nsq's
tools' spellings and JSON lines, its usage errors and help, its stop, and what a new channel
sees, on the emulator and on a real nsqd."""

from __future__ import annotations

import contextlib
import json
import re
import time
import urllib.request

import pytest

from tests.cli.helpers import (
    BACKENDS,
    assert_interrupted,
    assert_one_error_line,
    assert_the_page_quotes,
    assert_usage_error,
    http_post,
)
from tests.support.net import free_port, free_ports
from tests.support.served import run, running


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_tail_of_an_nsqd_where_nothing_listens_is_one_error_line(backend: str) -> None:
    address = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    out = run(
        "tail", "T", "--nsqd-tcp-address", address, "-n", "1", "--backend", backend, timeout=60
    )
    assert_one_error_line(out, address, "connection refused")
    assert time.monotonic() - started < 20  # seconds, not a minute of retries
    assert_the_page_quotes(out.stderr.strip(), {address: "127.0.0.1:4150"})


def test_tail_of_an_nsqlookupd_where_nothing_listens_is_one_error_line() -> None:
    address = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    out = run("tail", "T", "--lookupd-http-address", address, "-n", "1", timeout=60)
    assert_one_error_line(out, f"connection refused by {address}")
    assert time.monotonic() - started < 20


def test_tail_of_what_is_not_nsqd_is_one_error_line(server: dict[str, str]) -> None:
    """The addresses swapped: nsqd's HTTP port as its TCP address, and as nsqlookupd's."""
    nsqd_http = server["nsqd HTTP"]
    out = run("tail", "T", "--nsqd-tcp-address", nsqd_http, "-n", "1", timeout=60)
    assert_one_error_line(out, nsqd_http, "HTTP")
    out = run("tail", "T", "--lookupd-http-address", server["nsqd TCP"], "-n", "1", timeout=60)
    assert_one_error_line(out, server["nsqd TCP"], "does not answer HTTP", "nsqlookupd")


def test_tail_waits_for_its_nsqd_once_subscribed() -> None:
    """An nsqd that goes away after tail subscribed (a restart) is waited for, as nsq_tail
    does: tail reconnects when it is back and prints what is published there."""
    ports = free_ports(3)
    nsqd = f"127.0.0.1:{ports[0]}"
    serve = ["serve", "--tcp-port", str(ports[0]), "--http-port", str(ports[1])]
    serve += ["--lookupd-http-port", str(ports[2])]
    with running(*serve) as first:
        first.wait_for("out", "lookupd HTTP")
        with running("tail", "T", "--channel", "c", "--nsqd-tcp-address", nsqd, "-n", "1") as tail:
            tail.wait_for("err", "note: ")  # said once subscribed
            first.interrupt()
            time.sleep(2.0)
            assert tail.proc.poll() is None, "".join(tail.err)
            with running(*serve) as second:
                second.wait_for("out", "lookupd HTTP")
                out = run("pub", "T", "--nsqd-tcp-address", nsqd, stdin="back\n")
                assert out.returncode == 0, out.stderr
                assert tail.proc.wait(timeout=60) == 0, "".join(tail.err)
                tail.stop()
                second.interrupt()
    assert tail.out == ["back\n"]
    assert "error:" not in "".join(tail.err)


def test_nsq_tools_spellings_json_lines_and_rate_summaries(server: dict[str, str]) -> None:
    nsqd = server["nsqd TCP"]
    out = run("pub", "--topic=orders", f"--nsqd-tcp-address={nsqd}", stdin="one\ntwo\n")
    assert out.returncode == 0, out.stderr
    assert out.stderr.startswith("published 2 messages to orders in ")
    assert out.stderr.rstrip().endswith("msgs/s)")
    out = run(
        "tail",
        "--topic=orders",
        "--channel=c",
        "-n",
        "2",
        f"--nsqd-tcp-address={nsqd}",
        "--nsqd-tcp-address",
        nsqd,
        "--format",
        "json",
    )
    assert out.returncode == 0, out.stderr
    records = [json.loads(line) for line in out.stdout.splitlines()]
    assert [r["body"] for r in records] == ["one", "two"]
    assert all(r["attempts"] == 1 and r["nsqd"] == nsqd and len(r["id"]) == 16 for r in records)
    assert records[0]["timestamp"] > 1_600_000_000 * 10**9
    assert "received 2 messages from orders in " in out.stderr
    out = run("stats", "--nsqd-http-address", server["nsqd HTTP"], "--topic", "orders")
    assert out.returncode == 0, out.stderr
    (row,) = [line.split() for line in out.stdout.splitlines() if line.startswith("orders  ")][1:]
    assert row[:6] == ["orders", "c", "0", "0", "0", "0"]


def test_a_topic_given_twice_is_a_usage_error() -> None:
    out = run("tail", "a", "--topic=b", "--nsqd-tcp-address", "127.0.0.1:1")
    assert_usage_error(out, "give the topic once")


def test_bad_channel_is_a_usage_error() -> None:
    out = run("tail", "t", "--channel", "a b", "--nsqd-tcp-address", "127.0.0.1:1")
    assert_usage_error(out, "'a b'", "channel name")


def test_address_without_port_is_a_usage_error() -> None:
    out = run("tail", "t", "--lookupd-http-address", "127.0.0.1")
    assert_usage_error(out, "--lookupd-http-address", "host:port")


@pytest.mark.parametrize(
    "option", [["-n", "0"], ["-n", "-1"], ["--max-in-flight", "0"]], ids=" ".join
)
def test_tail_counts_below_one_are_usage_errors(option: list[str]) -> None:
    out = run("tail", "t", "--nsqd-tcp-address", "127.0.0.1:1", *option, timeout=10)
    assert_usage_error(out, option[0], repr(option[1]))


def test_tail_help_shows_n_once() -> None:
    out = run("tail", "--help", timeout=10)
    assert "[-n N]" in out.stdout
    assert "--n" not in out.stdout.replace("--nsqd", "")
    # nsq_tail's other spelling still works
    out = run("tail", "t", "--n", "0", "--nsqd-tcp-address", "127.0.0.1:1", timeout=10)
    assert_usage_error(out, "-n", "'0'")


def test_tail_help_says_what_it_does_when_an_address_does_not_answer() -> None:
    out = run("tail", "--help", timeout=10)
    text = " ".join(out.stdout.split())
    assert "ends tail with one error line and exit status 1" in text
    assert "tail waits for an nsqd that goes away (a restart) and reconnects to it" in text
    assert "it also takes every message the topic holds" in text


@pytest.mark.parametrize("backend", BACKENDS)
def test_tail_stops_on_interrupt(server: dict[str, str], backend: str) -> None:
    with running(
        "tail", "quiet", "--nsqd-tcp-address", server["nsqd TCP"], "--backend", backend
    ) as proc:
        proc.wait_for("err", "note: ")
        assert_interrupted(proc)


def test_tail_of_a_new_channel_says_what_it_will_see(server: dict[str, str]) -> None:
    nsqd, lookupd = server["nsqd TCP"], server["lookupd HTTP"]
    out = run("pub", "news", "--nsqd-tcp-address", nsqd, stdin="first\n")
    assert out.returncode == 0, out.stderr
    # the topic's first channel takes what the topic held: no note
    out = run("tail", "news", "--channel", "kept", "-n", "1", "--lookupd-http-address", lookupd)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "first\n"
    assert "note:" not in out.stderr
    assert "warning:" not in out.stderr  # a channel that stays: nothing is lost
    out = run("pub", "news", "--nsqd-tcp-address", nsqd, stdin="second\n")
    assert out.returncode == 0, out.stderr
    # an existing channel: no note
    out = run("tail", "news", "--channel", "kept", "-n", "1", "--lookupd-http-address", lookupd)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "second\n"
    assert "note:" not in out.stderr
    # a new channel beside it: said once, once subscribed, and what it says holds
    with running("tail", "news", "-n", "1", "--lookupd-http-address", lookupd) as proc:
        note = proc.wait_for("err", "note: ")
        assert "new" in note and "from now on" in note
        out = run("pub", "news", "--nsqd-tcp-address", nsqd, stdin="third\n")
        assert out.returncode == 0, out.stderr
        assert proc.proc.wait(timeout=10) == 0, "".join(proc.err)
        proc.stop()
    assert proc.out == ["third\n"]
    assert sum("note: " in line for line in proc.err) == 1
    assert not any("warning:" in line for line in proc.err)


def test_tail_warns_when_its_channel_takes_what_the_topic_held(server: dict[str, str]) -> None:
    """A topic with no channel holds what is published to it; tail's ephemeral channel, its
    first, takes all of it, and nsqd deletes it with the channel: tail says so when it
    happens."""
    nsqd = server["nsqd TCP"]
    out = run("pub", "held", "--nsqd-tcp-address", nsqd, stdin="1\n2\n3\n")
    assert out.returncode == 0, out.stderr
    time.sleep(1.5)  # older than the clock difference tail allows between nsqd and itself
    out = run("tail", "held", "--nsqd-tcp-address", nsqd, "-n", "1")
    assert out.returncode == 0, out.stderr
    assert out.stdout == "1\n"
    (warning,) = [line for line in out.stderr.splitlines() if line.startswith("warning: ")]
    assert "held" in warning and "deletes them" in warning and "--channel" in warning
    channel = re.search(r"channel (\S+) took", warning)
    assert channel is not None
    quoted = warning.split("; ")[0] + "; ..."
    assert_the_page_quotes(quoted, {channel[1]: "tail123#ephemeral", "held": "T"})
    # what it says holds: the three messages went with the channel
    out = run("stats", "--nsqd-http-address", server["nsqd HTTP"], "--topic", "held")
    assert out.returncode == 0, out.stderr
    rows = [line.split() for line in out.stdout.splitlines()[2:]]
    assert rows == [["held", "0"]], out.stdout


def test_tail_of_nsqd_alone_says_what_a_new_channel_sees(server: dict[str, str]) -> None:
    with running("tail", "other", "--nsqd-tcp-address", server["nsqd TCP"]) as proc:
        note = proc.wait_for("err", "note: ")
        assert "from now on" in note
        assert_interrupted(proc)


@pytest.mark.real_nsqd
def test_tail_of_a_real_topic_with_no_channel_takes_and_loses_its_backlog(
    real: dict[str, str],
) -> None:
    """What docs/cli.md warns of, on nsqd itself: the ephemeral channel, the topic's first,
    takes the three messages it held, and they go with it when tail ends."""
    nsqd_http = real["nsqd HTTP"]
    http_post(f"http://{nsqd_http}/mpub?topic=held", b"1\n2\n3")
    time.sleep(1.5)  # older than the clock difference tail allows between nsqd and itself
    out = run("tail", "held", "--nsqd-tcp-address", real["nsqd TCP"], "-n", "1")
    assert out.returncode == 0, out.stderr
    assert out.stdout == "1\n"
    assert sum(line.startswith("warning: ") for line in out.stderr.splitlines()) == 1
    deadline = time.monotonic() + 10
    while True:  # nsqd deletes the ephemeral channel once its client is gone
        with urllib.request.urlopen(f"http://{nsqd_http}/stats?format=json&topic=held") as r:
            (topic,) = json.load(r)["topics"]
        if not topic["channels"]:
            break
        assert time.monotonic() < deadline, topic
        time.sleep(0.05)
    assert topic["depth"] == 0 and topic["message_count"] == 3


@pytest.mark.real_nsqd
def test_tail_of_a_new_channel_of_real_nsqd(real: dict[str, str]) -> None:
    nsqd_http, lookupd = real["nsqd HTTP"], real["lookupd HTTP"]
    http_post(f"http://{nsqd_http}/topic/create?topic=news")
    http_post(f"http://{nsqd_http}/channel/create?topic=news&channel=kept")
    http_post(f"http://{nsqd_http}/pub?topic=news", b"held")
    deadline = time.monotonic() + 10
    while True:  # nsqd tells nsqlookupd of the channel in its own time
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(f"http://{lookupd}/lookup?topic=news", timeout=5) as r:
                if "kept" in json.load(r).get("channels", []):
                    break
        assert time.monotonic() < deadline
        time.sleep(0.05)
    # an existing channel: no note
    out = run("tail", "news", "--channel", "kept", "-n", "1", "--lookupd-http-address", lookupd)
    assert out.returncode == 0, out.stderr
    assert "note:" not in out.stderr
    # a new channel beside it
    with running("tail", "news", "--lookupd-http-address", lookupd) as proc:
        note = proc.wait_for("err", "note: ")
        assert "new" in note and "from now on" in note
        assert_interrupted(proc)
