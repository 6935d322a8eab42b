"""A round trip for the benchmarks: ``--rtt MS`` puts the project's fault proxy
(``python -m nsq_emulator.proxy``, in a process of its own) between the measured loop and nsqd,
delaying every chunk ``MS / 2`` milliseconds each way.  The client and the bare loop
(``bare.py``) go through the same proxy, so that both are measured across the same delay.
Imported by ``throughput.py`` and ``latency.py``."""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
from collections.abc import Iterator


def add_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--rtt",
        type=float,
        default=None,
        metavar="MS",
        help="measure through a loopback proxy delaying every chunk MS/2 ms each way "
        "(0: through the proxy with no delay; unset: straight to nsqd)",
    )


@contextlib.contextmanager
def through(address: str, rtt_ms: float | None) -> Iterator[str]:
    """``address`` itself (``rtt_ms`` None), else the address of a proxy to it with that
    round trip, for the block."""
    if rtt_ms is None:
        yield address
        return
    if rtt_ms < 0:
        raise SystemExit(f"--rtt must be 0 or more milliseconds, not {rtt_ms}")
    argv = [sys.executable, "-m", "nsq_emulator.proxy", address, "--delay", str(rtt_ms / 2000)]
    proxy = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        assert proxy.stdout is not None
        line = proxy.stdout.readline()
        if not line.startswith("address="):
            raise SystemExit(f"the delay proxy did not start (it said {line!r})")
        yield line.strip().partition("=")[2]
    finally:
        proxy.terminate()
        try:
            proxy.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proxy.kill()
            proxy.wait()
