"""``pub``: publish the lines of stdin (or ``--count`` generated bodies) to a topic."""

from __future__ import annotations

import argparse
import os
import stat
import sys
from collections.abc import AsyncIterator

import anyio
import anyio.lowlevel

from nsq_anyio import Producer

from ._args import add_client_arguments, add_topic_arguments, check_topic_usage, client_options
from ._output import Progress
from ._values import count, seconds

__all__ = ["EPILOG", "HELP", "NAME", "add_arguments", "check_usage", "run"]

NAME = "pub"
HELP = "publish stdin lines (or generated bodies) to a topic"
EPILOG: str | None = None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_topic_arguments(parser, "to_nsq")
    parser.add_argument(
        "--count", type=count, help="publish this many generated bodies instead of stdin"
    )
    parser.add_argument(
        "--size",
        type=count,
        default=200,
        metavar="BYTES",
        help="size of each generated body (default: %(default)s)",
    )
    parser.add_argument(
        "--timeout",
        type=seconds,
        default=10.0,
        metavar="SECONDS",
        help="how long a publish waits for nsqd (default: %(default)g)",
    )
    add_client_arguments(parser)


check_usage = check_topic_usage


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


async def run(args: argparse.Namespace) -> int:
    topic = args.topic
    options = client_options(args)
    options["publish_timeout"] = args.timeout
    progress = Progress("published", topic)
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
