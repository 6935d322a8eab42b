"""The anyio Producer: ``await producer.publish(topic, body)`` returns once nsqd said OK."""

from __future__ import annotations

import random
import ssl
from collections.abc import Iterable
from typing import Any

import anyio
import anyio.abc

import nsq_proto
from nsq_proto import ProducerConfig, TraceReceipt

from ._consumer import default_identity, tls_settings
from ._driver import Driver

__all__ = ["Producer"]


class _Waiter:
    __slots__ = ("done", "error", "receipt")

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.receipt: TraceReceipt | None = None
        self.error: nsq_proto.NSQError | None = None


class Producer:
    """Publish to nsqd over a pool of pipelined connections.

    Every option of :class:`nsq_proto.ProducerConfig` is a keyword argument of the same name.
    Give ``nsqd_tcp_addresses`` (failover across them), and ``lookupd_http_addresses`` for
    topics of the partitioned server (partitions and sharding keys are resolved through
    lookupd).  Failures raise :class:`nsq_proto.NSQError` subclasses:
    :class:`~nsq_proto.ServerError` (nsqd refused it), :class:`~nsq_proto.ConnectionClosedError`,
    :class:`~nsq_proto.PublishTimeout`, :class:`~nsq_proto.LocalProtocolError` (bad arguments).
    """

    def __init__(
        self,
        *,
        nsqd_tcp_addresses: Iterable[str] = (),
        lookupd_http_addresses: Iterable[str] = (),
        tls: ssl.SSLContext | bool | None = None,
        tls_hostname: str | None = None,
        rng: random.Random | None = None,
        **options: Any,
    ) -> None:
        use_tls, context = tls_settings(tls)
        for key, value in default_identity().items():
            options.setdefault(key, value)
        options.setdefault("user_agent", f"nsq_anyio/{nsq_proto.__version__}")
        if "auth_secret" in options and isinstance(options["auth_secret"], str):
            options["auth_secret"] = options["auth_secret"].encode()
        self.config = ProducerConfig(tls_v1=use_tls, **options)
        self._core = nsq_proto.Producer(
            self.config,
            nsqd_tcp_addresses=nsqd_tcp_addresses,
            lookupd_http_addresses=lookupd_http_addresses,
            rng=rng,
        )
        self._driver = Driver(
            self._core, self._on_event, ssl_context=context, tls_hostname=tls_hostname
        )
        self._waiters: dict[int, _Waiter] = {}
        self._tg: anyio.abc.TaskGroup | None = None
        self._closed = False

    async def __aenter__(self) -> Producer:
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._tg.start_soon(self._driver.run, self._tg)
        self._core.start(anyio.current_time())
        self._driver.wake()
        return self

    async def __aexit__(self, *exc_info: object) -> bool | None:
        await self.aclose()
        assert self._tg is not None
        self._tg.cancel_scope.cancel()
        return await self._tg.__aexit__(*exc_info)  # type: ignore[arg-type]

    async def aclose(self) -> None:
        """Wait (shielded, up to ``publish_timeout``) for what is in flight, then close."""
        if self._closed:
            return
        self._closed = True
        with anyio.CancelScope(shield=True):
            with anyio.move_on_after(self.config.publish_timeout):
                while self._core.pending:
                    waiter = next(iter(self._waiters.values()), None)
                    if waiter is None:
                        break
                    await waiter.done.wait()
            self._core.close(anyio.current_time())
            with anyio.move_on_after(5.0):
                await self._driver.flush()
            await self._driver.aclose()

    def _on_event(self, event: nsq_proto.Event) -> None:
        if type(event) is nsq_proto.PublishSucceeded:
            waiter = self._waiters.pop(event.request_id, None)
            if waiter is not None:
                waiter.receipt = event.receipt
                waiter.done.set()
        elif type(event) is nsq_proto.PublishFailed:
            waiter = self._waiters.pop(event.request_id, None)
            if waiter is not None:
                waiter.error = event.error
                waiter.done.set()

    async def _wait(self, request_id: int) -> TraceReceipt | None:
        waiter = _Waiter()
        self._waiters[request_id] = waiter
        self._driver.wake()
        try:
            await waiter.done.wait()
        finally:
            self._waiters.pop(request_id, None)
        if waiter.error is not None:
            raise waiter.error
        return waiter.receipt

    def _check_open(self) -> None:
        if self._closed or self._tg is None:
            raise nsq_proto.LocalProtocolError("use the producer inside 'async with'")

    async def publish(
        self,
        topic: str,
        body: bytes,
        *,
        delay: float | None = None,
        partition: int | None = None,
        sharding_key: bytes | str | None = None,
        trace_id: int | None = None,
    ) -> TraceReceipt | None:
        """PUB (DPUB with ``delay`` seconds; PUB_TRACE with ``trace_id``, which returns the
        trace receipt).  Returns once nsqd acknowledged it."""
        self._check_open()
        rid = self._core.publish(
            topic,
            body,
            anyio.current_time(),
            delay=delay,
            partition=partition,
            sharding_key=sharding_key,
            trace_id=trace_id,
        )
        return await self._wait(rid)

    async def publish_many(
        self,
        topic: str,
        bodies: Iterable[bytes],
        *,
        partition: int | None = None,
        sharding_key: bytes | str | None = None,
        trace_ids: Iterable[int] | None = None,
    ) -> TraceReceipt | None:
        """MPUB (MPUB_TRACE with ``trace_ids``): all or nothing, once nsqd acknowledged it."""
        self._check_open()
        rid = self._core.publish_many(
            topic,
            bodies,
            anyio.current_time(),
            partition=partition,
            sharding_key=sharding_key,
            trace_ids=trace_ids,
        )
        return await self._wait(rid)

    def stats(self) -> dict[str, Any]:
        return {
            "pending": self._core.pending,
            "connections": [
                {"conn_id": c, "address": f"{a[0]}:{a[1]}", "state": s, "outstanding": n}
                for c, a, s, n in self._core.connections()
            ],
        }
