"""The README: its two commands come first, its examples run as written, and its links point
at pages of the documentation site."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from .support import ROOT
from .support.codeblocks import Block, blocks, run

README = ROOT / "README.md"
BLOCKS = blocks(README)


def test_the_quick_start_commands_come_first() -> None:
    text = README.read_text()
    first = text.index("```")
    assert text.count("```python", 0, first) == 0
    quick_start = text[first:].split("```", 2)[1]
    assert quick_start.startswith("sh\n")
    commands = [line for line in quick_start.splitlines()[1:] if line and not line.startswith("#")]
    assert commands == [
        'python3 -m venv .venv && .venv/bin/pip install -e ".[test]" && .venv/bin/nsq-sansio demo',
        ".venv/bin/python -m pytest",
    ]


@pytest.mark.parametrize("block", BLOCKS, ids=[b.name for b in BLOCKS])
def test_example_runs(block: Block, tmp_path: Path) -> None:
    run(block, tmp_path)


def test_links_to_the_docs_name_pages_that_exist() -> None:
    links = re.findall(r"\]\((docs/[^)\s]*)\)", README.read_text())
    assert len(links) >= 10
    for link in links:
        assert (ROOT / link).is_file(), f"the README links to {link}, which does not exist"
