"""The full client on a backend of your own: every connection metered, byte by byte.

    python examples/metered_backend.py 127.0.0.1:4150 clicks 1000

A :class:`nsq_client.Backend` is all the client needs from the outside world: streams, TLS and
the event loop's primitives.  This one wraps another backend (anyio's here) and counts what
each connection sends and receives, the way you would put a proxy, a tunnel, a Unix socket or
a traffic log under the client without touching it.  The program publishes ``count`` messages,
consumes them back with ``nsq_client.Consumer`` and ``nsq_client.Producer`` on that backend,
then prints one line per connection it opened: ``producer|consumer host:port sent received``.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio

import nsq_anyio
import nsq_client
from nsq_client import Backend, EventLike, ScopeLike, Stream, TaskGroupContext


@dataclass
class Meter:
    """The bytes one connection moved."""

    role: str
    address: str
    sent: int = 0
    received: int = 0


class MeteredStream:
    def __init__(self, inner: Stream, meter: Meter) -> None:
        self.inner = inner
        self.meter = meter

    async def send(self, data: bytes) -> None:
        await self.inner.send(data)
        self.meter.sent += len(data)

    async def receive(self) -> bytes:
        data = await self.inner.receive()
        self.meter.received += len(data)
        return data

    async def aclose(self) -> None:
        await self.inner.aclose()


class MeteredBackend:
    """``inner``'s primitives as they are; its streams metered."""

    def __init__(self, inner: Backend, role: str) -> None:
        self.inner = inner
        self.role = role
        self.meters: list[Meter] = []
        self.io_errors = inner.io_errors
        self.tls_errors = inner.tls_errors
        self.transient_tls_errors = inner.transient_tls_errors

    async def connect_tcp(self, host: str, port: int) -> Stream:
        stream = await self.inner.connect_tcp(host, port)
        meter = Meter(self.role, f"{host}:{port}")
        self.meters.append(meter)
        return MeteredStream(stream, meter)

    async def start_tls(self, stream: Stream, ssl_context: Any, hostname: str | None) -> Stream:
        # TLS goes over the inner stream; the meter keeps counting the plaintext
        assert isinstance(stream, MeteredStream)
        upgraded = await self.inner.start_tls(stream.inner, ssl_context, hostname)
        return MeteredStream(upgraded, stream.meter)

    # the rest is the inner backend's
    def current_time(self) -> float:
        return self.inner.current_time()

    def clock(self) -> Callable[[], float]:
        return self.inner.clock()

    def event(self) -> EventLike:
        return self.inner.event()

    def cancel_scope(self, *, deadline: float = math.inf, shield: bool = False) -> ScopeLike:
        return self.inner.cancel_scope(deadline=deadline, shield=shield)

    def task_group(self) -> TaskGroupContext:
        return self.inner.task_group()

    def cancelled_exc_class(self) -> type[BaseException]:
        return self.inner.cancelled_exc_class()

    async def checkpoint(self) -> None:
        await self.inner.checkpoint()

    def default_ssl_context(self) -> Any:
        return self.inner.default_ssl_context()

    def ssl_check_hostname(self, ssl_context: Any) -> bool:
        return self.inner.ssl_check_hostname(ssl_context)

    def is_ssl_context(self, value: object) -> bool:
        return self.inner.is_ssl_context(value)

    def hostname(self) -> str:
        return self.inner.hostname()


async def main(address: str, topic: str, count: int, timeout: float) -> int:
    anyio_backend = nsq_anyio.Consumer.default_backend
    assert anyio_backend is not None
    producer_backend = MeteredBackend(anyio_backend, "producer")
    consumer_backend = MeteredBackend(anyio_backend, "consumer")

    async with nsq_client.Producer(
        backend=producer_backend, nsqd_tcp_addresses=[address]
    ) as producer:
        await producer.publish_many(topic, [b"message %d" % i for i in range(count)])

    received = 0
    with anyio.move_on_after(timeout):
        async with nsq_client.Consumer(
            topic, "metered", backend=consumer_backend, nsqd_tcp_addresses=[address]
        ) as consumer:
            async for message in consumer:
                await message.finish()
                received += 1
                if received == count:
                    break
    for meter in producer_backend.meters + consumer_backend.meters:
        print(meter.role, meter.address, meter.sent, meter.received)
    if received != count:
        print(f"received {received} of {count} messages", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("address", help="nsqd's TCP address, host:port")
    parser.add_argument("topic")
    parser.add_argument("count", type=int)
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds to receive them")
    args = parser.parse_args()
    sys.exit(anyio.run(main, args.address, args.topic, args.count, args.timeout))
