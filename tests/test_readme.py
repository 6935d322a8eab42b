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


def test_blocking_example_runs_against_a_served_emulator() -> None:
    import threading

    from nsq_anyio.blocking import Consumer

    from .adapters.test_cli import serve

    code = block("from nsq_anyio.blocking import")
    with serve() as addresses:
        nsqd = addresses["nsqd TCP"]
        code = code.replace('"127.0.0.1:4150"', repr(nsqd))
        # the example's last consumer runs until stopped: stop it once it is waiting
        started = Consumer.run

        def run_then_stop(self: Consumer, handler: Any, threads: int = 4) -> None:
            threading.Timer(1.0, self.stop).start()
            started(self, handler, threads)

        namespace: dict[str, Any] = {}
        Consumer.run = run_then_stop  # type: ignore[method-assign]
        try:
            exec(compile(code, "README.md", "exec"), namespace)
        finally:
            Consumer.run = started  # type: ignore[method-assign]
