"""The command line's argument helpers: the parser (a suggestion for a mistyped subcommand or
option), and the options ``pub`` and ``tail`` share (the topic, the addresses, TLS,
compression, AUTH, the event loop) with their checks and the client options they make.
The values themselves are checked by :mod:`nsq_cli._values`."""

from __future__ import annotations

import argparse
import difflib
import inspect
import re
import ssl
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

from ._output import Failure
from ._values import address, tls_context, topic_name

__all__ = [
    "ArgumentParser",
    "add_backend",
    "add_client_arguments",
    "add_topic_arguments",
    "check_topic_usage",
    "client_options",
    "new_parser",
    "parse",
    "subparser_options",
]

#: argparse suggests close choices itself (Python 3.14 and later)
_SUGGESTS_CHOICES = "suggest_on_error" in inspect.signature(argparse.ArgumentParser).parameters


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, with a suggestion for a mistyped choice (a subcommand's name) where
    argparse has none of its own (``suggest_on_error``, Python 3.14 and later)."""

    def error(self, message: str) -> NoReturn:
        if _SUGGESTS_CHOICES:
            super().error(message)
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


def subparser_options() -> dict[str, Any]:
    """What each subcommand's parser is made with beside its own arguments."""
    return {"suggest_on_error": True} if _SUGGESTS_CHOICES else {}


def new_parser(**kwargs: Any) -> ArgumentParser:
    return ArgumentParser(**kwargs, **subparser_options())


def parse(
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None,
    commands: Mapping[str, argparse.ArgumentParser],
) -> argparse.Namespace:
    """``argv`` parsed; an argument no option takes is a usage error of the subcommand it was
    given to (its usage, ``PROG SUBCOMMAND: error: ...``), naming the close option."""
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        owner = commands[args.command]
        known = [o for action in owner._actions for o in action.option_strings]
        hints = []
        for word in unknown:
            name = word.split("=", 1)[0]
            if name.startswith("-"):
                close = difflib.get_close_matches(name, known, n=1)
                if close:
                    hints.append(f"did you mean {close[0]}?")
        hint = f" ({'; '.join(hints)})" if hints else ""
        owner.error(f"unrecognized arguments: {' '.join(unknown)}{hint}")
    return args


def add_backend(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--backend",
        choices=["asyncio", "trio"],
        default="asyncio",
        help="event loop (default: %(default)s)",
    )


def add_topic_arguments(parser: argparse.ArgumentParser, tool: str) -> None:
    """The topic, as an argument or as ``--topic=`` (as nsq's own ``tool`` takes it)."""
    parser.add_argument("topic", nargs="?", type=topic_name, help="the topic (or --topic)")
    parser.add_argument(
        "--topic",
        dest="topic_flag",
        type=topic_name,
        metavar="TOPIC",
        help=f"the topic, as {tool} takes it",
    )


def add_client_arguments(parser: argparse.ArgumentParser) -> None:
    """The addresses, TLS, compression, AUTH and the event loop of ``pub`` and ``tail``."""
    parser.add_argument(
        "--nsqd-tcp-address",
        action="append",
        default=[],
        type=address,
        metavar="HOST:PORT",
        help="nsqd TCP address (repeatable)",
    )
    parser.add_argument(
        "--lookupd-http-address",
        action="append",
        default=[],
        type=address,
        metavar="HOST:PORT",
        help="nsqlookupd HTTP address (repeatable)",
    )
    parser.add_argument("--tls", action="store_true", help="negotiate TLS")
    parser.add_argument("--tls-ca", metavar="FILE", help="CA bundle to verify nsqd with")
    parser.add_argument("--tls-insecure", action="store_true", help="do not verify the certificate")
    parser.add_argument("--snappy", action="store_true", help="snappy compression")
    parser.add_argument("--deflate", action="store_true", help="deflate compression")
    parser.add_argument("--auth-secret", metavar="SECRET", help="AUTH secret")
    add_backend(parser)


def check_topic_usage(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """What argparse cannot check alone: one topic, and at least one address."""
    if args.topic and args.topic_flag:
        parser.error("give the topic once (as an argument or as --topic)")
    args.topic = args.topic or args.topic_flag
    if not args.topic:
        parser.error("give a topic (as an argument or as --topic)")
    if not args.nsqd_tcp_address and not args.lookupd_http_address:
        parser.error("give --nsqd-tcp-address or --lookupd-http-address")


def client_options(args: argparse.Namespace) -> dict[str, Any]:
    """The producer's or consumer's options of :func:`add_client_arguments`; a CA file that
    cannot be read is a :class:`~nsq_cli._output.Failure`."""
    tls: ssl.SSLContext | None = tls_context(args, Failure)
    options: dict[str, Any] = {
        "nsqd_tcp_addresses": args.nsqd_tcp_address,
        "lookupd_http_addresses": args.lookupd_http_address,
        "tls": tls,
        "snappy": args.snappy,
        "deflate": args.deflate,
    }
    if args.auth_secret:
        options["auth_secret"] = args.auth_secret.encode()
    return options
