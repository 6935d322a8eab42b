"""The command line as a whole (``nsq_cli``: ``nsq-sansio``, ``python -m nsq_cli``), run as a
user would, in separate processes: each subcommand's help and the page that documents it, a
mistyped option or subcommand, the program under its other names, and without anyio."""

from __future__ import annotations

import re
import sys

import pytest

from tests.cli.helpers import (
    assert_runtime_error,
    assert_the_page_quotes,
    assert_usage_error,
    help_entries,
)
from tests.support import ROOT
from tests.support.extras import program_with
from tests.support.net import free_port
from tests.support.served import run

COMMANDS = ["serve", "pub", "tail", "stats", "demo"]


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


#: which of the emulator's modules a command line run in this process loaded
LOADED = (
    "import sys\n"
    "from nsq_cli import main\n"
    "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
    "print(sorted(m for m in sys.modules if m.partition('.')[0] == 'nsq_emulator'))\n"
)


@pytest.mark.parametrize("command", ["pub", "tail", "stats", "worker"])
def test_the_commands_that_do_not_serve_do_not_load_the_emulator(command: str) -> None:
    out = run(command, "--help", program=[sys.executable, "-c", LOADED], timeout=10)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == "[]", out.stdout[-300:]
    out = run("serve", "--help", program=[sys.executable, "-c", LOADED], timeout=10)
    assert "nsq_emulator._serve" in out.stdout.splitlines()[-1], out.stdout[-300:]
