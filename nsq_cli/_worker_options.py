"""The ``worker``'s settings: each one a flag and an environment variable (the flag wins),
checked as the other subcommands' values are (a bad one is a usage error, exit status 2),
with its default; :data:`OPTIONS` lists them in the order of the help and of the
configuration line the worker logs."""

from __future__ import annotations

import argparse
import math
import os
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import nsq_proto

from ._values import address as _address
from ._values import channel_name as _channel_name
from ._values import count as _count
from ._values import seconds as _seconds
from ._values import tls_context
from ._values import topic_name as _topic_name

__all__ = ["CONSUMER_OPTIONS", "EPILOG", "OPTIONS", "add_arguments", "check_usage", "tls"]

# -- values: a bad one is a usage error (exit status 2), as the other subcommands' are --------


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def tls(args: argparse.Namespace) -> ssl.SSLContext | None:
    return tls_context(args, nsq_proto.ConfigError)


def _boolean(text: str) -> bool:
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not a boolean (1/0, true/false, yes/no, on/off)")


def _non_negative_seconds(text: str) -> float:
    """A finite number of seconds, 0 or more."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds of 0 or more")
    return value


def _attempts(text: str) -> int:
    """A whole number from 0 (no limit) to 65535."""
    if not (text.isascii() and text.isdigit() and int(text) <= 65535):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a whole number from 0 (no limit) to 65535"
        )
    return int(text)


def _log_level(text: str) -> str:
    level = text.strip().upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise argparse.ArgumentTypeError(f"{text!r} is not one of DEBUG, INFO, WARNING, ERROR")
    return level


def _backend_name(text: str) -> str:
    if text not in ("asyncio", "trio"):
        raise argparse.ArgumentTypeError(f"{text!r} is not asyncio or trio")
    return text


@dataclass(frozen=True)
class _Option:
    """One setting: its flag, its environment variable, how a value is read, its default."""

    flag: str
    env: str
    kind: Callable[[str], Any]
    help: str
    default: Any = None
    metavar: str | None = None
    #: several values: the flag repeated, or the variable comma-separated
    many: bool = False
    #: a boolean: --flag / --no-flag
    boolean: bool = False
    #: masked in the configuration line
    secret: bool = False
    #: the default the help shows, when it is not ``default``
    shown: str | None = None

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")


#: every setting of the worker, in the order of the help and of the configuration line
OPTIONS: tuple[_Option, ...] = (
    _Option("--topic", "NSQ_TOPIC", _topic_name, "the topic", metavar="TOPIC"),
    _Option("--channel", "NSQ_CHANNEL", _channel_name, "the channel", metavar="CHANNEL"),
    _Option(
        "--nsqd-tcp-address",
        "NSQD_TCP_ADDRESSES",
        _address,
        "nsqd TCP address, repeatable",
        metavar="HOST:PORT",
        many=True,
    ),
    _Option(
        "--lookupd-http-address",
        "NSQ_LOOKUPD_HTTP_ADDRESSES",
        _address,
        "nsqlookupd HTTP address, repeatable",
        metavar="HOST:PORT",
        many=True,
    ),
    _Option(
        "--concurrency",
        "NSQ_CONCURRENCY",
        _count,
        "handlers running at once (tasks for an async handler, threads for a plain one)",
        default=10,
        metavar="N",
    ),
    _Option(
        "--max-in-flight",
        "NSQ_MAX_IN_FLIGHT",
        _count,
        "messages nsqd may send before they are answered",
        shown="the concurrency",
        metavar="N",
    ),
    _Option(
        "--stop-timeout",
        "NSQ_STOP_TIMEOUT",
        _seconds,
        "seconds a stop waits for the handlers in progress",
        default=30.0,
        metavar="SECONDS",
    ),
    _Option(
        "--stats-interval",
        "NSQ_STATS_INTERVAL",
        _seconds,
        "seconds between two summary lines",
        default=60.0,
        metavar="SECONDS",
    ),
    _Option(
        "--http-address",
        "NSQ_HTTP_ADDRESS",
        _address,
        "serve /healthz, /readyz and /metrics over HTTP at this address",
        metavar="HOST:PORT",
    ),
    _Option(
        "--max-attempts",
        "NSQ_MAX_ATTEMPTS",
        _attempts,
        "deliveries of a message before it is given up, 0 for no limit",
        shown="5",
        metavar="N",
    ),
    _Option(
        "--default-requeue-delay",
        "NSQ_DEFAULT_REQUEUE_DELAY",
        _non_negative_seconds,
        "seconds before a failed message comes again, times its attempts",
        shown="90",
        metavar="SECONDS",
    ),
    _Option(
        "--max-requeue-delay",
        "NSQ_MAX_REQUEUE_DELAY",
        _non_negative_seconds,
        "the longest requeue delay, in seconds",
        shown="900",
        metavar="SECONDS",
    ),
    _Option(
        "--backoff",
        "NSQ_BACKOFF",
        _boolean,
        "slow down after failures",
        shown="on",
        boolean=True,
    ),
    _Option(
        "--max-backoff-duration",
        "NSQ_MAX_BACKOFF_DURATION",
        _non_negative_seconds,
        "the longest backoff, in seconds",
        shown="120",
        metavar="SECONDS",
    ),
    _Option(
        "--lookupd-poll-interval",
        "NSQ_LOOKUPD_POLL_INTERVAL",
        _seconds,
        "seconds between two queries of nsqlookupd",
        shown="60",
        metavar="SECONDS",
    ),
    _Option(
        "--dial-timeout",
        "NSQ_DIAL_TIMEOUT",
        _seconds,
        "seconds a connection to nsqd may take to open",
        shown="1",
        metavar="SECONDS",
    ),
    _Option(
        "--reconnect-delay",
        "NSQ_RECONNECT_DELAY",
        _seconds,
        "seconds before a lost nsqd given by address is connected to again, doubling",
        shown="8",
        metavar="SECONDS",
    ),
    _Option(
        "--max-reconnect-delay",
        "NSQ_MAX_RECONNECT_DELAY",
        _seconds,
        "the longest reconnect delay, in seconds",
        shown="30",
        metavar="SECONDS",
    ),
    _Option(
        "--heartbeat-interval",
        "NSQ_HEARTBEAT_INTERVAL",
        _seconds,
        "seconds between nsqd's heartbeats (1 to 60)",
        shown="30",
        metavar="SECONDS",
    ),
    _Option(
        "--msg-timeout",
        "NSQ_MSG_TIMEOUT",
        _seconds,
        "seconds nsqd waits for an answer before it delivers again",
        shown="nsqd's",
        metavar="SECONDS",
    ),
    _Option(
        "--client-id",
        "NSQ_CLIENT_ID",
        str,
        "the client id nsqd shows",
        shown="the host's short name",
        metavar="ID",
    ),
    _Option("--tls", "NSQ_TLS", _boolean, "negotiate TLS", boolean=True),
    _Option("--tls-ca", "NSQ_TLS_CA", str, "CA bundle to verify nsqd with", metavar="FILE"),
    _Option(
        "--tls-insecure",
        "NSQ_TLS_INSECURE",
        _boolean,
        "do not verify nsqd's certificate",
        boolean=True,
    ),
    _Option("--snappy", "NSQ_SNAPPY", _boolean, "snappy compression", boolean=True),
    _Option("--deflate", "NSQ_DEFLATE", _boolean, "deflate compression", boolean=True),
    _Option("--auth-secret", "NSQ_AUTH_SECRET", str, "AUTH secret", metavar="SECRET", secret=True),
    _Option(
        "--log-level",
        "NSQ_LOG_LEVEL",
        _log_level,
        "DEBUG, INFO, WARNING or ERROR",
        default="INFO",
        metavar="LEVEL",
    ),
    _Option(
        "--backend",
        "NSQ_BACKEND",
        _backend_name,
        "event loop: asyncio or trio",
        default="asyncio",
        metavar="NAME",
    ),
)

#: the settings that are consumer options of the same name
CONSUMER_OPTIONS = (
    "max_attempts",
    "lookupd_poll_interval",
    "dial_timeout",
    "reconnect_delay",
    "max_reconnect_delay",
    "heartbeat_interval",
    "default_requeue_delay",
    "max_requeue_delay",
    "backoff",
    "max_backoff_duration",
    "msg_timeout",
    "client_id",
    "snappy",
    "deflate",
)

EPILOG = """\
environment:
  Each option can also come from the environment variable named in its help
  (lists comma-separated); a flag wins over its variable.

stopping:
  SIGTERM or SIGINT stops gracefully: nothing new is taken, the handlers in
  progress finish and answer their messages (within --stop-timeout), exit
  status 0. A second signal stops at once: the messages held are requeued,
  exit status 130 (SIGINT) or 143 (SIGTERM). A handler that cannot be
  imported or is not callable is one error line and exit status 2.

http:
  --http-address serves /healthz (200 while the event loop runs), /readyz (200
  when subscribed to an nsqd, else 503 and why) and /metrics (Prometheus; with
  the metrics extra). An address that cannot be listened on is exit status 2.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The worker's handler and a flag for each of :data:`OPTIONS`."""
    parser.add_argument(
        "handler",
        metavar="MODULE:FUNCTION",
        help="the handler: an async function, or a plain one run in threads",
    )
    for option in OPTIONS:
        shown = option.shown
        if shown is None and option.default is not None:
            value = option.default
            shown = f"{value:g}" if isinstance(value, float) else str(value)
        default = "" if shown is None else f"; default: {shown}"
        text = f"{option.help} (env {option.env}{default})"
        if option.boolean:
            parser.add_argument(
                option.flag, action=argparse.BooleanOptionalAction, default=None, help=text
            )
        elif option.many:
            parser.add_argument(
                option.flag,
                action="append",
                default=None,
                type=option.kind,
                metavar=option.metavar,
                help=text,
            )
        else:
            parser.add_argument(
                option.flag, default=None, type=option.kind, metavar=option.metavar, help=text
            )


def check_usage(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    environ: Mapping[str, str] | None = None,
) -> None:
    """Fill each setting not given as a flag from its environment variable, then its default;
    a bad variable, or no topic, channel or address, is a usage error."""
    env = os.environ if environ is None else environ
    args.worker_prog = parser.prog
    for option in OPTIONS:
        if getattr(args, option.dest) is not None:
            continue
        text = env.get(option.env)
        value: Any = option.default
        if text is not None and (text.strip() or option.boolean):
            try:
                if option.many:
                    value = [option.kind(part.strip()) for part in text.split(",") if part.strip()]
                else:
                    value = option.kind(text.strip() if option.kind is not str else text)
            except argparse.ArgumentTypeError as exc:
                parser.error(f"{option.env}: {exc}")
        elif option.many:
            value = []
        setattr(args, option.dest, value)
    if not args.topic:
        parser.error("give the topic: --topic or NSQ_TOPIC")
    if not args.channel:
        parser.error("give the channel: --channel or NSQ_CHANNEL")
    if not args.nsqd_tcp_address and not args.lookupd_http_address:
        parser.error(
            "give --nsqd-tcp-address or --lookupd-http-address "
            "(or NSQD_TCP_ADDRESSES or NSQ_LOOKUPD_HTTP_ADDRESSES)"
        )
    if args.max_in_flight is None:
        args.max_in_flight = args.concurrency
