"""The command line's value checks, shared by every subcommand: argparse ``type=`` functions
(a bad value is the subcommand's usage error, exit 2) and the TLS context of ``--tls``,
``--tls-ca`` and ``--tls-insecure``."""

from __future__ import annotations

import argparse
import math
import ssl
from collections.abc import Callable

import nsq_proto
from nsq_proto.wire import is_valid_channel_name, is_valid_topic_name

__all__ = ["NAME_RULE", "address", "channel_name", "count", "seconds", "tls_context", "topic_name"]

NAME_RULE = "1 to 64 of a-z A-Z 0-9 . _ - with an optional #ephemeral suffix"


def count(text: str) -> int:
    """A whole number of 1 or more."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of 1 or more")
    return value


def seconds(text: str) -> float:
    """A finite number of seconds above 0."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds above 0")
    return value


def address(text: str) -> str:
    """``host:port`` (``[v6]:port``), without a scheme or a path."""
    try:
        nsq_proto.parse_address(text)
    except nsq_proto.ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def topic_name(text: str) -> str:
    if not is_valid_topic_name(text):
        raise argparse.ArgumentTypeError(f"topic name {text!r} is not valid ({NAME_RULE})")
    return text


def channel_name(text: str) -> str:
    if not is_valid_channel_name(text):
        raise argparse.ArgumentTypeError(f"channel name {text!r} is not valid ({NAME_RULE})")
    return text


def tls_context(
    args: argparse.Namespace, failure: Callable[[str], Exception]
) -> ssl.SSLContext | None:
    """The client's TLS context, or None without TLS; a CA file that cannot be read raises
    ``failure(text)`` (a runtime error: one line, exit status 1)."""
    if not (args.tls or args.tls_ca or args.tls_insecure):
        return None
    try:
        context = ssl.create_default_context(cafile=args.tls_ca)
    except (OSError, ssl.SSLError) as exc:
        raise failure(f"cannot read --tls-ca {args.tls_ca}: {exc.strerror or exc}") from None
    if args.tls_insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context
