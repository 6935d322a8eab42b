"""``serve`` and ``python -m nsq_emulator`` (the same program): its usage errors, a port in
use, its stop."""

from __future__ import annotations

import socket
import sys

import pytest

from tests.cli.helpers import (
    BACKENDS,
    assert_interrupted,
    assert_runtime_error,
    assert_usage_error,
    help_entries,
)
from tests.support.served import run, running


def test_serve_port_out_of_range_is_a_usage_error() -> None:
    out = run("serve", "--tcp-port", "70000")
    assert_usage_error(out, "--tcp-port", "70000")


def test_serve_on_all_interfaces_is_a_usage_error() -> None:
    out = run("serve", "--host", "0.0.0.0")
    assert_usage_error(out, "--host", "0.0.0.0", "loopback")


def test_serve_on_an_address_of_another_machine_is_a_usage_error() -> None:
    out = run("serve", "--host", "192.0.2.1")
    assert_usage_error(out, "--host", "192.0.2.1", "loopback")


def test_serve_on_a_port_in_use_is_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = run("serve", "--tcp-port", str(port), "--http-port", "0", "--lookupd-http-port", "0")
    assert_runtime_error(out, f"127.0.0.1:{port}", "in use")


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


def test_the_emulators_program_has_serves_options_and_help() -> None:
    emulator = run("--help", program=EMULATOR, timeout=10)
    serve = run("serve", "--help", timeout=10)
    assert emulator.returncode == serve.returncode == 0, emulator.stderr + serve.stderr
    assert help_entries(emulator.stdout) == help_entries(serve.stdout)
    assert len(help_entries(serve.stdout)) >= 6, serve.stdout


#: ``python -m nsq_emulator`` where the command line cannot be imported
WITHOUT_THE_CLI = [
    sys.executable,
    "-c",
    "import runpy, sys; sys.modules['nsq_cli'] = None; "
    "sys.argv[0] = 'python -m nsq_emulator'; "
    "runpy.run_module('nsq_emulator', run_name='__main__', alter_sys=True)",
]


def test_the_emulators_program_serves_without_the_command_line() -> None:
    """The emulator is a package below the command line: its program does not need it."""
    ports = ["--tcp-port", "0", "--http-port", "0", "--lookupd-http-port", "0"]
    with running(*ports, program=WITHOUT_THE_CLI) as proc:
        nsqd = proc.wait_for("out", "nsqd TCP").split()[-1]
        proc.wait_for("out", "lookupd HTTP")
        out = run("pub", "t", "--nsqd-tcp-address", nsqd, stdin="a\n")
        assert out.returncode == 0, out.stderr
        assert_interrupted(proc)
    out = run("--tcp-port", "70000", program=WITHOUT_THE_CLI, timeout=10)
    assert_usage_error(out, "--tcp-port", "70000", prog="python -m nsq_emulator")


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
