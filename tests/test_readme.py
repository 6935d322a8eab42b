"""The README's examples run as written."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import anyio

README = (Path(__file__).parent.parent / "README.md").read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", README, re.S)


def block(containing: str) -> str:
    (code,) = [b for b in BLOCKS if containing in b]
    return code


def test_emulator_example_test_passes() -> None:
    namespace: dict[str, Any] = {}
    exec(compile(block("async def test_my_handler"), "README.md", "exec"), namespace)
    anyio.run(namespace["test_my_handler"])


def test_memory_network_example_runs() -> None:
    namespace: dict[str, Any] = {}
    exec(compile(block("MemoryNetwork()"), "README.md", "exec"), namespace)
    nsqd = namespace["nsqd"]
    stats = nsqd.channel_stats("t", "c")
    assert (stats.depth, stats.in_flight_count, stats.message_count) == (0, 0, 1)


def test_the_sink_section_says_how_often_a_failed_publish_is_tried() -> None:
    sink = README.split("### The sink")[1].split("\n### ")[0]
    # Spark tries a failed task again only as its settings say; local[N] does not
    assert "`spark.task.maxFailures`" in sink
    assert "with the master `local[N]`, a task is tried\nonce" in sink
    assert "`local[N,M]`" in sink
