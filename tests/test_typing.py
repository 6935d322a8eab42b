"""The user-facing API is typed: mypy --strict accepts what a typed application writes
(tests/typing/accept.py) and rejects its typos (tests/typing/reject.py, one error on each line
marked ``# error`` and none elsewhere)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

api = pytest.importorskip("mypy.api")

HERE = Path(__file__).parent / "typing"


def mypy(path: Path) -> tuple[str, int]:
    out, err, status = api.run(
        ["--strict", "--no-incremental", "--no-error-summary", "--hide-error-context", str(path)]
    )
    return out + err, status


def test_typed_code_passes() -> None:
    out, status = mypy(HERE / "accept.py")
    assert status == 0, out


def test_typos_are_type_errors() -> None:
    path = HERE / "reject.py"
    out, status = mypy(path)
    assert status == 1, out
    lines = path.read_text().splitlines()
    expected = {n for n, line in enumerate(lines, 1) if line.endswith("# error")}
    errors = {int(m.group(1)) for m in re.finditer(rf"{re.escape(path.name)}:(\d+): error", out)}
    assert errors == expected, out
