"""``tail``: print the bodies (or JSON lines) of a topic's channel, a new ephemeral one by
default, ``-n`` of them or until stopped.

An address given that does not answer at the start ends tail with one error line; once
subscribed, tail waits for an nsqd that goes away and reconnects, as nsq_tail does.  It says
what a new channel receives (a note) and warns when its ephemeral channel took the messages
the topic held (nsqd deletes them with the channel)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable
from typing import Any, TypeVar

import anyio

import nsq_proto
from nsq_anyio import Consumer

from ._args import add_client_arguments, add_topic_arguments, check_topic_usage, client_options
from ._http import get, not_json
from ._output import Failure, Progress
from ._values import channel_name, count

__all__ = ["EPILOG", "HELP", "NAME", "add_arguments", "check_usage", "run"]

NAME = "tail"
HELP = "print the bodies of a topic/channel"

_T = TypeVar("_T")

#: how long ``tail`` waits for each nsqlookupd's first answer
_LOOKUP_TIMEOUT = 2.0

#: the end of ``tail --help``: what tail does when an address does not answer, and what a new
#: channel receives (as docs/cli.md says)
EPILOG = """\
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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_topic_arguments(parser, "nsq_tail")
    parser.add_argument(
        "--channel", type=channel_name, help="the channel (without it: a new ephemeral one)"
    )
    parser.add_argument("-n", type=count, metavar="N", help="stop after N messages")
    # nsq_tail's other spelling (Go's flags take -n and --n), not shown twice in the help
    parser.add_argument("--n", type=count, dest="n", help=argparse.SUPPRESS)
    parser.add_argument(
        "--max-in-flight",
        type=count,
        default=200,
        metavar="N",
        help="messages nsqd may send before tail answers them (default: %(default)s)",
    )
    parser.add_argument(
        "--format",
        choices=["raw", "json"],
        default="raw",
        help="raw bodies, or JSON lines with id, attempts, timestamp, nsqd and body "
        "(default: %(default)s)",
    )
    add_client_arguments(parser)


check_usage = check_topic_usage


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
    :class:`Failure` naming an nsqlookupd that does not answer (nothing listens there, it
    refuses, it is not nsqlookupd)."""
    channels: set[str] = set()
    query = urllib.parse.urlencode({"topic": topic})
    for address in lookupds:
        status, body = get(
            address, f"/lookup?{query}", service="nsqlookupd", timeout=_LOOKUP_TIMEOUT
        )
        if status == 404:  # TOPIC_NOT_FOUND
            continue
        try:
            answer = nsq_proto.parse_lookup_response(status, body)
        except nsq_proto.LookupdError:
            raise not_json(address, "/lookup", "nsqlookupd") from None
        channels.update(answer.channels)
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
      connection to it ends tail (a :class:`Failure`: an address that does not answer at the
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
            raise Failure(text)

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


async def run(args: argparse.Namespace) -> int:
    topic = args.topic
    channel = args.channel or f"tail{os.getpid()}#ephemeral"
    options = client_options(args)
    options["max_in_flight"] = args.max_in_flight
    note = await _in_daemon_thread(_new_channel_note, args, topic, channel)
    progress = Progress("received", topic)
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
