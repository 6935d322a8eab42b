"""Serving the emulator from a shell: one nsqd and an nsqlookupd on loopback until stopped.

``python -m nsq_emulator`` is :func:`main`; the command line's ``serve`` (``nsq-sansio
serve``) is the same options (:func:`add_arguments`, :func:`check_usage`) and the same
serving (:func:`serve`) under its runner.  Options: ``--host`` (a loopback address),
``--tcp-port`` 4150, ``--http-port`` 4151, ``--lookupd-http-port`` 4161 (0 for any free
port), ``--backend`` (asyncio or trio).

Exit status: 1 a runtime error (a port in use: one line on stderr, ``nsq: error: ...``), 2 a
usage error (argparse's usage and one ``error:`` line), 128 + the signal's number when stopped
by SIGINT (130, Ctrl-C) or SIGTERM (143); a second signal ends the process at once.  Serving
needs anyio (:mod:`nsq_emulator.loopback`), imported when it starts: without it, one line and
exit status 1.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import ipaddress
import logging
import os
import re
import signal
import socket
import sys
from collections.abc import AsyncIterator, Sequence
from typing import NoReturn

__all__ = ["ServeError", "add_arguments", "check_usage", "main", "serve"]

#: the line for anyio not installed (as the command line says it)
_NEEDS_ANYIO = (
    'the command line needs anyio, which is not installed: pip install "nsq-sansio[anyio]"'
)


class ServeError(Exception):
    """The emulator cannot be served (a port in use): one line, exit status 1."""


def port(text: str) -> int:
    """A port to listen on: 0 (any free port) to 65535."""
    if not (text.isascii() and text.isdigit() and int(text) <= 65535):
        raise argparse.ArgumentTypeError(f"{text!r} is not a port from 0 (any free port) to 65535")
    return int(text)


def loopback(text: str) -> str:
    """A loopback address of this machine (the emulator is for local use only)."""
    try:
        is_loopback = text == "localhost" or ipaddress.ip_address(text).is_loopback
    except ValueError:
        is_loopback = False
    if not is_loopback:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a loopback address (127.0.0.1, ::1 or localhost): "
            "the emulator serves this machine only"
        )
    return text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``serve``: where to listen, and the event loop."""
    parser.add_argument(
        "--host",
        type=loopback,
        default="127.0.0.1",
        help="loopback address to listen on: 127.0.0.1, ::1 or localhost (default: %(default)s)",
    )
    for option, default, what in (
        ("--tcp-port", 4150, "nsqd TCP"),
        ("--http-port", 4151, "nsqd HTTP"),
        ("--lookupd-http-port", 4161, "nsqlookupd HTTP"),
    ):
        parser.add_argument(
            option,
            type=port,
            default=default,
            metavar="PORT",
            help=f"{what} port, 0 for any free one (default: %(default)s)",
        )
    parser.add_argument(
        "--backend",
        choices=["asyncio", "trio"],
        default="asyncio",
        help="event loop (default: %(default)s)",
    )


def check_usage(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """What argparse cannot check alone: distinct ports (0 aside)."""
    ports = [p for p in (args.tcp_port, args.http_port, args.lookupd_http_port) if p]
    if len(set(ports)) != len(ports):
        parser.error("give --tcp-port, --http-port and --lookupd-http-port different ports")


def _check_free(host: str, port: int) -> None:
    """A clear error for a port already taken (checked before the emulator starts)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as probe:
        if os.name == "posix":  # as the listeners do: a port in TIME_WAIT is free
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            where = f"[{host}]:{port}" if family == socket.AF_INET6 else f"{host}:{port}"
            raise ServeError(f"cannot listen on {where}: {exc.strerror or exc}") from None


async def serve(args: argparse.Namespace) -> int:
    """Serve the emulator (one nsqd and an nsqlookupd) as ``args`` say, print where it listens
    (one line each, on stdout), and serve until cancelled; a :class:`ServeError` when it cannot
    listen."""
    import anyio

    from .loopback import serve_emulator

    for taken in (args.lookupd_http_port, args.tcp_port, args.http_port):
        if taken:
            _check_free(args.host, taken)
    async with contextlib.AsyncExitStack() as stack:
        try:
            cluster = await stack.enter_async_context(
                serve_emulator(
                    host=args.host,
                    tcp_ports=[args.tcp_port],
                    http_ports=[args.http_port],
                    lookupd_http_port=args.lookupd_http_port,
                )
            )
        except OSError as exc:
            raise ServeError(f"cannot listen on {args.host}: {exc.strerror or exc}") from None
        print(f"nsqd TCP      {cluster.nsqd_tcp_addresses[0]}", flush=True)
        print(f"nsqd HTTP     {cluster.nsqd_http_addresses[0]}", flush=True)
        print(f"lookupd HTTP  {cluster.lookupd_http_addresses[0]}", flush=True)
        await anyio.sleep_forever()
    return 0


# -- the program: python -m nsq_emulator ------------------------------------------------------


class _ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, with a suggestion for a mistyped choice (``--backend``)."""

    def error(self, message: str) -> NoReturn:
        choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)$", message)
        if choice is not None:
            choices = [c.strip().strip("'") for c in choice[2].split(",")]
            close = difflib.get_close_matches(choice[1], choices, n=1)
            if close:
                message = (
                    f"{message[: choice.start()]}invalid choice: {choice[1]!r}, "
                    f"maybe you meant {close[0]!r}? (choose from {choice[2]})"
                )
        super().error(message)


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """``argv`` parsed; an argument no option takes is a usage error naming the close option."""
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        known = [o for action in parser._actions for o in action.option_strings]
        hints = []
        for word in unknown:
            name = word.split("=", 1)[0]
            if name.startswith("-"):
                close = difflib.get_close_matches(name, known, n=1)
                if close:
                    hints.append(f"did you mean {close[0]}?")
        hint = f" ({'; '.join(hints)})" if hints else ""
        parser.error(f"unrecognized arguments: {' '.join(unknown)}{hint}")
    return args


async def _until_signal(args: argparse.Namespace) -> int:
    """:func:`serve` until SIGINT or SIGTERM (exit status 128 + the signal); a second one ends
    the process at once."""
    import anyio

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

    result = 1
    failure: Exception | None = None
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch, signals)
            with work:
                try:
                    result = await serve(args)
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


def main(argv: Sequence[str] | None = None, *, prog: str | None = None) -> int:
    """Serve the emulator as ``argv`` (default: ``sys.argv[1:]``) says until stopped, and
    return the exit status; ``prog`` is the program's name in its usage."""
    try:
        import anyio
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] != "anyio":
            raise
        print(f"nsq: error: {_NEEDS_ANYIO}", file=sys.stderr)
        return 1
    parser = _ArgumentParser(
        prog=prog, description="run the NSQ emulator (one nsqd and an nsqlookupd) on loopback"
    )
    add_arguments(parser)
    args = _parse(parser, argv)
    check_usage(parser, args)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    try:
        result: int = anyio.run(_until_signal, args, backend=args.backend)
    except BaseException as exc:  # sorted below; a bug goes on with its traceback
        leaves = _leaves(exc)
        if any(isinstance(leaf, KeyboardInterrupt) for leaf in leaves):
            return 130
        for leaf in leaves:
            if isinstance(leaf, ServeError | OSError):
                sys.stdout.flush()
                print(f"nsq: error: {leaf}", file=sys.stderr)
                return 1
        raise
    return result
