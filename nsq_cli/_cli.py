"""Command line: ``serve`` (the emulator on loopback), ``pub``, ``tail``, ``stats`` and ``demo``.

Installed as ``nsq-sansio``; also ``python -m nsq_cli`` and ``python -m nsq_anyio``, and
``python -m nsq_emulator`` is ``serve`` alone (:func:`serve_main`).  It runs on
:mod:`nsq_anyio`; ``serve`` and ``demo`` import the emulator (:mod:`nsq_emulator.loopback`)
when they start, so that ``pub``, ``tail`` and ``stats`` do not load it.

``pub`` and ``tail`` also take the spellings of nsq's own tools (``to_nsq``, ``nsq_tail``):
``--topic=T``, ``--channel=C``, ``-n N``, repeated ``--nsqd-tcp-address`` and
``--lookupd-http-address``.

Exit status: 0 done, 1 a runtime error (one line on stderr: ``nsq: error: ...``), 2 a usage
error (argparse's usage and one ``error:`` line), 128 + the signal's number when stopped by
SIGINT (130, Ctrl-C) or SIGTERM (143).
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import http.client
import inspect
import ipaddress
import json
import logging
import os
import re
import signal
import socket
import ssl
import stat
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, NoReturn, TypeVar

import anyio
import anyio.lowlevel

import nsq_proto
from nsq_anyio import Consumer, Producer

from ._values import address as _address
from ._values import channel_name as _channel_name
from ._values import count as _count
from ._values import seconds as _seconds
from ._values import tls_context
from ._values import topic_name as _topic_name

__all__ = ["main", "serve_main"]

_T = TypeVar("_T")

#: how long ``stats`` waits for an HTTP answer
_HTTP_TIMEOUT = 10.0
#: how long ``tail`` waits for each nsqlookupd's first answer
_LOOKUP_TIMEOUT = 2.0


class _Failure(Exception):
    """A runtime error, reported as one line (``nsq: error: ...``, exit status 1)."""


# -- argparse types: a bad value is a usage error (exit status 2) -------------------------------


def _tls(args: argparse.Namespace) -> ssl.SSLContext | None:
    return tls_context(args, _Failure)


def _port(text: str) -> int:
    """A port to listen on: 0 (any free port) to 65535."""
    if not (text.isascii() and text.isdigit() and int(text) <= 65535):
        raise argparse.ArgumentTypeError(f"{text!r} is not a port from 0 (any free port) to 65535")
    return int(text)


def _loopback(text: str) -> str:
    """A loopback address of this machine (``serve`` is for local use only)."""
    try:
        loopback = text == "localhost" or ipaddress.ip_address(text).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a loopback address (127.0.0.1, ::1 or localhost): "
            "the emulator serves this machine only"
        )
    return text


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--nsqd-tcp-address",
        action="append",
        default=[],
        type=_address,
        metavar="HOST:PORT",
        help="nsqd TCP address (repeatable)",
    )
    parser.add_argument(
        "--lookupd-http-address",
        action="append",
        default=[],
        type=_address,
        metavar="HOST:PORT",
        help="nsqlookupd HTTP address (repeatable)",
    )
    parser.add_argument("--tls", action="store_true", help="negotiate TLS")
    parser.add_argument("--tls-ca", metavar="FILE", help="CA bundle to verify nsqd with")
    parser.add_argument("--tls-insecure", action="store_true", help="do not verify the certificate")
    parser.add_argument("--snappy", action="store_true", help="snappy compression")
    parser.add_argument("--deflate", action="store_true", help="deflate compression")
    parser.add_argument("--auth-secret", metavar="SECRET", help="AUTH secret")
    _backend(parser)


def _backend(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--backend",
        choices=["asyncio", "trio"],
        default="asyncio",
        help="event loop (default: %(default)s)",
    )


def _options(args: argparse.Namespace) -> dict[str, Any]:
    options: dict[str, Any] = {
        "nsqd_tcp_addresses": args.nsqd_tcp_address,
        "lookupd_http_addresses": args.lookupd_http_address,
        "tls": _tls(args),
        "snappy": args.snappy,
        "deflate": args.deflate,
    }
    if args.auth_secret:
        options["auth_secret"] = args.auth_secret.encode()
    return options


def _check_usage(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """What argparse cannot check alone: one topic, at least one address, distinct ports."""
    if args.command in ("pub", "tail"):
        if args.topic and args.topic_flag:
            parser.error("give the topic once (as an argument or as --topic)")
        args.topic = args.topic or args.topic_flag
        if not args.topic:
            parser.error("give a topic (as an argument or as --topic)")
        if not args.nsqd_tcp_address and not args.lookupd_http_address:
            parser.error("give --nsqd-tcp-address or --lookupd-http-address")
    if args.command == "worker":
        from ._worker import check_worker_usage

        check_worker_usage(parser, args)
    if args.command == "serve":
        ports = [p for p in (args.tcp_port, args.http_port, args.lookupd_http_port) if p]
        if len(set(ports)) != len(ports):
            parser.error("give --tcp-port, --http-port and --lookupd-http-port different ports")


class _Progress:
    """Counts messages; a live line on a terminal's stderr, one summary line at the end."""

    def __init__(self, verb: str, topic: str) -> None:
        self.verb = verb
        self.topic = topic
        self.count = 0
        self.start = time.perf_counter()
        self._shown = self.start
        self._live = sys.stderr.isatty()

    def add(self, n: int = 1) -> None:
        self.count += n
        if self._live:
            now = time.perf_counter()
            if now - self._shown >= 0.5:
                self._shown = now
                rate = self.count / (now - self.start)
                print(f"\r{self.verb} {self.count} ({rate:,.0f} msgs/s)", end="", file=sys.stderr)

    def summary(self) -> str:
        seconds = max(time.perf_counter() - self.start, 1e-9)
        return (
            f"{self.verb} {self.count} messages {'to' if self.verb == 'published' else 'from'} "
            f"{self.topic} in {seconds:.2f} s ({self.count / seconds:,.0f} msgs/s)"
        )

    def close(self, error: BaseException | None = None) -> None:
        """End the live line; the summary unless the command failed with ``error``."""
        if self._live:
            print("\r\033[K", end="", file=sys.stderr)
        if error is None or _stopped(error):
            print(self.summary(), file=sys.stderr)


def _stopped(error: BaseException) -> bool:
    """Whether ``error`` is the command being stopped (cancelled, interrupted), not a failure."""
    return isinstance(error, KeyboardInterrupt | anyio.get_cancelled_exc_class())


async def _stdin_lines() -> AsyncIterator[bytes]:
    """The lines of stdin without their ends; waiting for a terminal or a pipe can be
    cancelled (Ctrl-C stops at once, not at the next line)."""
    fd = sys.stdin.fileno()
    mode = os.fstat(fd).st_mode
    if stat.S_ISREG(mode):  # a file: reading never waits
        for line in sys.stdin.buffer:
            yield line.rstrip(b"\r\n")
            await anyio.lowlevel.checkpoint()
        return
    if os.isatty(fd):
        print("publishing each line typed (Ctrl-D ends, Ctrl-C stops)", file=sys.stderr, flush=True)
    pending = b""
    waitable = True
    while True:
        if waitable:
            try:
                await anyio.wait_readable(fd)
            except OSError:  # a device that cannot be waited for (/dev/null): read at once
                waitable = False
        else:
            await anyio.lowlevel.checkpoint()
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            yield line.rstrip(b"\r")
    if pending:
        yield pending.rstrip(b"\r")


async def _pub(args: argparse.Namespace) -> int:
    topic = args.topic
    options = _options(args)
    options["publish_timeout"] = args.timeout
    progress = _Progress("published", topic)
    try:
        async with Producer(**options) as producer:
            if args.count is not None:
                body = b"x" * args.size
                batch = [body] * min(100, args.count)
                while progress.count < args.count:
                    n = min(len(batch), args.count - progress.count)
                    await producer.publish_many(topic, batch[:n])
                    progress.add(n)
            else:
                async for line in _stdin_lines():
                    if line:
                        await producer.publish(topic, line)
                        progress.add()
    except BaseException as exc:
        progress.close(exc)
        raise
    progress.close()
    return 0


def _json_line(message: Any) -> bytes:
    record = {
        "id": message.id.decode("ascii", "replace"),
        "attempts": message.attempts,
        "timestamp": message.timestamp,
        "nsqd": message.nsqd_address,
        "body": message.body.decode("utf-8", "replace"),
    }
    return json.dumps(record, ensure_ascii=False).encode() + b"\n"


def _lookup_channels(lookupds: list[str], topic: str) -> set[str]:
    """The channels the nsqlookupds list for ``topic`` (none for a topic they do not know); a
    :class:`_Failure` naming an nsqlookupd that does not answer (nothing listens there, it
    refuses, it is not nsqlookupd)."""
    channels: set[str] = set()
    query = urllib.parse.urlencode({"topic": topic})
    for address in lookupds:
        answer = _http_json(
            address, f"/lookup?{query}", service="nsqlookupd", timeout=_LOOKUP_TIMEOUT
        )
        if answer is not None:  # None: 404, TOPIC_NOT_FOUND
            channels.update(answer.get("channels") or [])
    return channels


def _new_channel_note(args: argparse.Namespace, topic: str, channel: str) -> str | None:
    """What to say of a channel that may not exist yet: nsqd gives a new channel only the
    messages published after it was created (the first channel of a topic also takes what
    the topic held)."""
    known: set[str] | None = None
    if args.lookupd_http_address:
        known = _lookup_channels(args.lookupd_http_address, topic)
    if known is None:
        return (
            f"note: if channel {channel} is new, it receives only the messages published to "
            f"{topic} from now on"
        )
    if channel in known or not known:
        return None
    return (
        f"note: channel {channel} is new: it receives only the messages published to {topic} "
        "from now on"
    )


async def _in_daemon_thread(function: Callable[..., _T], *args: Any) -> _T:
    """``function(*args)`` in a thread of its own that a stop does not wait for (blocking
    HTTP with a timeout: Ctrl-C ends the command at once, not when the request gives up)."""
    results: list[_T] = []
    errors: list[BaseException] = []

    def call() -> None:
        try:
            results.append(function(*args))
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    while thread.is_alive():
        await anyio.sleep(0.01)
    if errors:
        raise errors[0]
    return results[0]


#: how far nsqd's clock may lag this machine's before a message published after tail
#: subscribed looks older than its subscription (the backlog warning ignores the difference)
_CLOCK_SKEW = 1.0


class _Connections:
    """Watches tail's connections as they come up (:meth:`watch`, a task beside the
    consumer):

    - until each nsqd given with ``--nsqd-tcp-address`` has been subscribed to once, a failed
      connection to it ends tail (a :class:`_Failure`: an address that does not answer at the
      start is a mistake to report, as nsq_tail does, not an outage to wait out); the
      consumer's own warnings are held back meanwhile, so that the error is said once;
    - prints ``note`` (what a new channel receives) once subscribed, when it is true;
    - knows when each nsqd was subscribed to (by this machine's clock), so that a message
      published before that is recognised (:meth:`from_before`).
    """

    def __init__(
        self, consumer: Consumer, args: argparse.Namespace, note: str | None, started: float
    ) -> None:
        self.consumer = consumer
        self.note = note
        self.lookupd = bool(args.lookupd_http_address)
        self.given = {_host_port(address) for address in args.nsqd_tcp_address}
        #: the given nsqd not subscribed to yet
        self.pending = set(self.given)
        #: nsqd address -> a time before tail subscribed to it
        self.subscribed_after: dict[str, float] = {}
        #: when the connections were last looked at (none subscribed then is before this)
        self.checked_at = started
        self._judged: BaseException | None = None

    async def watch(self) -> None:
        log = logging.getLogger("nsq")
        level = log.level
        if self.pending:
            log.setLevel(logging.ERROR)
        try:
            while True:
                now = time.time()
                subscribed = {
                    c["address"]
                    for c in self.consumer.stats()["connections"]
                    if c["state"] == "SUBSCRIBED"
                }
                for address in subscribed:
                    self.subscribed_after.setdefault(address, self.checked_at)
                self.checked_at = now
                if subscribed and self.note is not None:
                    print(self.note, file=sys.stderr, flush=True)
                    self.note = None
                if self.pending:
                    self.pending -= subscribed
                    self._judge_failures()
                    if not self.pending:
                        log.setLevel(level)
                await anyio.sleep(0.02)
        finally:
            log.setLevel(level)

    def _judge_failures(self) -> None:
        """A failure of a connection to a given nsqd not subscribed to yet ends tail."""
        errors = self.consumer.connection_errors
        fresh: list[BaseException] = []
        for error in reversed(errors):
            if error is self._judged:
                break
            fresh.append(error)
        if errors:
            self._judged = errors[-1]
        for error in reversed(fresh):
            text = str(error)
            named = {address for address in self.given if _names(text, address)}
            if named:
                if not named & self.pending:
                    continue  # an nsqd subscribed to already: waited for
            elif self.lookupd:
                continue  # an nsqd found through nsqlookupd: waited for
            else:  # the connection is to one of the given nsqd, and says not which
                text = f"{', '.join(sorted(self.pending))}: {text}"
            raise _Failure(text)

    def from_before(self, message: Any) -> bool:
        """Whether ``message`` was published before tail subscribed to its nsqd (by its
        timestamp, nsqd's clock, give or take :data:`_CLOCK_SKEW`)."""
        subscribed = self.subscribed_after.get(message.nsqd_address, self.checked_at)
        return bool(message.timestamp / 1e9 < subscribed - _CLOCK_SKEW)


def _host_port(address: str) -> str:
    """``address`` as the consumer names it (``host:port``, an IPv6 host without brackets)."""
    host, port = nsq_proto.parse_address(address)
    return f"{host}:{port}"


def _names(text: str, address: str) -> bool:
    """Whether ``text`` names ``address`` (not an address that merely contains it)."""
    return re.search(rf"(?<![\w.:]){re.escape(address)}(?!\w)", text) is not None


def _backlog_warning(topic: str, channel: str) -> str:
    return (
        f"warning: channel {channel} took messages published to {topic} before it was "
        f"created ({topic} had no other channel): nsqd deletes them with this ephemeral "
        "channel when tail ends; give --channel to read them into a channel that stays"
    )


async def _tail(args: argparse.Namespace) -> int:
    topic = args.topic
    channel = args.channel or f"tail{os.getpid()}#ephemeral"
    options = _options(args)
    options["max_in_flight"] = args.max_in_flight
    note = await _in_daemon_thread(_new_channel_note, args, topic, channel)
    progress = _Progress("received", topic)
    as_json = args.format == "json"
    out = sys.stdout.buffer
    # on the channel tail made up, a message published before it existed is from the topic's
    # backlog, which it took because the topic had no channel: nsqd deletes it with the channel
    warn_of_backlog = not args.channel
    started = time.time()
    try:
        async with Consumer(topic, channel, **options) as consumer:
            connections = _Connections(consumer, args, note, started)
            async with anyio.create_task_group() as tg:
                tg.start_soon(connections.watch)
                async for message in consumer:
                    if warn_of_backlog and connections.from_before(message):
                        print(_backlog_warning(topic, channel), file=sys.stderr, flush=True)
                        warn_of_backlog = False
                    out.write(_json_line(message) if as_json else message.body + b"\n")
                    out.flush()
                    await message.finish()
                    progress.add()
                    if args.n is not None and progress.count >= args.n:
                        break
                tg.cancel_scope.cancel()
    except BaseException as exc:
        progress.close(exc)
        raise
    progress.close()
    return 0


def _stats_rows(stats: dict[str, Any]) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = [
        ("topic", "channel", "depth", "in_flight", "requeued", "timed_out", "clients")
    ]
    for t in stats.get("topics") or []:
        rows.append((t["topic_name"], "", str(t.get("depth", 0)), "", "", "", ""))
        for c in t.get("channels") or []:
            rows.append(
                (
                    t["topic_name"],
                    c["channel_name"],
                    str(c.get("depth", 0)),
                    str(c.get("in_flight_count", 0)),
                    str(c.get("requeue_count", 0)),
                    str(c.get("timeout_count", 0)),
                    str(len(c.get("clients") or [])),
                )
            )
    return rows


def _not_http(address: str, service: str = "nsqd") -> str:
    if service == "nsqlookupd":
        return (
            f"{address} does not answer HTTP: give nsqlookupd's HTTP address (port 4161 by default)"
        )
    return (
        f"{address} does not answer HTTP: is it nsqd's TCP port? "
        "give nsqd's HTTP address (port 4151 by default)"
    )


def _http_json(address: str, target: str, *, service: str, timeout: float) -> dict[str, Any] | None:
    """The JSON object that ``service`` (nsqd or nsqlookupd) at ``address`` answers ``GET
    target`` with (without the envelope of older versions), or None when it answers 404; a
    :class:`_Failure` naming anything else that went wrong."""
    path = target.split("?", 1)[0]
    try:
        with urllib.request.urlopen(f"http://{address}{target}", timeout=timeout) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise _Failure(f"{address} answered {path} with HTTP {exc.code} {exc.reason}") from None
    except urllib.error.URLError as exc:
        reason = exc.reason
        if isinstance(reason, OSError):
            raise _Failure(_os_error(reason, address, service, timeout)) from None
        raise _Failure(f"{address}: {reason}") from None
    except http.client.HTTPException:
        raise _Failure(_not_http(address, service)) from None
    except OSError as exc:
        raise _Failure(_os_error(exc, address, service, timeout)) from None
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise _Failure(
            f"{address} did not answer {path} with JSON: is it {service}'s HTTP address?"
        )
    answer = data.get("data", data)  # older versions answer in an envelope
    return answer if isinstance(answer, dict) else data


def _fetch_stats(address: str, query: str) -> dict[str, Any]:
    """nsqd's ``/stats`` at ``address``; a :class:`_Failure` naming what went wrong."""
    stats = _http_json(address, f"/stats?{query}", service="nsqd", timeout=_HTTP_TIMEOUT)
    if stats is None:
        raise _Failure(
            f"{address} answered /stats with HTTP 404 Not Found: not nsqd's HTTP address "
            "(nsqlookupd's?)"
        )
    return stats


def _os_error(
    exc: OSError, address: str, service: str = "nsqd", timeout: float = _HTTP_TIMEOUT
) -> str:
    """One line for a failure to reach ``address``."""
    if isinstance(exc, ConnectionRefusedError):
        return f"connection refused by {address}"
    if isinstance(exc, ConnectionResetError | ConnectionAbortedError):
        return _not_http(address, service)
    if isinstance(exc, TimeoutError):
        return f"{address} did not answer within {timeout:g} s"
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve the host of {address}: {exc.strerror}"
    return f"{address}: {exc.strerror or exc}"


def _stats(args: argparse.Namespace) -> int:
    """nsq_stat-like: depth, in flight, requeue and timeout counts from nsqd's /stats."""
    query = urllib.parse.urlencode(
        {"format": "json", **({"topic": args.topic} if args.topic else {})}
    )
    shown = 0
    while True:
        answers = [(address, _fetch_stats(address, query)) for address in args.nsqd_http_address]
        if args.topic:
            for _, stats in answers:  # an nsqd that does not filter by topic is filtered here
                stats["topics"] = [
                    t for t in stats.get("topics") or [] if t.get("topic_name") == args.topic
                ]
            if not any(stats["topics"] for _, stats in answers):
                where = ", ".join(args.nsqd_http_address)
                raise _Failure(f"topic {args.topic} does not exist on {where}")
        for address, stats in answers:
            rows = _stats_rows(stats)
            widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
            print(f"# {address}")
            for row in rows:
                print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))
        shown += 1
        if args.interval is None or (args.count is not None and shown >= args.count):
            return 0
        sys.stdout.flush()
        time.sleep(args.interval)


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
            raise _Failure(f"cannot listen on {where}: {exc.strerror or exc}") from None


async def _serve(args: argparse.Namespace) -> int:
    """The emulator (one nsqd and an nsqlookupd) on loopback until stopped."""
    from nsq_emulator.loopback import serve_emulator

    for port in (args.lookupd_http_port, args.tcp_port, args.http_port):
        if port:
            _check_free(args.host, port)
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
            raise _Failure(f"cannot listen on {args.host}: {exc.strerror or exc}") from None
        print(f"nsqd TCP      {cluster.nsqd_tcp_addresses[0]}", flush=True)
        print(f"nsqd HTTP     {cluster.nsqd_http_addresses[0]}", flush=True)
        print(f"lookupd HTTP  {cluster.lookupd_http_addresses[0]}", flush=True)
        await anyio.sleep_forever()
    return 0


async def _demo(args: argparse.Namespace) -> int:
    """Serve the emulator, publish ``--count`` messages, tail them back, check every one."""
    from nsq_emulator.loopback import serve_emulator

    async with serve_emulator(nsqd_count=2) as cluster:
        print(f"emulated nsqd at {', '.join(cluster.nsqd_tcp_addresses)}", file=sys.stderr)
        print(f"emulated lookupd at {cluster.lookupd_http_addresses[0]}", file=sys.stderr)
        count = args.count
        start = time.perf_counter()
        async with Producer(nsqd_tcp_addresses=cluster.nsqd_tcp_addresses) as producer:
            for first in range(0, count, 100):
                batch = [b"message %d" % i for i in range(first, min(first + 100, count))]
                await producer.publish_many(args.topic, batch)
        published = time.perf_counter() - start
        seen: set[bytes] = set()
        start = time.perf_counter()
        async with Consumer(
            args.topic,
            "demo",
            lookupd_http_addresses=cluster.lookupd_http_addresses,
            max_in_flight=200,
        ) as consumer:
            with anyio.fail_after(60):
                async for message in consumer:
                    seen.add(message.body)
                    await message.finish()
                    if len(seen) == count:
                        break
        consumed = time.perf_counter() - start
    missing = count - len(seen)  # the emulator is this command's own: no other bodies
    print(f"published {count} messages in {published:.2f} s")
    print(f"consumed {len(seen)} distinct messages in {consumed:.2f} s (via lookupd, 2 nsqd)")
    print("round trip OK" if not missing else f"round trip FAILED: {missing} missing")
    return 0 if not missing else 1


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
    """The one line for a runtime error, or None for a bug (shown with its traceback)."""
    if isinstance(error, _Failure | nsq_proto.NSQError):
        return str(error)
    if isinstance(error, OSError):  # a TLS file that cannot be read, a closed stdout...
        return str(error)
    return None


def _serve_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``serve``: where to listen, and the event loop."""
    parser.add_argument(
        "--host",
        type=_loopback,
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
            type=_port,
            default=default,
            metavar="PORT",
            help=f"{what} port, 0 for any free one (default: %(default)s)",
        )
    _backend(parser)


#: the end of ``tail --help``: what tail does when an address does not answer, and what a new
#: channel receives (as docs/cli.md says)
_TAIL_EPILOG = """\
addresses that do not answer:
  An nsqd given with --nsqd-tcp-address that refuses tail's first connection
  (nothing listens there, TLS, AUTH, not nsqd), or an nsqlookupd given with
  --lookupd-http-address that does not answer tail's first query, ends tail
  with one error line and exit status 1. Once subscribed, tail waits for an
  nsqd that goes away (a restart) and reconnects to it, as nsq_tail does.

a new channel:
  Without --channel, tail reads a new ephemeral channel, which receives what is
  published from now on; but when the topic has no channel yet, it also takes
  every message the topic holds, and nsqd deletes them with the channel when
  tail ends (tail warns when that happens). Give --channel to read a channel
  that stays.
"""


class _ArgumentParser(argparse.ArgumentParser):
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


#: argparse suggests close choices itself (Python 3.14 and later)
_SUGGESTS_CHOICES = "suggest_on_error" in inspect.signature(argparse.ArgumentParser).parameters


def _new_parser(**kwargs: Any) -> _ArgumentParser:
    if _SUGGESTS_CHOICES:
        kwargs["suggest_on_error"] = True
    return _ArgumentParser(**kwargs)


def _parse(
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None,
    commands: dict[str, argparse.ArgumentParser] | None = None,
) -> argparse.Namespace:
    """``argv`` parsed; an argument no option takes is a usage error of the subcommand it was
    given to (its usage, ``PROG SUBCOMMAND: error: ...``), naming the close option."""
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        owner = parser if commands is None else commands[args.command]
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


def _parser(
    prog: str | None,
) -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    parser = _new_parser(prog=prog, description="NSQ on anyio")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_ArgumentParser)
    extra: dict[str, Any] = {"suggest_on_error": True} if _SUGGESTS_CHOICES else {}

    serve = sub.add_parser("serve", help="run the NSQ emulator on loopback", **extra)
    _serve_arguments(serve)

    pub = sub.add_parser(
        "pub", help="publish stdin lines (or generated bodies) to a topic", **extra
    )
    _topic_arguments(pub, "to_nsq")
    pub.add_argument(
        "--count", type=_count, help="publish this many generated bodies instead of stdin"
    )
    pub.add_argument(
        "--size",
        type=_count,
        default=200,
        metavar="BYTES",
        help="size of each generated body (default: %(default)s)",
    )
    pub.add_argument(
        "--timeout",
        type=_seconds,
        default=10.0,
        metavar="SECONDS",
        help="how long a publish waits for nsqd (default: %(default)g)",
    )
    _common(pub)

    tail = sub.add_parser(
        "tail",
        help="print the bodies of a topic/channel",
        epilog=_TAIL_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        **extra,
    )
    _topic_arguments(tail, "nsq_tail")
    tail.add_argument(
        "--channel", type=_channel_name, help="the channel (without it: a new ephemeral one)"
    )
    tail.add_argument("-n", type=_count, metavar="N", help="stop after N messages")
    # nsq_tail's other spelling (Go's flags take -n and --n), not shown twice in the help
    tail.add_argument("--n", type=_count, dest="n", help=argparse.SUPPRESS)
    tail.add_argument(
        "--max-in-flight",
        type=_count,
        default=200,
        metavar="N",
        help="messages nsqd may send before tail answers them (default: %(default)s)",
    )
    tail.add_argument(
        "--format",
        choices=["raw", "json"],
        default="raw",
        help="raw bodies, or JSON lines with id, attempts, timestamp, nsqd and body "
        "(default: %(default)s)",
    )
    _common(tail)

    stats = sub.add_parser("stats", help="depth, in-flight, requeue and timeout counts", **extra)
    stats.add_argument(
        "--nsqd-http-address",
        action="append",
        required=True,
        type=_address,
        metavar="HOST:PORT",
        help="nsqd HTTP address (port 4151 by default; repeatable)",
    )
    stats.add_argument("--topic", type=_topic_name, help="only this topic")
    stats.add_argument(
        "--interval",
        type=_seconds,
        metavar="SECONDS",
        help="show again every this many seconds (without it: once)",
    )
    stats.add_argument("--count", type=_count, help="with --interval: stop after this many")

    demo = sub.add_parser(
        "demo", help="publish/tail round trip against the embedded emulator", **extra
    )
    demo.add_argument(
        "--count",
        type=_count,
        default=10000,
        help="messages to publish and consume back (default: %(default)s)",
    )
    demo.add_argument(
        "--topic", type=_topic_name, default="demo", help="the topic (default: %(default)s)"
    )
    _backend(demo)
    from ._worker import add_worker_parser

    worker = add_worker_parser(sub, extra)
    commands = {"serve": serve, "pub": pub, "tail": tail, "stats": stats, "demo": demo}
    return parser, {**commands, "worker": worker}


def _topic_arguments(parser: argparse.ArgumentParser, tool: str) -> None:
    """The topic, as an argument or as ``--topic=`` (as nsq's own ``tool`` takes it)."""
    parser.add_argument("topic", nargs="?", type=_topic_name, help="the topic (or --topic)")
    parser.add_argument(
        "--topic",
        dest="topic_flag",
        type=_topic_name,
        metavar="TOPIC",
        help=f"the topic, as {tool} takes it",
    )


def _run(args: argparse.Namespace) -> int:
    if args.command == "stats":
        # stopped by Ctrl-C even when started with SIGINT ignored, as the other commands are
        signal.signal(signal.SIGINT, signal.default_int_handler)
        return _stats(args)
    if args.command == "worker":
        from ._worker import run_worker

        return run_worker(args)
    runner = {"serve": _serve, "pub": _pub, "tail": _tail, "demo": _demo}[args.command]
    result: int = anyio.run(_until_signal, runner, args, backend=args.backend)
    return result


def main(argv: Sequence[str] | None = None, *, prog: str | None = None) -> int:
    """Run the command line on ``argv`` (default: ``sys.argv[1:]``) and return its exit status;
    ``prog`` is the program's name in its usage (default: the name it was started by, e.g.
    ``nsq-sansio``)."""
    parser, commands = _parser(prog)
    args = _parse(parser, argv, commands)
    return _main(commands[args.command], args)


def serve_main(argv: Sequence[str] | None = None, *, prog: str | None = None) -> int:
    """``serve`` alone, as a program of its own (``python -m nsq_emulator``): the same options,
    checks, output and exit statuses."""
    parser = _new_parser(
        prog=prog, description="run the NSQ emulator (one nsqd and an nsqlookupd) on loopback"
    )
    _serve_arguments(parser)
    args = _parse(parser, argv)
    args.command = "serve"
    return _main(parser, args)


def _main(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Check what argparse cannot, run the command, and sort its end into an exit status."""
    _check_usage(parser, args)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    try:
        return _run(args)
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
