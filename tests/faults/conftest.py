"""The fault suite: every adapter, and the figures (recovery times, duplicates, memory) printed
at the end of the run."""

from __future__ import annotations

import pytest

from tests.adapters.conftest import anyio_backend, lib, way

from ._figures import FIGURES

__all__ = ["anyio_backend", "lib", "way"]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if FIGURES:
        terminalreporter.section("fault suite figures")
        for line in FIGURES:
            terminalreporter.write_line(line)
