"""The Python code blocks of the README and the documentation type-check with ``mypy --strict``,
as a reader's program would (outside the project, with only the installed packages)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from .support import ROOT
from .support.codeblocks import Block, blocks

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: every block that runs (a skipped one may be a fragment of a program)
BLOCKS = [b for page in PAGES for b in blocks(page) if b.directive != "skip"]


def _module(block: Block) -> str:
    return "block_" + re.sub(r"\W", "_", block.name)


@pytest.fixture(scope="module")
def mypy_errors(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """One mypy run over every block (a module each): its error lines, by module."""
    where = tmp_path_factory.mktemp("blocks")
    for block in BLOCKS:
        (where / f"{_module(block)}.py").write_text(block.code)
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "."],
        cwd=where,
        capture_output=True,
        text=True,
        timeout=600,
    )
    errors: dict[str, list[str]] = {}
    for line in out.stdout.splitlines():
        name = line.split(".py:", 1)[0]
        if ".py:" in line:
            errors.setdefault(name, []).append(line)
    assert out.returncode == 0 or errors, out.stdout + out.stderr
    return errors


@pytest.mark.parametrize("block", BLOCKS, ids=[b.name for b in BLOCKS])
def test_code_block_type_checks(block: Block, mypy_errors: dict[str, list[str]]) -> None:
    assert mypy_errors.get(_module(block), []) == [], f"{block.name}: mypy --strict"


def test_the_blocks_are_outside_the_project(tmp_path: Path) -> None:
    assert not tmp_path.is_relative_to(ROOT)  # the installed packages are what mypy sees
