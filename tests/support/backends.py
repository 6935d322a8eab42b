"""Every adapter on every event loop it runs on: a test asking for ``lib`` (and
``anyio_backend``) runs three ways.  A conftest or test module imports the three fixtures."""

from __future__ import annotations

import importlib
from types import ModuleType

import pytest

#: one scenario suite, three ways: nsq_anyio on asyncio, nsq_anyio on trio, nsq_trio
WAYS = [("nsq_anyio", "asyncio"), ("nsq_anyio", "trio"), ("nsq_trio", "trio")]


@pytest.fixture(params=WAYS, ids=[f"{lib}-{backend}" for lib, backend in WAYS])
def way(request: pytest.FixtureRequest) -> tuple[str, str]:
    lib, backend = request.param
    return str(lib), str(backend)


@pytest.fixture
def anyio_backend(way: tuple[str, str]) -> str:
    return way[1]


@pytest.fixture
def lib(way: tuple[str, str]) -> ModuleType:
    return importlib.import_module(way[0])
