"""What the command line's tests share: how a usage error, a runtime error and a stop by
Ctrl-C look, the documentation page they quote, and the entries of a ``--help``."""

from __future__ import annotations

import subprocess
import urllib.request

from tests.support import ROOT
from tests.support.served import Running


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


def assert_one_error_line(out: subprocess.CompletedProcess[str], *words: str) -> None:
    """``nsq: error: ...`` naming the cause, and nothing else on stderr: no retry line, no
    summary, nothing said of a connection "closed" or "lost" that never opened."""
    assert_runtime_error(out, *words)
    assert len(out.stderr.splitlines()) == 1, out.stderr
    assert "closed" not in out.stderr and "lost" not in out.stderr, out.stderr


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


BACKENDS = ["asyncio", "trio"]


def assert_interrupted(proc: Running) -> None:
    seconds = proc.interrupt()
    proc.stop()
    assert proc.proc.returncode == 130, "".join(proc.err)
    assert seconds < 3, seconds
    assert "Traceback" not in "".join(proc.err)


def http_post(url: str, body: bytes = b"") -> None:
    request = urllib.request.Request(url, data=body, method="POST")
    with urllib.request.urlopen(request, timeout=5):
        pass
