"""``serve``: the emulator (one nsqd and an nsqlookupd) on loopback until stopped.

The options, their checks and the serving are the emulator's own (``python -m nsq_emulator``
is the same program): this command runs them under the command line's runner."""

from __future__ import annotations

import argparse

from nsq_emulator import _serve as emulator

from ._output import Failure

__all__ = ["EPILOG", "HELP", "NAME", "add_arguments", "check_usage", "run"]

NAME = "serve"
HELP = "run the NSQ emulator on loopback"
EPILOG: str | None = None

add_arguments = emulator.add_arguments
check_usage = emulator.check_usage


async def run(args: argparse.Namespace) -> int:
    try:
        return await emulator.serve(args)
    except emulator.ServeError as exc:
        raise Failure(str(exc)) from None
