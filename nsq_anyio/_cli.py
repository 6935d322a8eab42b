"""Command line: ``serve`` (the emulator on loopback), ``pub``, ``tail`` and ``stats``.

``pub`` and ``tail`` also take the spellings of nsq's own tools (``to_nsq``, ``nsq_tail``):
``--topic=T``, ``--channel=C``, ``-n N``, repeated ``--nsqd-tcp-address`` and
``--lookupd-http-address``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import ssl
import sys
import time
import urllib.request
from collections.abc import Sequence
from typing import Any

import anyio

import nsq_proto

from ._consumer import Consumer
from ._producer import Producer

__all__ = ["main"]


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--nsqd-tcp-address",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="nsqd TCP address",
    )
    parser.add_argument(
        "--lookupd-http-address",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="nsqlookupd HTTP address",
    )
    parser.add_argument("--tls", action="store_true", help="negotiate TLS")
    parser.add_argument("--tls-ca", metavar="FILE", help="CA bundle to verify nsqd with")
    parser.add_argument("--tls-insecure", action="store_true", help="do not verify the certificate")
    parser.add_argument("--snappy", action="store_true", help="snappy compression")
    parser.add_argument("--deflate", action="store_true", help="deflate compression")
    parser.add_argument("--auth-secret", help="AUTH secret")
    parser.add_argument(
        "--backend",
        choices=["asyncio", "trio"],
        default="asyncio",
        help="event loop (default asyncio)",
    )


def _tls(args: argparse.Namespace) -> ssl.SSLContext | None:
    if not (args.tls or args.tls_ca or args.tls_insecure):
        return None
    context = ssl.create_default_context(cafile=args.tls_ca)
    if args.tls_insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


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
    if not args.nsqd_tcp_address and not args.lookupd_http_address:
        raise SystemExit("error: give --nsqd-tcp-address or --lookupd-http-address")
    return options


def _topic(args: argparse.Namespace) -> str:
    """The topic, given as the positional argument or as ``--topic`` (not both)."""
    if args.topic and args.topic_flag and args.topic != args.topic_flag:
        raise SystemExit("error: give the topic once (positional or --topic)")
    topic: str | None = args.topic or args.topic_flag
    if not topic:
        raise SystemExit("error: give a topic (positional or --topic)")
    return topic


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
        if not isinstance(error, nsq_proto.NSQError | SystemExit):
            print(self.summary(), file=sys.stderr)


async def _pub(args: argparse.Namespace) -> int:
    topic = _topic(args)
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
                stdin = anyio.wrap_file(sys.stdin.buffer)
                async for line in stdin:
                    line = line.rstrip(b"\r\n")
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


async def _tail(args: argparse.Namespace) -> int:
    topic = _topic(args)
    options = _options(args)
    options["max_in_flight"] = args.max_in_flight
    progress = _Progress("received", topic)
    as_json = args.format == "json"
    out = sys.stdout.buffer
    try:
        async with Consumer(topic, args.channel, **options) as consumer:
            async for message in consumer:
                out.write(_json_line(message) if as_json else message.body + b"\n")
                out.flush()
                await message.finish()
                progress.add()
                if args.n is not None and progress.count >= args.n:
                    break
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


def _stats(args: argparse.Namespace) -> int:
    """nsq_stat-like: depth, in flight, requeue and timeout counts from nsqd's /stats."""
    query = "format=json" + (f"&topic={args.topic}" if args.topic else "")
    shown = 0
    while True:
        for address in args.nsqd_http_address:
            url = f"http://{address}/stats?{query}"
            with urllib.request.urlopen(url, timeout=10) as response:
                data = json.load(response)
            stats = data.get("data", data)  # nsqd answers bare; older ones in an envelope
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


async def _demo(args: argparse.Namespace) -> int:
    """Serve the emulator, publish ``--count`` messages, tail them back, check every one."""
    import time

    from ._server import serve_emulator

    async with serve_emulator(nsqd_count=2) as cluster:
        print(f"emulated nsqd at {', '.join(cluster.nsqd_tcp_addresses)}", file=sys.stderr)
        print(f"emulated lookupd at {cluster.lookupd_http_addresses[0]}", file=sys.stderr)
        bodies = [b"message %d" % i for i in range(args.count)]
        start = time.perf_counter()
        async with Producer(nsqd_tcp_addresses=cluster.nsqd_tcp_addresses) as producer:
            for i in range(0, len(bodies), 100):
                await producer.publish_many(args.topic, bodies[i : i + 100])
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
                    if len(seen) == len(bodies):
                        break
        consumed = time.perf_counter() - start
    missing = len(set(bodies) - seen)
    print(f"published {len(bodies)} messages in {published:.2f} s")
    print(f"consumed {len(seen)} distinct messages in {consumed:.2f} s (via lookupd, 2 nsqd)")
    print("round trip OK" if not missing else f"round trip FAILED: {missing} missing")
    return 0 if not missing else 1


async def _with_signals(coro: Any, args: argparse.Namespace) -> int:
    result = 1
    failure: BaseException | None = None

    async def body(scope: anyio.CancelScope) -> None:
        nonlocal result, failure
        try:
            result = await coro(args)
        except nsq_proto.NSQError as exc:
            failure = exc
        scope.cancel()

    async with anyio.create_task_group() as tg:
        tg.start_soon(body, tg.cancel_scope)
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for _ in signals:
                print("stopping", file=sys.stderr)
                result = 130
                tg.cancel_scope.cancel()
                break
    if failure is not None:
        raise failure
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nsq_anyio", description="NSQ on anyio")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the NSQ emulator on loopback")
    serve.add_argument("--host", default="127.0.0.1", help="loopback address to bind")
    serve.add_argument("--tcp-port", type=int, default=4150)
    serve.add_argument("--http-port", type=int, default=4151)
    serve.add_argument("--lookupd-http-port", type=int, default=4161)
    serve.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")

    pub = sub.add_parser("pub", help="publish stdin lines (or generated bodies) to a topic")
    pub.add_argument("topic", nargs="?")
    pub.add_argument("--topic", dest="topic_flag", metavar="TOPIC", help="the topic (to_nsq)")
    pub.add_argument(
        "--count", type=int, help="publish this many generated bodies instead of stdin"
    )
    pub.add_argument("--size", type=int, default=200, help="size of generated bodies")
    pub.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for nsqd")
    _common(pub)

    tail = sub.add_parser("tail", help="print the bodies of a topic/channel")
    tail.add_argument("topic", nargs="?")
    tail.add_argument("--topic", dest="topic_flag", metavar="TOPIC", help="the topic (nsq_tail)")
    tail.add_argument("--channel", default=f"tail{os.getpid()}#ephemeral")
    tail.add_argument("-n", "--n", type=int, help="stop after N messages")
    tail.add_argument("--max-in-flight", type=int, default=200)
    tail.add_argument(
        "--format",
        choices=["raw", "json"],
        default="raw",
        help="raw bodies (default) or JSON lines with id, attempts, timestamp, nsqd and body",
    )
    _common(tail)

    stats = sub.add_parser("stats", help="depth, in-flight, requeue and timeout counts")
    stats.add_argument("--nsqd-http-address", action="append", required=True, metavar="HOST:PORT")
    stats.add_argument("--topic", help="only this topic")
    stats.add_argument("--interval", type=float, help="show again every this many seconds")
    stats.add_argument("--count", type=int, help="with --interval: stop after this many")

    demo = sub.add_parser("demo", help="publish/tail round trip against the embedded emulator")
    demo.add_argument("--count", type=int, default=10000)
    demo.add_argument("--topic", default="demo")
    demo.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")

    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    try:
        if args.command == "serve":
            from ._server import serve_forever

            return anyio.run(serve_forever, args, backend=args.backend)
        if args.command == "stats":
            return _stats(args)
        runner = {"pub": _pub, "tail": _tail, "demo": _demo}[args.command]
        return anyio.run(_with_signals, runner, args, backend=args.backend)
    except nsq_proto.NSQError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
