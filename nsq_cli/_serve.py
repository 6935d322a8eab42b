"""``serve``: the emulator (one nsqd and an nsqlookupd) on loopback until stopped.

The options, their checks and the serving are the emulator's own (``python -m nsq_emulator``
is the same program): this command runs them under the command line's runner.  The emulator
is imported only when this command is chosen, so that the others do not load it."""

from __future__ import annotations

import argparse

from ._output import Failure

__all__ = ["EPILOG", "HELP", "NAME", "add_arguments", "check_usage", "run"]

NAME = "serve"
HELP = "run the NSQ emulator on loopback"
EPILOG: str | None = None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from nsq_emulator import _serve as emulator

    emulator.add_arguments(parser)


def check_usage(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    from nsq_emulator import _serve as emulator

    emulator.check_usage(parser, args)


async def run(args: argparse.Namespace) -> int:
    from nsq_emulator import _serve as emulator

    try:
        return await emulator.serve(args)
    except emulator.ServeError as exc:
        raise Failure(str(exc)) from None
