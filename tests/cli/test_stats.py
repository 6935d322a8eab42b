"""``stats``: its usage errors, one line for each address that is not nsqd's HTTP one or a topic
that does not exist (on the emulator and a real nsqd), and its stop."""

from __future__ import annotations

import pytest

from tests.cli.helpers import (
    assert_interrupted,
    assert_runtime_error,
    assert_the_page_quotes,
    assert_usage_error,
)
from tests.support.net import free_port
from tests.support.served import run, running


def test_stats_http_url_is_a_usage_error() -> None:
    out = run("stats", "--nsqd-http-address", "http://127.0.0.1:4151")
    assert_usage_error(out, "'http://127.0.0.1:4151'", "host:port", "no scheme")


def test_stats_bad_topic_is_a_usage_error() -> None:
    out = run("stats", "--nsqd-http-address", "127.0.0.1:4151", "--topic", "no/such")
    assert_usage_error(out, "'no/such'", "topic name")


def test_stats_negative_interval_is_a_usage_error() -> None:
    out = run("stats", "--nsqd-http-address", "127.0.0.1:4151", "--interval", "-1")
    assert_usage_error(out, "--interval", "'-1'")


def test_stats_of_a_closed_port_is_one_line() -> None:
    port = free_port()
    out = run("stats", "--nsqd-http-address", f"127.0.0.1:{port}", timeout=10)
    assert_runtime_error(out, f"connection refused by 127.0.0.1:{port}")


def test_stats_of_a_topic_that_does_not_exist_is_one_line(server: dict[str, str]) -> None:
    nsqd_http = server["nsqd HTTP"]
    out = run("pub", "exists", "--nsqd-tcp-address", server["nsqd TCP"], stdin="x\n")
    assert out.returncode == 0, out.stderr
    out = run("stats", "--nsqd-http-address", nsqd_http, "--topic", "nosuch", timeout=10)
    assert_runtime_error(out, "topic nosuch does not exist", nsqd_http)
    assert out.stdout == ""
    assert_the_page_quotes(out.stderr.strip(), {"nosuch": "T", nsqd_http: "127.0.0.1:4151"})
    out = run("stats", "--nsqd-http-address", nsqd_http, "--topic", "exists", timeout=10)
    assert out.returncode == 0, out.stderr
    assert [line.split()[:3] for line in out.stdout.splitlines()[2:]] == [["exists", "1"]]


def test_stats_of_nsqd_tcp_port_is_one_line(server: dict[str, str]) -> None:
    out = run("stats", "--nsqd-http-address", server["nsqd TCP"], timeout=10)
    assert_runtime_error(out, server["nsqd TCP"], "TCP port")


def test_stats_of_lookupd_is_one_line(server: dict[str, str]) -> None:
    out = run("stats", "--nsqd-http-address", server["lookupd HTTP"], timeout=10)
    assert_runtime_error(out, server["lookupd HTTP"], "404", "nsqlookupd")


def test_stats_stops_on_interrupt(server: dict[str, str]) -> None:
    with running("stats", "--nsqd-http-address", server["nsqd HTTP"], "--interval", "10") as proc:
        proc.wait_for("out", "# ")
        assert_interrupted(proc)


@pytest.mark.real_nsqd
def test_stats_of_real_nsqd_tcp_port_and_lookupd(real: dict[str, str]) -> None:
    out = run("stats", "--nsqd-http-address", real["nsqd TCP"], timeout=10)
    assert_runtime_error(out, real["nsqd TCP"], "TCP port")
    out = run("stats", "--nsqd-http-address", real["lookupd HTTP"], timeout=10)
    assert_runtime_error(out, real["lookupd HTTP"], "404", "nsqlookupd")
    out = run("stats", "--nsqd-http-address", real["nsqd HTTP"], "--topic", "nosuch", timeout=10)
    assert_runtime_error(out, "topic nosuch does not exist", real["nsqd HTTP"])
