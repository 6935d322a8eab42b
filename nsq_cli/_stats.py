"""``stats``: nsq_stat-like depth, in-flight, requeue and timeout counts from nsqd's
``/stats``, once or every ``--interval`` seconds."""

from __future__ import annotations

import argparse
import signal
import sys
import time
import urllib.parse
from typing import Any

from ._http import get, json_object
from ._output import Failure
from ._values import address as address_value
from ._values import count, seconds, topic_name

__all__ = ["EPILOG", "HELP", "NAME", "add_arguments", "check_usage", "run"]

NAME = "stats"
HELP = "depth, in-flight, requeue and timeout counts"
EPILOG: str | None = None

#: how long ``stats`` waits for an HTTP answer
_HTTP_TIMEOUT = 10.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--nsqd-http-address",
        action="append",
        required=True,
        type=address_value,
        metavar="HOST:PORT",
        help="nsqd HTTP address (port 4151 by default; repeatable)",
    )
    parser.add_argument("--topic", type=topic_name, help="only this topic")
    parser.add_argument(
        "--interval",
        type=seconds,
        metavar="SECONDS",
        help="show again every this many seconds (without it: once)",
    )
    parser.add_argument("--count", type=count, help="with --interval: stop after this many")


def check_usage(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Nothing beyond what argparse checks."""


def _rows(stats: dict[str, Any]) -> list[tuple[str, ...]]:
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


def _fetch(address: str, query: str) -> dict[str, Any]:
    """nsqd's ``/stats`` at ``address``; a :class:`Failure` naming what went wrong."""
    status, body = get(address, f"/stats?{query}", service="nsqd", timeout=_HTTP_TIMEOUT)
    if status == 404:
        raise Failure(
            f"{address} answered /stats with HTTP 404 Not Found: not nsqd's HTTP address "
            "(nsqlookupd's?)"
        )
    return json_object(address, "/stats", body, service="nsqd")


def run(args: argparse.Namespace) -> int:
    """The counts of each nsqd, once or every ``--interval`` seconds (``--count`` times)."""
    # stopped by Ctrl-C even when started with SIGINT ignored, as the other commands are
    signal.signal(signal.SIGINT, signal.default_int_handler)
    query = urllib.parse.urlencode(
        {"format": "json", **({"topic": args.topic} if args.topic else {})}
    )
    shown = 0
    while True:
        answers = [(address, _fetch(address, query)) for address in args.nsqd_http_address]
        if args.topic:
            for _, stats in answers:  # an nsqd that does not filter by topic is filtered here
                stats["topics"] = [
                    t for t in stats.get("topics") or [] if t.get("topic_name") == args.topic
                ]
            if not any(stats["topics"] for _, stats in answers):
                where = ", ".join(args.nsqd_http_address)
                raise Failure(f"topic {args.topic} does not exist on {where}")
        for address, stats in answers:
            rows = _rows(stats)
            widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
            print(f"# {address}")
            for row in rows:
                print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))
        shown += 1
        if args.interval is None or (args.count is not None and shown >= args.count):
            return 0
        sys.stdout.flush()
        time.sleep(args.interval)
