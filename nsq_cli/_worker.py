"""``worker``: run an application's handler on a topic/channel as a service.

``nsq-sansio worker package.module:handler --topic T --channel C --lookupd-http-address ...``
loads the handler (an async function, or a plain function run in worker threads), builds the
consumer (:class:`nsq_anyio.Consumer`) from flags and environment variables (flags win), logs
the effective configuration once, and runs ``consumer.run(handler, concurrency)`` until
stopped (its settings, each a flag and an environment variable, are
:mod:`nsq_cli._worker_options`'s):

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
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.to_thread

import nsq_proto
from nsq_anyio import Consumer, Message
from nsq_client import ConsumerStats
from nsq_client._message import is_async_callable

from ._worker_options import CONSUMER_OPTIONS, EPILOG, OPTIONS, add_arguments, check_usage, tls

__all__ = [
    "EPILOG",
    "HELP",
    "NAME",
    "WorkerState",
    "add_arguments",
    "check_usage",
    "run",
]

NAME = "worker"
HELP = "run a handler (package.module:function) on a topic/channel as a service"

log = logging.getLogger("nsq.worker")

#: the format of the worker's log lines (on stderr)
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

#: how long a stop at once (the second signal) may take before the process ends regardless
_HARD_STOP_BACKSTOP = 10.0

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
        if value is None and option.dest in CONSUMER_OPTIONS:
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
        "tls": tls(args),
        "max_in_flight": args.max_in_flight,
        "stop_timeout": args.stop_timeout,
    }
    for name in CONSUMER_OPTIONS:
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


def run(args: argparse.Namespace) -> int:
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
