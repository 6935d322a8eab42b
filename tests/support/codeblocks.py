"""Run the Python code blocks of a Markdown page (the README, the docs) as a reader would.

Each ```` ```python ```` block runs in a fresh interpreter, as ``__main__``, with a timeout.
A block that defines ``test_*`` functions is a test file, and runs as a reader runs one: saved
as ``test_*.py`` and run by ``python -m pytest`` (with the plugins installed, anyio's and
the emulator's, and no configuration of this project), which must pass every test it collects,
with nothing skipped and no warning.  A block that talks to nsqd at ``127.0.0.1:4150`` (nsqd
HTTP ``:4151``, nsqlookupd ``:4161``) gets an emulator of its own, served on free ports that
replace those addresses.  An HTML comment right above a block changes how it runs (the
rendered page does not show it):

- ``<!-- docs-test: skip REASON -->``: not run, and the reason says why;
- ``<!-- docs-test: continue -->``: runs after the page's previous block, in one program;
- ``<!-- docs-test: runs-forever -->``: must still be running after a few seconds, having
  written nothing on stderr (no traceback, no warning); then it is stopped;
- ``<!-- docs-test: in-memory -->``: its addresses are those of an in-memory emulator
  (``MemoryNetwork``), so it runs as written, with no server.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

from . import ROOT
from .served import as_in_a_terminal, serve

_BLOCK = re.compile(
    r"(?:<!-- docs-test: (?P<directive>[a-z-]+)(?: (?P<reason>[^>]*?))? -->\n)?"
    r"^```python\n(?P<code>.*?)^```",
    re.S | re.M,
)
_ADDRESSES = {
    "127.0.0.1:4150": "nsqd TCP",
    "127.0.0.1:4151": "nsqd HTTP",
    "127.0.0.1:4161": "lookupd HTTP",
}
#: one pass over the block, so a free port that begins like a documented one (nsqd on
#: 127.0.0.1:41619) is never rewritten by the next address's replacement
_ADDRESS = re.compile("|".join(re.escape(a) for a in _ADDRESSES) + r"(?!\d)")
_RUNNER = textwrap.dedent(
    """
    import sys
    namespace = {"__name__": "__main__"}
    exec(compile(open(sys.argv[1]).read(), sys.argv[2], "exec"), namespace)
    """
)
#: a block that is a test file: it defines test functions
_TESTS = re.compile(r"^(?:async )?def test_", re.M)
#: what pytest -q ends with when every test passed, and nothing else happened
_ALL_PASSED = re.compile(r"^\d+ passed in [\d.]+s")


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    code: str
    directive: str | None
    reason: str | None

    @property
    def name(self) -> str:
        return f"{self.page}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """The page's runnable blocks; a ``continue`` block carries its predecessors' code."""
    text = path.read_text()
    page = str(path.relative_to(ROOT))
    found: list[Block] = []
    for match in _BLOCK.finditer(text):
        directive = match["directive"]
        if directive not in (None, "skip", "continue", "runs-forever", "in-memory"):
            raise ValueError(f"{page}: unknown docs-test directive {directive!r}")
        if directive == "skip" and not match["reason"]:
            raise ValueError(f"{page}: a skipped block says why")
        code = match["code"]
        if directive == "continue":
            if not found:
                raise ValueError(f"{page}: 'continue' on the page's first block")
            code = found.pop().code + "\n" + code
        line = text.count("\n", 0, match.start("code")) + 1
        found.append(Block(page, line, code, directive, match["reason"]))
    return found


def run(block: Block, tmp_path: Path, timeout: float = 60.0) -> None:
    """Run the block; raise AssertionError with its output if it fails."""
    if block.directive == "skip":
        return
    if block.directive != "in-memory" and any(a in block.code for a in _ADDRESSES):
        with serve() as served:
            _run(block, with_served_addresses(block.code, served), tmp_path, timeout)
    else:
        _run(block, block.code, tmp_path, timeout)


def with_served_addresses(code: str, served: dict[str, str]) -> str:
    """The block with each documented address replaced by the served one of its name."""
    return _ADDRESS.sub(lambda m: served[_ADDRESSES[m[0]]], code)


def _run(block: Block, code: str, tmp_path: Path, timeout: float) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if _TESTS.search(code):
        _run_tests(block, code, tmp_path, timeout, env)
        return
    source = tmp_path / "block.py"
    source.write_text(code)
    command = [sys.executable, "-c", _RUNNER, str(source), block.name]
    proc = subprocess.Popen(
        command,
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=as_in_a_terminal,  # Ctrl-C stops a block that runs forever
    )
    if block.directive == "runs-forever":
        try:
            out, err = proc.communicate(timeout=5.0)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
            try:
                out, err = proc.communicate(timeout=30.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
            early = err.split("KeyboardInterrupt")[0].split("Traceback")[0]
            assert not early.strip(), f"{block.name} wrote on stderr:\n{err}"
            return
        raise AssertionError(f"{block.name} ended (exit {proc.returncode}):\n{out}\n{err}")
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(
            f"{block.name} still running after {timeout} s:\n{out}\n{err}"
        ) from None
    assert proc.returncode == 0, f"{block.name} failed (exit {proc.returncode}):\n{out}\n{err}"


def _run_tests(
    block: Block, code: str, tmp_path: Path, timeout: float, env: dict[str, str]
) -> None:
    """The block as a test file of a reader's project, under pytest."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # none of this project's settings
    (tmp_path / "test_block.py").write_text(code)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_block.py"]
    try:
        out = subprocess.run(
            command,
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"{block.name}: pytest still running after {timeout} s") from exc
    summary = out.stdout.rstrip().splitlines()[-1] if out.stdout.strip() else ""
    assert out.returncode == 0 and _ALL_PASSED.match(summary), (
        f"{block.name} as a test file under pytest (exit {out.returncode}):\n"
        f"{out.stdout}\n{out.stderr}"
    )
