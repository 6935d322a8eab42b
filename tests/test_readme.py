"""The README: its two commands come first, its examples run as written, and its links point
at pages of the documentation site."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from .support import ROOT
from .support.codeblocks import Block, blocks, run
from .support.extras import PARTS, uses

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


#: the README's table of what to install for each part: the parts a row names, its extras
INSTALLS = [
    (
        re.findall(r"`(nsq_[a-z_.]+|nsq-sansio)`", row[1]),
        row[2].split(",") if row[2] else [],
        "on trio" in row[1],
    )
    for row in re.finditer(
        r'^\| (.*) \| `pip install (?:"nsq-sansio\[([a-z,]+)\]"|nsq-sansio)` \|$',
        README.read_text(),
        re.M,
    )
]


def test_the_readme_says_what_to_install_for_each_part() -> None:
    text = README.read_text()
    assert text.index("| you use | install |") < text.index("## Publish and consume")
    named = {name.partition(".")[0] for names, _, _ in INSTALLS for name in names}
    assert named >= {"nsq_anyio", "nsq_trio", "nsq_spark", "nsq_proto", "nsq_emulator"}
    assert "nsq-sansio" in named
    assert {extra for _, extras, _ in INSTALLS for extra in extras} <= set(PARTS)


@pytest.mark.parametrize(
    ("names", "extras", "on_trio"), INSTALLS, ids=[",".join(i[1]) or "-" for i in INSTALLS]
)
def test_each_install_line_is_enough_for_what_it_is_for(
    names: list[str], extras: list[str], on_trio: bool
) -> None:
    """Installed with those extras alone (the modules of the others cannot be imported), the
    parts the row names import, and the command line runs."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        uses(extras, names, on_trio=on_trio),
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert out.returncode == 0, out.stderr
