"""The protocol core's classes stay of a size one can read whole: none above 600 lines (the
size of h11's ``Connection``); a class that grows past it has a part to give away (see the
ownership table of docs/sans-io.md)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MOST_LINES = 600


def class_sizes(package: str) -> dict[str, int]:
    """Every top-level class of ``package``'s modules, by ``module:Class``, with its lines."""
    sizes = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef):
                assert node.end_lineno is not None
                name = f"{path.relative_to(ROOT)}:{node.name}"
                sizes[name] = node.end_lineno - node.lineno + 1
    return sizes


def test_no_class_of_the_core_is_above_600_lines() -> None:
    sizes = class_sizes("nsq_proto")
    assert "nsq_proto/_consumer.py:Consumer" in sizes  # the check read the core
    large = {name: lines for name, lines in sizes.items() if lines > MOST_LINES}
    assert not large, f"classes of nsq_proto above {MOST_LINES} lines: {large}"
