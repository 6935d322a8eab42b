"""The command line: the registry of its commands, the parser built from it, and the runner.

Installed as ``nsq-sansio``; also ``python -m nsq_cli``.  Each command is a module
(:data:`COMMANDS`) with its ``NAME``, ``HELP``, ``EPILOG`` (the end of its ``--help``, or
None), ``add_arguments(parser)``, ``check_usage(parser, args)`` (what argparse cannot check
alone) and ``run(args)``, which returns the exit status: an ``async`` one runs on
:mod:`nsq_anyio`'s event loop (``--backend``) until done or stopped by a signal, a plain one
runs as it is (``stats``; ``worker``, which runs its own loop and stops gracefully).  ``serve``
and ``demo`` import the emulator's loopback host when they start, so that ``pub``, ``tail``
and ``stats`` do not load it.

``pub`` and ``tail`` also take the spellings of nsq's own tools (``to_nsq``, ``nsq_tail``):
``--topic=T``, ``--channel=C``, ``-n N``, repeated ``--nsqd-tcp-address`` and
``--lookupd-http-address``.

Exit status: 0 done, 1 a runtime error (one line on stderr: ``nsq: error: ...``), 2 a usage
error (argparse's usage and one ``error:`` line), 128 + the signal's number when stopped by
SIGINT (130, Ctrl-C) or SIGTERM (143).
"""

from __future__ import annotations

import argparse
import inspect
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Protocol

import anyio

import nsq_anyio

from . import _demo, _pub, _serve, _stats, _tail, _worker
from ._args import ArgumentParser, new_parser, parse, subparser_options
from ._output import Failure

__all__ = ["COMMANDS", "Command", "main"]


class Command(Protocol):
    """What a command's module holds."""

    @property
    def NAME(self) -> str:
        """Its name on the command line."""

    @property
    def HELP(self) -> str:
        """Its line in the command line's help."""

    @property
    def EPILOG(self) -> str | None:
        """The end of its ``--help`` (kept as it is written), or None."""

    def add_arguments(self, parser: argparse.ArgumentParser, /) -> None:
        """Its arguments and options, each with its help (and its default, when it has one)."""

    def check_usage(self, parser: argparse.ArgumentParser, args: argparse.Namespace, /) -> None:
        """What argparse cannot check alone: ``parser.error(...)`` (exit status 2)."""

    def run(self, args: argparse.Namespace, /) -> int | Awaitable[int]:
        """The command, which returns the exit status (``async``: run on the event loop)."""


#: the commands, in the order of the help
COMMANDS: tuple[Command, ...] = (_serve, _pub, _tail, _stats, _demo, _worker)


def _parser(
    prog: str | None, chosen: str | None
) -> tuple[argparse.ArgumentParser, dict[str, Command], dict[str, argparse.ArgumentParser]]:
    """The parser of the command line, and each command and its parser by name.  Only the
    ``chosen`` command's arguments are added: describing them may import what the command
    needs (``serve``: the emulator), which the other commands do not load."""
    parser = new_parser(prog=prog, description="NSQ on anyio")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=ArgumentParser)
    commands: dict[str, Command] = {}
    parsers: dict[str, argparse.ArgumentParser] = {}
    for command in COMMANDS:
        options: dict[str, Any] = {"help": command.HELP, **subparser_options()}
        if command.EPILOG is not None:
            options["epilog"] = command.EPILOG
            options["formatter_class"] = argparse.RawDescriptionHelpFormatter
        parsers[command.NAME] = sub.add_parser(command.NAME, **options)
        if chosen == command.NAME:
            command.add_arguments(parsers[command.NAME])
        commands[command.NAME] = command
    return parser, commands, parsers


def main(argv: Sequence[str] | None = None, *, prog: str | None = None) -> int:
    """Run the command line on ``argv`` (default: ``sys.argv[1:]``) and return its exit status;
    ``prog`` is the program's name in its usage (default: the name it was started by, e.g.
    ``nsq-sansio``)."""
    words = sys.argv[1:] if argv is None else list(argv)
    # the command is the first word that is not an option (the program's own are -h, --help)
    chosen = next((word for word in words if not word.startswith("-")), None)
    parser, commands, parsers = _parser(prog, chosen)
    args = parse(parser, words, parsers)
    command = commands[args.command]
    command.check_usage(parsers[args.command], args)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    try:
        if inspect.iscoroutinefunction(command.run):
            result: int = anyio.run(_until_signal, command.run, args, backend=args.backend)
            return result
        status = command.run(args)
        assert isinstance(status, int)
        return status
    except BaseException as exc:  # sorted below; a bug goes on with its traceback
        leaves = _leaves(exc)
        if any(isinstance(leaf, KeyboardInterrupt) for leaf in leaves):
            return 130
        for leaf in leaves:
            line = _runtime_error(leaf)
            if line is not None:
                sys.stdout.flush()
                print(f"nsq: error: {line}", file=sys.stderr)
                return 1
        raise


async def _until_signal(
    command: Callable[[argparse.Namespace], Awaitable[int]], args: argparse.Namespace
) -> int:
    """Run ``command``; SIGINT or SIGTERM cancels it (exit status 128 + the signal), a second
    one ends the process at once."""
    result = 1
    failure: Exception | None = None
    stopped_by: int | None = None
    work = anyio.CancelScope()

    async def watch(signals: AsyncIterator[int]) -> None:
        nonlocal stopped_by
        async for signum in signals:
            if stopped_by is None:
                stopped_by = signum
                print("stopping", file=sys.stderr, flush=True)
                work.cancel()
            else:  # still stopping: the user insists
                sys.stdout.flush()
                os._exit(128 + signum)

    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch, signals)
            with work:
                try:
                    result = await command(args)
                except Exception as exc:
                    failure = exc
            tg.cancel_scope.cancel()
    if stopped_by is not None:
        return 128 + stopped_by
    if failure is not None:
        raise failure
    return result


def _leaves(error: BaseException) -> list[BaseException]:
    """The exceptions inside ``error`` (itself unless it is an exception group)."""
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in _leaves(inner)]
    return [error]


def _runtime_error(error: BaseException) -> str | None:
    """The one line for a runtime error (a :class:`Failure`, an error of the client, an
    ``OSError`` such as a closed stdout), or None for a bug (shown with its traceback)."""
    if isinstance(error, Failure | nsq_anyio.NSQError | OSError):
        return str(error)
    return None
