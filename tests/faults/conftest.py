"""The fault suite: every adapter; the figures each scenario measured (recovery times,
duplicates, memory) travel with its test's report and are printed at the end of the run
(``tests/conftest.py``), from whichever pytest worker ran it."""

from __future__ import annotations

from collections.abc import Generator, Iterator

import pytest

from tests.support.backends import anyio_backend, lib, way
from tests.support.servers import Nsqd

from ._figures import FIGURES

__all__ = ["anyio_backend", "lib", "way"]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    yield
    while FIGURES:
        item.user_properties.append(("figure", FIGURES.pop(0)))


@pytest.fixture
def nsqd() -> Iterator[Nsqd]:
    """A real nsqd of its own, started empty (the real-server modules; skipped without one)."""
    server = Nsqd()
    server.start()
    yield server
    server.cleanup()
