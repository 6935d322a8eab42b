"""Command line: ``serve`` (the emulator on loopback), ``pub`` and ``tail``."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import ssl
import sys
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


async def _pub(args: argparse.Namespace) -> int:
    options = _options(args)
    options["publish_timeout"] = args.timeout
    async with Producer(**options) as producer:
        if args.count is not None:
            body = b"x" * args.size
            batch = [body] * min(100, args.count)
            sent = 0
            while sent < args.count:
                n = min(len(batch), args.count - sent)
                await producer.publish_many(args.topic, batch[:n])
                sent += n
            print(f"published {sent} messages to {args.topic}", file=sys.stderr)
            return 0
        sent = 0
        stdin = anyio.wrap_file(sys.stdin.buffer)
        async for line in stdin:
            line = line.rstrip(b"\r\n")
            if line:
                await producer.publish(args.topic, line)
                sent += 1
        print(f"published {sent} messages to {args.topic}", file=sys.stderr)
    return 0


async def _tail(args: argparse.Namespace) -> int:
    options = _options(args)
    options["max_in_flight"] = args.max_in_flight
    seen = 0
    async with Consumer(args.topic, args.channel, **options) as consumer:
        async for message in consumer:
            sys.stdout.buffer.write(message.body + b"\n")
            sys.stdout.buffer.flush()
            await message.finish()
            seen += 1
            if args.n is not None and seen >= args.n:
                break
    return 0


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
    pub.add_argument("topic")
    pub.add_argument(
        "--count", type=int, help="publish this many generated bodies instead of stdin"
    )
    pub.add_argument("--size", type=int, default=200, help="size of generated bodies")
    pub.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for nsqd")
    _common(pub)

    tail = sub.add_parser("tail", help="print the bodies of a topic/channel")
    tail.add_argument("topic")
    tail.add_argument("--channel", default=f"tail{os.getpid()}#ephemeral")
    tail.add_argument("-n", type=int, help="stop after N messages")
    tail.add_argument("--max-in-flight", type=int, default=200)
    _common(tail)

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
        runner = {"pub": _pub, "tail": _tail, "demo": _demo}[args.command]
        return anyio.run(_with_signals, runner, args, backend=args.backend)
    except nsq_proto.NSQError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
