"""``worker``: run an application's handler on a topic/channel as a service.

``nsq-sansio worker package.module:handler --topic T --channel C --lookupd-http-address ...``
loads the handler (an async function, or a plain function run in worker threads), builds the
consumer (:class:`nsq_anyio.Consumer`) from flags and environment variables (flags win), logs
the effective configuration once, and runs ``consumer.run(handler, concurrency)`` until
stopped:

- SIGTERM or SIGINT stops gracefully: nothing new is taken, the handlers in progress finish
  and answer their messages (within ``--stop-timeout``; what is still unanswered then goes
  back to nsqd), exit status 0;
- a second signal stops at once: the messages held are requeued, exit status 128 + the
  signal's number (130 for SIGINT, 143 for SIGTERM);
- a handler that cannot be imported, or that is not callable, is one ``error:`` line and exit
  status 2, before any connection is made; so is a bad value of an environment variable.

The worker keeps its state in a :class:`WorkerState` (phase, connections, counters), which it
logs as a one-line summary every ``--stats-interval`` seconds on the ``nsq.worker`` logger.
With ``--http-address`` it also serves ``/healthz``, ``/readyz`` and ``/metrics`` over HTTP on
its event loop (see :mod:`nsq_cli._probes`); an address that cannot be listened on is one
``error:`` line and exit status 2, before any connection.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import math
import os
import signal
import ssl
import sys
import threading
import time
import traceback
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.to_thread

import nsq_proto
from nsq_anyio import Consumer, Message
from nsq_client import ConsumerStats
from nsq_client._message import is_async_callable

from ._values import address as _address
from ._values import channel_name as _channel_name
from ._values import count as _count
from ._values import seconds as _seconds
from ._values import tls_context
from ._values import topic_name as _topic_name

__all__ = ["WorkerState", "add_worker_parser", "check_worker_usage", "run_worker"]

log = logging.getLogger("nsq.worker")

#: the format of the worker's log lines (on stderr)
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

#: how long a stop at once (the second signal) may take before the process ends regardless
_HARD_STOP_BACKSTOP = 10.0

# -- values: a bad one is a usage error (exit status 2), as the other subcommands' are --------


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _tls(args: argparse.Namespace) -> ssl.SSLContext | None:
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
_CONSUMER_OPTIONS = (
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

WORKER_EPILOG = """\
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


def add_worker_parser(sub: Any, extra: Mapping[str, Any]) -> argparse.ArgumentParser:
    """Add the ``worker`` subcommand to ``sub`` (the subparsers of the command line)."""
    parser: argparse.ArgumentParser = sub.add_parser(
        "worker",
        help="run a handler (package.module:function) on a topic/channel as a service",
        epilog=WORKER_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        **extra,
    )
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
    return parser


def check_worker_usage(
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


# -- the handler --------------------------------------------------------------------------------


class HandlerError(Exception):
    """The handler cannot be loaded: one ``error:`` line, exit status 2."""


def load_handler(spec: str) -> Callable[[Message], Any]:
    """The object ``spec`` (``package.module:name``, the name may be dotted) names; a
    :class:`HandlerError` saying why it cannot be used."""
    module_name, colon, name = spec.partition(":")
    if not colon or not module_name or not name:
        raise HandlerError(f"handler {spec!r} is not MODULE:FUNCTION (e.g. myapp.handlers:handle)")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # as python -m does: the application's own modules
    try:
        target: Any = importlib.import_module(module_name)
    except (Exception, SystemExit) as exc:  # whatever the module raised while imported
        what = traceback.format_exception_only(type(exc), exc)[-1].strip()
        raise HandlerError(f"cannot import handler module {module_name!r}: {what}") from None
    for part in name.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise HandlerError(f"module {module_name!r} has no attribute {name!r}") from None
    if not callable(target):
        raise HandlerError(
            f"handler {spec!r} is not callable (it is of type {type(target).__name__})"
        )
    handler: Callable[[Message], Any] = target
    return handler


def _in_threads(
    function: Callable[[Message], Any], limiter: anyio.CapacityLimiter
) -> Callable[[Message], Awaitable[None]]:
    """A plain handler run in a worker thread, at most ``limiter``'s number at once; a stop
    at once does not wait for the thread (its message is requeued)."""

    async def handle(message: Message) -> None:
        await anyio.to_thread.run_sync(function, message, limiter=limiter, abandon_on_cancel=True)

    return handle


# -- the state ----------------------------------------------------------------------------------


@dataclass
class WorkerState:
    """What the worker is doing, for its summary lines (and for probes and metrics): the
    phase is set as it changes, the rest by :meth:`update` from the consumer's stats."""

    #: starting, running, stopping, stopped
    phase: str = "starting"
    #: the signal that started the stop (None before)
    stopped_by: int | None = None
    #: connections open, and subscribed
    connected: int = 0
    subscribed: int = 0
    #: the consumer's counters
    received: int = 0
    finished: int = 0
    requeued: int = 0
    given_up: int = 0
    in_flight: int = 0
    backoff_level: int = 0
    #: handlers running now
    handling: int = 0
    #: nsqlookupd answered that the topic does not exist (yet), and nothing is subscribed
    waiting_for_topic: bool = False
    started_at: float = field(default_factory=time.monotonic)

    @property
    def stopping(self) -> bool:
        return self.phase in ("stopping", "stopped")

    def update(self, consumer: Consumer) -> ConsumerStats:
        """Read the consumer's stats (which are returned)."""
        stats = consumer.stats()
        self.received = stats["messages_received"]
        self.finished = stats["messages_finished"]
        self.requeued = stats["messages_requeued"]
        self.given_up = stats["messages_given_up"]
        self.backoff_level = stats["backoff_level"]
        connections = stats["connections"]
        self.in_flight = sum(c["in_flight"] for c in connections)
        self.connected = sum(1 for c in connections if c["state"] not in ("INIT", "CLOSED"))
        self.subscribed = sum(1 for c in connections if c["state"] == "SUBSCRIBED")
        lookup = consumer.last_lookup
        self.waiting_for_topic = (
            lookup is not None and not lookup.topic_found and self.subscribed == 0
        )
        return stats

    def readiness(self, topic: str) -> tuple[bool, str]:
        """Whether the worker is ready to take messages, and the one line that says why:
        ready once a connection is subscribed, or while nsqlookupd lists no nsqd for the
        topic (nothing is wrong: the topic is made by its first publish, and the worker takes
        its messages then; a rollout must not wait for it); not while starting, stopping, or
        while no nsqd that has the topic is connected."""
        if self.phase == "starting":
            return False, "starting"
        if self.stopping:
            return False, "stopping"
        if self.subscribed:
            return True, "ok"
        if self.waiting_for_topic:
            return True, f"waiting for topic {topic} to exist (nsqlookupd has no producer for it)"
        if self.connected == 0:
            return False, "not connected to any nsqd"
        return False, "connected to nsqd, not subscribed yet"


def _summary(state: WorkerState, previous: int, seconds: float) -> str:
    rate = (state.received - previous) / seconds if seconds > 0 else 0.0
    return (
        f"received {state.received}, finished {state.finished}, requeued {state.requeued}, "
        f"given up {state.given_up}, {rate:.1f} msgs/s, in flight {state.in_flight}, "
        f"handling {state.handling}, backoff level {state.backoff_level}, "
        f"connections {state.subscribed} subscribed of {state.connected}"
        + (", waiting for nsqlookupd to list the topic" if state.waiting_for_topic else "")
    )


# -- running ------------------------------------------------------------------------------------


def _configuration(args: argparse.Namespace, consumer: Consumer, kind: str) -> str:
    """The effective configuration, one line, secrets masked: the consumer's own values for
    the options left to their defaults."""
    parts = [f"handler={args.handler} ({kind})"]
    for option in OPTIONS:
        value = getattr(args, option.dest)
        if value is None and option.dest in _CONSUMER_OPTIONS:
            value = getattr(consumer.config, option.dest)
        if option.secret and value:
            shown = "***"
        elif option.many:
            shown = ",".join(value) or "-"
        elif value is None:
            shown = "False" if option.boolean else "-"
        elif isinstance(value, float):
            shown = f"{value:g}"
        else:
            shown = str(value)
        parts.append(f"{option.dest}={shown}")
    return "worker starting: " + " ".join(parts)


def _consumer_options(args: argparse.Namespace) -> dict[str, Any]:
    options: dict[str, Any] = {
        "nsqd_tcp_addresses": args.nsqd_tcp_address,
        "lookupd_http_addresses": args.lookupd_http_address,
        "tls": _tls(args),
        "max_in_flight": args.max_in_flight,
        "stop_timeout": args.stop_timeout,
    }
    for name in _CONSUMER_OPTIONS:
        value = getattr(args, name)
        if value is not None:
            options[name] = value
    if args.auth_secret:
        options["auth_secret"] = args.auth_secret.encode()
    return options


class _Worker:
    def __init__(self, args: argparse.Namespace, handler: Callable[[Message], Any]) -> None:
        self.args = args
        self.state = WorkerState()
        self.function = handler
        self.consumer: Consumer | None = None
        #: the line the configuration line is followed by, with --http-address
        self.serving: str | None = None

    def snapshot(self) -> ConsumerStats | None:
        """The state brought up to date from the consumer; its stats (None before it)."""
        if self.consumer is None:
            return None
        return self.state.update(self.consumer)

    def readiness(self) -> tuple[bool, str]:
        self.snapshot()
        return self.state.readiness(self.args.topic)

    async def _probes(self) -> Callable[[], Coroutine[Any, Any, None]] | None:
        """With --http-address, its listener bound and how to serve it (None when it cannot
        be bound: the error line is written)."""
        from . import _probes

        address = self.args.http_address
        host, port = nsq_proto.parse_address(address)
        try:
            listener = await _probes.listen(host, port)
        except OSError as exc:
            reason = exc.strerror or str(exc)
            print(
                f"{self.args.worker_prog}: error: cannot listen on {address} "
                f"(--http-address): {reason}",
                file=sys.stderr,
            )
            return None
        try:
            from . import _metrics
        except ModuleNotFoundError as exc:
            if (exc.name or "").partition(".")[0] != "prometheus_client":
                raise
            probes = _probes.Probes(self.readiness, None)
            self.serving = (
                f"serving /healthz and /readyz on http://{address}; /metrics answers 501: "
                f"{_probes.MISSING_METRICS}"
            )
        else:
            collector = _metrics.WorkerCollector(
                self.args.topic,
                self.args.channel,
                self.state,
                self.snapshot,
                # read after the snapshot of the same scrape
                lambda: self.state.readiness(self.args.topic)[0],
            )
            probes = _probes.Probes(self.readiness, _metrics.exposition(collector))
            self.serving = f"serving /healthz, /readyz and /metrics on http://{address}"

        async def serve() -> None:
            await probes.serve(listener)

        return serve

    async def main(self) -> int:
        serve: Callable[[], Coroutine[Any, Any, None]] | None = None
        if self.args.http_address:
            serve = await self._probes()
            if serve is None:
                return 2
        if is_async_callable(self.function):
            inner: Callable[[Message], Awaitable[None]] = self.function
        else:
            inner = _in_threads(self.function, anyio.CapacityLimiter(self.args.concurrency))
        self.handler = self._counted(inner)
        self.graceful = anyio.Event()
        #: a second signal came: the handlers in progress are cancelled
        self.at_once = False
        #: the scope of the handlers (cancelled by a second signal)
        self.handlers = anyio.CancelScope()
        async with anyio.create_task_group() as outer:
            outer.start_soon(self.watch_signals)
            if serve is not None:
                outer.start_soon(serve)
            await self._consume()
            outer.cancel_scope.cancel()
        self.state.phase = "stopped"
        signum = self.state.stopped_by
        if self.at_once and signum is not None:
            return 128 + signum
        return 0

    def _counted(
        self, handler: Callable[[Message], Awaitable[None]]
    ) -> Callable[[Message], Awaitable[None]]:
        state = self.state

        async def handle(message: Message) -> None:
            state.handling += 1
            try:
                await handler(message)
            finally:
                state.handling -= 1

        return handle

    async def watch_signals(self) -> None:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                name = signal.Signals(signum).name
                if self.state.stopped_by is None:
                    self.state.stopped_by = signum
                    self.state.phase = "stopping"
                    log.info(
                        "%s: stopping gracefully: taking nothing new, waiting up to %g s for "
                        "%d handlers in progress (a second signal stops at once)",
                        name,
                        self.args.stop_timeout,
                        self.state.handling,
                    )
                    self.graceful.set()
                else:
                    self.state.stopped_by = signum
                    log.warning("%s again: stopping at once, requeueing the messages held", name)
                    # the handlers in progress are cancelled and their messages requeued
                    # (the consumer's stop then ends at once); the connections stay up to
                    # carry the REQs
                    self.at_once = True
                    self.handlers.cancel()
                    threading.Thread(target=self._backstop, args=(signum,), daemon=True).start()

    def _backstop(self, signum: int) -> None:
        """Ends the process if the stop at once has not ended it in time."""
        time.sleep(_HARD_STOP_BACKSTOP)
        sys.stderr.flush()
        os._exit(128 + signum)

    async def report(self, consumer: Consumer) -> None:
        interval = self.args.stats_interval
        previous, then = 0, time.monotonic()
        while True:
            await anyio.sleep(interval)
            self.state.update(consumer)
            now = time.monotonic()
            log.info("%s", _summary(self.state, previous, now - then))
            previous, then = self.state.received, now

    async def _run(self, consumer: Consumer) -> None:
        with self.handlers:
            await consumer.run(self.handler, self.args.concurrency)

    async def _consume(self) -> None:
        args = self.args
        consumer = Consumer(args.topic, args.channel, **_consumer_options(args))
        kind = "async" if is_async_callable(self.function) else "plain, run in threads"
        log.info("%s", _configuration(args, consumer, kind))
        if self.serving is not None:
            log.info("%s", self.serving)
        self.consumer = consumer
        start = time.monotonic()
        try:
            async with consumer:
                self.state.phase = "running" if not self.graceful.is_set() else "stopping"
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self.report, consumer)
                    tg.start_soon(self._run, consumer)
                    await self.graceful.wait()
                    # nothing new; the handlers in progress answer (up to stop_timeout)
                    await consumer.stop()
                    if self.state.handling and not self.at_once:
                        log.warning(
                            "%d handlers still running after --stop-timeout: their messages "
                            "were requeued",
                            self.state.handling,
                        )
                    tg.cancel_scope.cancel()
        finally:
            self.state.update(consumer)
            seconds = max(time.monotonic() - start, 1e-9)
            log.info("worker stopped: %s", _summary(self.state, 0, seconds))


def run_worker(args: argparse.Namespace) -> int:
    """Load the handler (exit status 2 when it cannot be), log the configuration, and run until
    stopped (exit status 0, or 130/143 after a second signal)."""
    try:
        handler = load_handler(args.handler)
    except HandlerError as exc:
        print(f"{args.worker_prog}: error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=args.log_level, format=LOG_FORMAT, force=True)
    worker = _Worker(args, handler)
    code: int = anyio.run(worker.main, backend=args.backend)
    # a plain handler still running in a thread (abandoned by a stop at once, or past
    # --stop-timeout; its message went back to nsqd) is not waited for
    deadline = time.monotonic() + 0.5
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join(max(0.0, deadline - time.monotonic()))
    if any(
        t.is_alive() and not t.daemon and t is not threading.main_thread()
        for t in threading.enumerate()
    ):
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code
