"""The producer: a sans-IO producer core driven on a backend, with the application's API."""

from __future__ import annotations

import random
import ssl
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Unpack

from nsq_proto import (
    Event,
    LocalProtocolError,
    NSQError,
    ProducerConfig,
    PublishesSucceeded,
    PublishFailed,
    PublishSucceeded,
    TraceReceipt,
)
from nsq_proto import Producer as ProducerCore

from ._backend import Backend, EventLike
from ._client import ClientBase
from ._options import ProducerOptions, build_config
from ._stats import ProducerStats
from ._telemetry import hooks as _telemetry

__all__ = ["Producer"]


class _Waiter:
    __slots__ = ("done", "error", "receipt")

    def __init__(self, done: EventLike) -> None:
        self.done = done
        self.receipt: TraceReceipt | None = None
        self.error: NSQError | None = None


class _Release:
    __slots__ = ("set",)

    def __init__(self, release: Callable[[], object]) -> None:
        self.set = release


class ThreadWaiter:
    """A publish's answer for a thread that waits for it itself (:meth:`Producer.publish_soon`):
    ``release`` is called from the event loop once the answer (or ``failure``) is in."""

    __slots__ = ("done", "error", "failure", "receipt")

    def __init__(self, release: Callable[[], object]) -> None:
        self.done = _Release(release)
        self.receipt: TraceReceipt | None = None
        self.error: NSQError | None = None
        #: what the call raised before it was queued (a bad topic or body, a closed producer)
        self.failure: BaseException | None = None


class Producer(ClientBase):
    """Publish to nsqd over a pool of pipelined connections.

    Every option of :class:`nsq_proto.ProducerConfig` is a keyword argument of the same name.
    Give ``nsqd_tcp_addresses`` (failover across them), and ``lookupd_http_addresses`` for
    topics of the partitioned server.  Failures raise :class:`nsq_proto.NSQError`
    subclasses: ``ServerError`` (nsqd refused it), ``ConnectionClosedError``,
    ``PublishTimeout``, ``LocalProtocolError`` (bad arguments).
    """

    def __init__(
        self,
        *,
        backend: Backend | None = None,
        nsqd_tcp_addresses: Iterable[str] = (),
        lookupd_http_addresses: Iterable[str] = (),
        tls: bool | ssl.SSLContext | None = None,
        tls_hostname: str | None = None,
        rng: random.Random | None = None,
        config: ProducerConfig | None = None,
        **options: Unpack[ProducerOptions],
    ) -> None:
        super().__init__(backend, tls, tls_hostname)
        backend = self._backend
        self.config = build_config(ProducerConfig, backend, config, options, tls=self._use_tls)
        self._core = ProducerCore(
            self.config,
            nsqd_tcp_addresses=nsqd_tcp_addresses,
            lookupd_http_addresses=lookupd_http_addresses,
            rng=rng,
            answer_batches=True,
        )
        # a write that waits on the peer holds up the publishes behind it: no longer than a
        # publish may wait
        self._drive(
            self._core,
            self._on_event,
            min(self.config.write_timeout, self.config.publish_timeout),
        )
        self._waiters: dict[int, _Waiter | ThreadWaiter] = {}
        #: set once no publish waits (what :meth:`aclose` waits for; a publish's own event
        #: has its publisher as its one waiter)
        self._idle: EventLike | None = None
        self._closed = False

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        await self.aclose()
        return await self._exit(exc_info)

    async def aclose(self) -> None:
        """Wait (shielded, up to ``publish_timeout``) for what is in flight, then close."""
        if self._closed:
            return
        self._closed = True
        backend = self._backend
        with backend.cancel_scope(shield=True):
            now = backend.current_time()
            with backend.cancel_scope(deadline=now + self.config.publish_timeout):
                while self._waiters:
                    self._idle = idle = backend.event()
                    await idle.wait()
            self._core.close(backend.current_time())
            with backend.cancel_scope(deadline=backend.current_time() + 5.0):
                await self._runner.flush()
            await self._runner.aclose()

    def _on_event(self, event: Event) -> None:
        if type(event) is PublishesSucceeded:  # a coalesced MPUB: each of its callers
            waiters = self._waiters
            for request_id in event.request_ids:
                waiter = waiters.pop(request_id, None)
                if waiter is not None:
                    waiter.done.set()
        elif type(event) is PublishSucceeded:
            waiter = self._waiters.pop(event.request_id, None)
            if waiter is not None:
                waiter.receipt = event.receipt
                waiter.done.set()
        elif type(event) is PublishFailed:
            waiter = self._waiters.pop(event.request_id, None)
            if waiter is not None:
                waiter.error = event.error
                waiter.done.set()
        else:
            return
        if self._idle is not None and not self._waiters:
            self._idle.set()

    async def _wait(self, request_id: int) -> TraceReceipt | None:
        waiter = _Waiter(self._runner.new_event())
        self._waiters[request_id] = waiter
        try:
            if not self._core.held_back:
                # written from this task: no hop to the pump task on the way out (and no
                # wait for another task's write: the answer's wait is bounded by the deadline)
                await self._runner.drain_here(wait=False)
            await waiter.done.wait()
        finally:
            waiters = self._waiters
            idle = self._idle
            if waiters.pop(request_id, None) is not None and idle is not None and not waiters:
                idle.set()  # cancelled: one fewer for aclose to wait for
        if waiter.error is not None:
            raise waiter.error
        return waiter.receipt

    def publish_soon(self, topic: str, body: bytes, waiter: ThreadWaiter) -> None:
        """A plain PUB of ``body`` from a callback of the event loop, not a task: its answer
        goes to ``waiter``.  For a thread that waits for the answer itself (the blocking
        API), without a task per publish; the publish is the same as :meth:`publish`'s."""
        try:
            self._check_open()
            rid = self._core.publish(topic, body, self._clock())
        except Exception as exc:
            waiter.failure = exc
            waiter.done.set()
            return
        self._waiters[rid] = waiter
        if not self._core.held_back:
            self._runner.drain_soon()

    def _check_open(self) -> None:
        if self._closed or self._tg is None:
            raise LocalProtocolError("use the producer inside 'async with'")

    async def publish(
        self,
        topic: str,
        body: bytes,
        *,
        delay: float | None = None,
        partition: int | None = None,
        sharding_key: bytes | str | None = None,
        trace_id: int | None = None,
        ext: Mapping[str, Any] | None = None,
    ) -> TraceReceipt | None:
        """PUB (DPUB with ``delay`` seconds; PUB_TRACE with ``trace_id``, which returns the
        trace receipt).  Returns once nsqd acknowledged it."""
        self._check_open()
        if _telemetry.active is not None:  # nsq_client.otel: a PRODUCER span around it

            def send(ext: Mapping[str, Any] | None) -> int:
                return self._core.publish(
                    topic,
                    body,
                    self._clock(),
                    delay=delay,
                    partition=partition,
                    sharding_key=sharding_key,
                    trace_id=trace_id,
                    ext=ext,
                )

            return await _telemetry.active.publish(self, topic, (body,), False, ext, send)
        rid = self._core.publish(
            topic,
            body,
            self._clock(),
            delay=delay,
            partition=partition,
            sharding_key=sharding_key,
            trace_id=trace_id,
            ext=ext,
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
        ext: Mapping[str, Any] | None = None,
    ) -> TraceReceipt | None:
        """MPUB (MPUB_TRACE with ``trace_ids``): all or nothing, once nsqd acknowledged it."""
        self._check_open()
        if _telemetry.active is not None:  # nsq_client.otel: a PRODUCER span around it
            batch = list(bodies)
            traces = None if trace_ids is None else list(trace_ids)

            def send_many(ext: Mapping[str, Any] | None) -> int:
                return self._core.publish_many(
                    topic,
                    batch,
                    self._clock(),
                    partition=partition,
                    sharding_key=sharding_key,
                    trace_ids=traces,
                    ext=ext,
                )

            return await _telemetry.active.publish(self, topic, batch, True, ext, send_many)
        rid = self._core.publish_many(
            topic,
            bodies,
            self._clock(),
            partition=partition,
            sharding_key=sharding_key,
            trace_ids=trace_ids,
            ext=ext,
        )
        return await self._wait(rid)

    def stats(self) -> ProducerStats:
        """Publishes waiting and each connection's state, as a JSON-ready dict."""
        return {
            "pending": self._core.pending,
            "connections": [
                {
                    "conn_id": c.conn_id,
                    "address": f"{c.address[0]}:{c.address[1]}",
                    "state": c.state,
                    "outstanding": c.outstanding,
                }
                for c in self._core.connections()
            ],
        }
