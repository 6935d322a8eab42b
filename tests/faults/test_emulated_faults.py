"""The fault scenarios of ``_scenarios.py`` against the emulator on loopback (they run
everywhere; ``test_real_faults.py`` runs them against real nsqd).  A frozen nsqd is covered
on the virtual clock in ``tests/proto/test_consumer_x_emulator.py``."""

from __future__ import annotations

from types import ModuleType

import pytest

from nsq_emulator.loopback import serve_emulator

from . import _scenarios as scenario
from ._targets import EmulatedTarget

pytestmark = pytest.mark.anyio


async def test_kill_mid_consume(lib: ModuleType, way: tuple[str, str]) -> None:
    async with serve_emulator(lookupd=False) as cluster:
        await scenario.kill_mid_consume(lib, way, EmulatedTarget(cluster), "t")


async def test_kill_behind_lookupd(lib: ModuleType, way: tuple[str, str]) -> None:
    async with serve_emulator(nsqd_count=2) as cluster:
        await scenario.kill_behind_lookupd(lib, way, EmulatedTarget(cluster), "t")


async def test_producer_failover(lib: ModuleType, way: tuple[str, str]) -> None:
    async with serve_emulator(nsqd_count=2, lookupd=False) as cluster:
        await scenario.producer_failover(lib, way, EmulatedTarget(cluster), "t")


@pytest.mark.parametrize("touch", [False, True])
async def test_slow_handlers(lib: ModuleType, way: tuple[str, str], touch: bool) -> None:
    async with serve_emulator(lookupd=False) as cluster:
        await scenario.slow_handlers(lib, way, EmulatedTarget(cluster), "t", touch)


@pytest.mark.parametrize("how", ["stop", "cancel", "cancel-block"])
async def test_stop_under_load(lib: ModuleType, way: tuple[str, str], how: str) -> None:
    async with serve_emulator(lookupd=False) as cluster:
        await scenario.stop_under_load(lib, way, EmulatedTarget(cluster), "t", how)
