"""The command line (``nsq_cli``: ``nsq-sansio``, ``python -m nsq_cli``), run as a user would:
separate processes over loopback."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import re
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator

import pytest

from tests.support import ROOT
from tests.support.extras import program_with
from tests.support.net import free_port, free_ports
from tests.support.served import Running, run, running, server
from tests.support.servers import NSQD, NSQLOOKUPD, Lookupd, Nsqd

__all__ = ["server"]


def assert_usage_error(
    out: subprocess.CompletedProcess[str], *words: str, prog: str | None = None
) -> None:
    """argparse's convention: the usage of the subcommand that was run, then one line
    ``PROG SUBCOMMAND: error: ...`` naming the problem; exit 2.  ``prog`` is the program and
    subcommand (default: ``python -m nsq_cli`` and the subcommand run)."""
    if prog is None:
        prog = f"python -m nsq_cli {out.args[3]}"
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    assert out.stderr.startswith(f"usage: {prog} "), out.stderr
    last = out.stderr.rstrip("\n").splitlines()[-1]
    assert last.startswith(f"{prog}: error: "), out.stderr
    for word in words:
        assert word in last, out.stderr


#: docs/cli.md, its lines joined (a quote may be wrapped over two)
CLI_PAGE = " ".join((ROOT / "docs" / "cli.md").read_text().split())


def assert_the_page_quotes(line: str, names: dict[str, str]) -> None:
    """docs/cli.md quotes ``line``, with its example names (``names``' values) in place of
    this run's (``names``' keys)."""
    for actual, example in names.items():
        line = line.replace(actual, example)
    assert f"`{line}`" in CLI_PAGE, line


def assert_runtime_error(out: subprocess.CompletedProcess[str], *words: str) -> None:
    """One ``nsq: error:`` line naming the cause (the last line of stderr); exit 1."""
    assert out.returncode == 1, out.stderr
    assert "Traceback" not in out.stderr
    last = out.stderr.rstrip("\n").splitlines()[-1]
    assert last.startswith("nsq: error: "), out.stderr
    for word in words:
        assert word in last, out.stderr


def test_demo_round_trip() -> None:
    out = run("demo", "--count", "500")
    assert out.returncode == 0, out.stderr
    assert "consumed 500 distinct messages" in out.stdout
    assert "round trip OK" in out.stdout


def test_pub_then_tail_through_lookupd(server: dict[str, str]) -> None:
    nsqd = server["nsqd TCP"]
    out = run("pub", "clicks", "--nsqd-tcp-address", nsqd, stdin="a\nb\n\nc\n")
    assert out.returncode == 0, out.stderr
    assert "published 3 messages" in out.stderr
    out = run("pub", "clicks", "--nsqd-tcp-address", nsqd, "--count", "250", "--size", "10")
    assert out.returncode == 0, out.stderr
    lookupd = server["lookupd HTTP"]
    out = run("tail", "clicks", "--lookupd-http-address", lookupd, "-n", "253")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[:3] == ["a", "b", "c"]
    assert lines[3:] == ["x" * 10] * 250


def test_unreachable_nsqd_is_a_clear_error() -> None:
    out = run("pub", "t", "--nsqd-tcp-address", "127.0.0.1:1", "--timeout", "1", stdin="x\n")
    assert_runtime_error(out, "127.0.0.1:1")


# -- addresses that do not answer: at the start an error, once subscribed a wait --------------


def assert_one_error_line(out: subprocess.CompletedProcess[str], *words: str) -> None:
    """``nsq: error: ...`` naming the cause, and nothing else on stderr: no retry line, no
    summary, nothing said of a connection "closed" or "lost" that never opened."""
    assert_runtime_error(out, *words)
    assert len(out.stderr.splitlines()) == 1, out.stderr
    assert "closed" not in out.stderr and "lost" not in out.stderr, out.stderr


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


# -- usage errors: argparse's usage and one line, exit status 2 --------------------------------


def test_missing_topic_is_a_usage_error() -> None:
    out = run("pub", "--nsqd-tcp-address", "127.0.0.1:1", stdin="x\n")
    assert_usage_error(out, "give a topic")


def test_missing_address_is_a_usage_error() -> None:
    out = run("pub", "t", stdin="x\n")
    assert_usage_error(out, "--nsqd-tcp-address", "--lookupd-http-address")


def test_a_topic_given_twice_is_a_usage_error() -> None:
    out = run("tail", "a", "--topic=b", "--nsqd-tcp-address", "127.0.0.1:1")
    assert_usage_error(out, "give the topic once")


def test_bad_topic_is_a_usage_error() -> None:
    out = run("pub", "bad!topic", "--nsqd-tcp-address", "127.0.0.1:1", stdin="x\n")
    assert_usage_error(out, "'bad!topic'", "topic name")


def test_bad_channel_is_a_usage_error() -> None:
    out = run("tail", "t", "--channel", "a b", "--nsqd-tcp-address", "127.0.0.1:1")
    assert_usage_error(out, "'a b'", "channel name")


def test_stats_http_url_is_a_usage_error() -> None:
    out = run("stats", "--nsqd-http-address", "http://127.0.0.1:4151")
    assert_usage_error(out, "'http://127.0.0.1:4151'", "host:port", "no scheme")


def test_stats_bad_topic_is_a_usage_error() -> None:
    out = run("stats", "--nsqd-http-address", "127.0.0.1:4151", "--topic", "no/such")
    assert_usage_error(out, "'no/such'", "topic name")


def test_stats_negative_interval_is_a_usage_error() -> None:
    out = run("stats", "--nsqd-http-address", "127.0.0.1:4151", "--interval", "-1")
    assert_usage_error(out, "--interval", "'-1'")


def test_address_without_port_is_a_usage_error() -> None:
    out = run("tail", "t", "--lookupd-http-address", "127.0.0.1")
    assert_usage_error(out, "--lookupd-http-address", "host:port")


def test_serve_port_out_of_range_is_a_usage_error() -> None:
    out = run("serve", "--tcp-port", "70000")
    assert_usage_error(out, "--tcp-port", "70000")


def test_serve_on_all_interfaces_is_a_usage_error() -> None:
    out = run("serve", "--host", "0.0.0.0")
    assert_usage_error(out, "--host", "0.0.0.0", "loopback")


def test_serve_on_an_address_of_another_machine_is_a_usage_error() -> None:
    out = run("serve", "--host", "192.0.2.1")
    assert_usage_error(out, "--host", "192.0.2.1", "loopback")


def test_demo_count_zero_is_a_usage_error() -> None:
    out = run("demo", "--count", "0", timeout=10)
    assert_usage_error(out, "--count", "'0'")


@pytest.mark.parametrize(
    "option", [["-n", "0"], ["-n", "-1"], ["--max-in-flight", "0"]], ids=" ".join
)
def test_tail_counts_below_one_are_usage_errors(option: list[str]) -> None:
    out = run("tail", "t", "--nsqd-tcp-address", "127.0.0.1:1", *option, timeout=10)
    assert_usage_error(out, option[0], repr(option[1]))


# -- help and typos: each subcommand explains itself -------------------------------------------

COMMANDS = ["serve", "pub", "tail", "stats", "demo"]


def help_entries(text: str) -> dict[str, str]:
    """The arguments of a ``--help`` text: each option string (or positional argument's name)
    -> the help shown beside it."""
    entries: dict[str, str] = {}
    current: list[str] = []
    section = ""
    for line in text.splitlines():
        if line and not line.startswith(" "):
            section = line
            current = []
        elif section not in ("options:", "positional arguments:"):
            continue
        elif line.startswith("  ") and not line.startswith("   "):
            names, _, helptext = line.strip().partition("  ")
            current = [n.split()[0] for n in names.split(", ")]
            for name in current:
                entries[name] = helptext.strip()
        elif line.startswith("    ") and current:
            for name in current:
                entries[name] = (entries[name] + " " + line.strip()).strip()
        else:
            current = []
    return entries


@pytest.mark.parametrize("command", COMMANDS)
def test_the_command_line_page_lists_the_options_and_defaults_of_the_help(command: str) -> None:
    """docs/cli.md names each option of each subcommand, and the defaults ``--help`` shows."""
    page = (ROOT / "docs" / "cli.md").read_text()
    rows = dict(re.findall(r"^\| `(\w+)` \| .* \| (.*) \|$", page, re.M))
    option = r"`(--[a-z-]+|-n)(?: [A-Z:]+)?`(?: \(`([^`]*)`)?"
    documented = dict(re.findall(option, rows[command]))
    if command in ("pub", "tail"):
        shared = page.split("and they share:\n", 1)[1].split("\n\n", 1)[0]
        documented |= dict(re.findall(option, shared))
        assert "as `--topic=`" in page
        documented["--topic"] = ""
    out = run(command, "--help", timeout=10)
    shown = {
        name: (re.findall(r"\(default: ([^)]*)\)", text) or [""])[0]
        for name, text in help_entries(out.stdout).items()
        if name.startswith("-") and name not in ("-h", "--help")
    }
    assert documented == shown


@pytest.mark.parametrize("command", COMMANDS)
def test_every_option_of_a_subcommand_has_help(command: str) -> None:
    out = run(command, "--help", timeout=10)
    assert out.returncode == 0, out.stderr
    entries = help_entries(out.stdout)
    assert len(entries) >= 4, out.stdout
    for name, text in entries.items():
        assert text, f"{command} {name} has no help:\n{out.stdout}"


DEFAULTS = [
    ("serve", "--host", "127.0.0.1"),
    ("serve", "--tcp-port", "4150"),
    ("serve", "--http-port", "4151"),
    ("serve", "--lookupd-http-port", "4161"),
    ("serve", "--backend", "asyncio"),
    ("pub", "--size", "200"),
    ("pub", "--timeout", "10"),
    ("tail", "--max-in-flight", "200"),
    ("tail", "--format", "raw"),
    ("demo", "--count", "10000"),
    ("demo", "--topic", "demo"),
]


@pytest.mark.parametrize(("command", "option", "default"), DEFAULTS, ids=str)
def test_help_shows_the_defaults(command: str, option: str, default: str) -> None:
    out = run(command, "--help", timeout=10)
    assert f"(default: {default})" in help_entries(out.stdout)[option], out.stdout


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


def test_a_mistyped_option_is_the_subcommands_usage_error_with_a_suggestion() -> None:
    out = run("tail", "T", "--nsqd-tcp-adress", "127.0.0.1:4150", "-n", "1", timeout=10)
    assert_usage_error(out, "--nsqd-tcp-adress", "did you mean --nsqd-tcp-address?")
    out = run("pub", "T", "--nsqd-tcp-address=127.0.0.1:1", "--cuont=3", timeout=10)
    assert_usage_error(out, "--cuont=3", "did you mean --count?")
    out = run("stats", "--nsqd-http-address", "127.0.0.1:1", "--intervall", "1", timeout=10)
    assert_usage_error(out, "--intervall", "did you mean --interval?")
    out = run("tail", "T", "--no-such-thing", timeout=10)
    assert_usage_error(out, "--no-such-thing")
    assert "did you mean" not in out.stderr
    out = run("tail", "T", "--nsqd-tcp-adress", timeout=10)
    assert_the_page_quotes(out.stderr.splitlines()[-1].split(": error: ", 1)[1], {})


def test_a_mistyped_subcommand_gets_a_suggestion() -> None:
    out = run("tial", "T", timeout=10)
    assert_usage_error(out, "'tial'", "meant 'tail'?", prog="python -m nsq_cli")


# -- runtime errors: one line, exit status 1 ----------------------------------------------------


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


def test_serve_on_a_port_in_use_is_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = run("serve", "--tcp-port", str(port), "--http-port", "0", "--lookupd-http-port", "0")
    assert_runtime_error(out, f"127.0.0.1:{port}", "in use")


# -- the same command line under its other names ------------------------------------------------

#: what the console script ``nsq-sansio`` (``[project.scripts]``) runs, as pip's wrapper runs it
SCRIPT = [
    sys.executable,
    "-c",
    "import sys; from nsq_cli import main; sys.argv[0] = 'nsq-sansio'; sys.exit(main())",
]


@pytest.mark.parametrize(
    ("program", "prog"),
    [
        ([sys.executable, "-m", "nsq_cli"], "python -m nsq_cli"),
        (SCRIPT, "nsq-sansio"),
    ],
    ids=["python -m nsq_cli", "nsq-sansio"],
)
def test_the_command_line_under_its_other_names(program: list[str], prog: str) -> None:
    out = run("serve", "--host", "0.0.0.0", program=program, timeout=10)
    assert_usage_error(out, "--host", "loopback", prog=f"{prog} serve")
    out = run("stats", "--nsqd-http-address", f"127.0.0.1:{free_port()}", program=program)
    assert_runtime_error(out, "connection refused")


def test_the_command_line_without_anyio_says_which_extra_it_needs() -> None:
    """The script is installed with the package, the anyio extra or not: without anyio, it
    says what to install (one line, exit status 1) rather than a traceback."""
    cli = "from nsq_cli import main; sys.argv[0] = 'nsq-sansio'; sys.exit(main())"
    out = run("pub", "t", "--nsqd-tcp-address", "127.0.0.1:1", program=program_with([], cli))
    assert_runtime_error(out, "needs anyio", 'pip install "nsq-sansio[anyio]"')
    assert len(out.stderr.splitlines()) == 1, out.stderr
    serve = "from nsq_cli import serve_main; sys.exit(serve_main())"
    out = run("--tcp-port", "0", program=program_with(["trio"], serve))
    assert_runtime_error(out, 'pip install "nsq-sansio[anyio]"')


EMULATOR = [sys.executable, "-m", "nsq_emulator"]


def test_the_emulators_program_is_serve() -> None:
    """``python -m nsq_emulator`` takes serve's options, prints its addresses and stops as it
    does; a bad option is a usage error of its own name."""
    out = run("--tcp-port", "70000", program=EMULATOR, timeout=10)
    assert_usage_error(out, "--tcp-port", "70000", prog="python -m nsq_emulator")
    out = run("--tcp-port", "4150", "--http-port", "4150", program=EMULATOR, timeout=10)
    assert_usage_error(out, "different ports", prog="python -m nsq_emulator")
    ports = ["--tcp-port", "0", "--http-port", "0", "--lookupd-http-port", "0"]
    with running(*ports, "--backend", "trio", program=EMULATOR) as proc:
        nsqd = proc.wait_for("out", "nsqd TCP").split()[-1]
        proc.wait_for("out", "lookupd HTTP")
        out = run("pub", "t", "--nsqd-tcp-address", nsqd, stdin="a\n")
        assert out.returncode == 0, out.stderr
        assert_interrupted(proc)


# -- Ctrl-C: exit status 130 within a second, no traceback ------------------------------------

BACKENDS = ["asyncio", "trio"]


def assert_interrupted(proc: Running) -> None:
    seconds = proc.interrupt()
    proc.stop()
    assert proc.proc.returncode == 130, "".join(proc.err)
    assert seconds < 3, seconds
    assert "Traceback" not in "".join(proc.err)


@pytest.mark.parametrize("backend", BACKENDS)
def test_serve_stops_on_interrupt(backend: str) -> None:
    with running(
        "serve",
        "--tcp-port",
        "0",
        "--http-port",
        "0",
        "--lookupd-http-port",
        "0",
        "--backend",
        backend,
    ) as proc:
        proc.wait_for("out", "lookupd HTTP")
        assert_interrupted(proc)


@pytest.mark.parametrize("backend", BACKENDS)
def test_pub_from_a_terminal_stops_on_interrupt(server: dict[str, str], backend: str) -> None:
    """Reading a terminal that nobody types on, it still stops at once."""
    parent, child = pty.openpty()
    try:
        with running(
            "pub",
            "t",
            "--nsqd-tcp-address",
            server["nsqd TCP"],
            "--backend",
            backend,
            stdin=child,
        ) as proc:
            proc.wait_for("err", "Ctrl-D")
            assert_interrupted(proc)
    finally:
        os.close(parent)
        os.close(child)


@pytest.mark.parametrize("backend", BACKENDS)
def test_pub_from_a_terminal_publishes_lines_until_end_of_input(
    server: dict[str, str], backend: str
) -> None:
    parent, child = pty.openpty()
    try:
        with running(
            "pub",
            "t",
            "--nsqd-tcp-address",
            server["nsqd TCP"],
            "--backend",
            backend,
            stdin=child,
        ) as proc:
            proc.wait_for("err", "Ctrl-D")
            os.write(parent, b"one\ntwo\n\x04")
            assert proc.proc.wait(timeout=10) == 0, "".join(proc.err)
            proc.stop()
            assert "published 2 messages to t" in "".join(proc.err)
    finally:
        os.close(parent)
        os.close(child)


@pytest.mark.parametrize("backend", BACKENDS)
def test_tail_stops_on_interrupt(server: dict[str, str], backend: str) -> None:
    with running(
        "tail", "quiet", "--nsqd-tcp-address", server["nsqd TCP"], "--backend", backend
    ) as proc:
        proc.wait_for("err", "note: ")
        assert_interrupted(proc)


@pytest.mark.parametrize("backend", BACKENDS)
def test_demo_stops_on_interrupt(backend: str) -> None:
    with running("demo", "--count", "10000000", "--backend", backend) as proc:
        proc.wait_for("err", "emulated lookupd at")
        assert_interrupted(proc)


def test_stats_stops_on_interrupt(server: dict[str, str]) -> None:
    with running("stats", "--nsqd-http-address", server["nsqd HTTP"], "--interval", "10") as proc:
        proc.wait_for("out", "# ")
        assert_interrupted(proc)


# -- a new channel only sees what is published after it was created ---------------------------


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


# -- against a real nsqd ------------------------------------------------------------------------


def http_post(url: str, body: bytes = b"") -> None:
    request = urllib.request.Request(url, data=body, method="POST")
    with urllib.request.urlopen(request, timeout=5):
        pass


@pytest.fixture
def real() -> Iterator[dict[str, str]]:
    if not (NSQD and NSQLOOKUPD):
        pytest.skip("no real nsqd/nsqlookupd: set NSQD and NSQLOOKUPD to the binaries")
    lookupd = Lookupd()
    nsqd = Nsqd(lookupd=lookupd, durable=False)
    try:
        lookupd.start()
        nsqd.start()
        yield {
            "lookupd HTTP": lookupd.http_address,
            "nsqd TCP": nsqd.tcp_address,
            "nsqd HTTP": f"127.0.0.1:{nsqd.http}",
        }
    finally:
        nsqd.cleanup()
        lookupd.stop()


def test_stats_of_real_nsqd_tcp_port_and_lookupd(real: dict[str, str]) -> None:
    out = run("stats", "--nsqd-http-address", real["nsqd TCP"], timeout=10)
    assert_runtime_error(out, real["nsqd TCP"], "TCP port")
    out = run("stats", "--nsqd-http-address", real["lookupd HTTP"], timeout=10)
    assert_runtime_error(out, real["lookupd HTTP"], "404", "nsqlookupd")
    out = run("stats", "--nsqd-http-address", real["nsqd HTTP"], "--topic", "nosuch", timeout=10)
    assert_runtime_error(out, "topic nosuch does not exist", real["nsqd HTTP"])


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
