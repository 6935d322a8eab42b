"""The installed packages are visible to type checkers: a user's program outside the project,
checked with ``mypy --strict`` after the README's editable install, finds ``nsq_anyio`` and
``nsq_trio`` (setuptools' default editable install of this layout is an import hook, which
mypy cannot follow: ``import-not-found``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from .support import ROOT

PROGRAM = """\
import anyio

import nsq_anyio
import nsq_trio
from nsq_anyio.blocking import Producer
from nsq_emulator import MemoryNetwork


async def handler(message: nsq_anyio.Message) -> None:
    await message.finish()


async def main() -> None:
    async with nsq_anyio.Consumer("t", "c", nsqd_tcp_addresses=["127.0.0.1:4150"]) as consumer:
        await consumer.run(handler, concurrency=4)


def make() -> tuple[nsq_trio.Producer, Producer, MemoryNetwork]:
    return (
        nsq_trio.Producer(nsqd_tcp_addresses=["127.0.0.1:4150"]),
        Producer(nsqd_tcp_addresses=["127.0.0.1:4150"]),
        MemoryNetwork(),
    )


anyio.run(main)
"""


def test_a_program_outside_the_project_type_checks(tmp_path: Path) -> None:
    assert not tmp_path.is_relative_to(ROOT)
    (tmp_path / "program.py").write_text(PROGRAM)
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "program.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
