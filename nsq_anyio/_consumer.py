"""The anyio Consumer: ``async with Consumer(...) as c: async for message in c: ...``."""

from __future__ import annotations

import logging
import math
import random
import socket
import ssl
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

import nsq_proto
from nsq_proto import ConsumerConfig

from ._driver import Driver
from ._message import Message

__all__ = ["Consumer", "Handler", "GiveUpHook"]

log = logging.getLogger("nsq_anyio")

Handler = Callable[[Message], Awaitable[object]]
GiveUpHook = Callable[[Message], object]


def default_identity() -> dict[str, str]:
    hostname = socket.gethostname()
    return {"client_id": hostname.split(".")[0], "hostname": hostname}


def tls_settings(tls: ssl.SSLContext | bool | None) -> tuple[bool, ssl.SSLContext | None]:
    if tls is None or tls is False:
        return False, None
    if tls is True:
        return True, ssl.create_default_context()
    if isinstance(tls, ssl.SSLContext):
        return True, tls
    raise nsq_proto.ConfigError("tls must be an ssl.SSLContext, True or None")


class Consumer:
    """Consume ``topic``/``channel`` from nsqd (a fixed list) or from what lookupd lists.

    Every option of :class:`nsq_proto.ConsumerConfig` is a keyword argument of the same name.
    ``tls`` takes an :class:`ssl.SSLContext` (or True for the default, verifying context);
    ``auth_secret`` enables AUTH; ``snappy``/``deflate`` compression.  Leaving the ``async
    with`` block stops gracefully: CLS, then wait (up to ``stop_timeout``) for the messages the
    application holds to be answered; what is left is requeued.
    """

    def __init__(
        self,
        topic: str,
        channel: str,
        *,
        nsqd_tcp_addresses: Iterable[str] = (),
        lookupd_http_addresses: Iterable[str] = (),
        tls: ssl.SSLContext | bool | None = None,
        tls_hostname: str | None = None,
        on_give_up: GiveUpHook | None = None,
        rng: random.Random | None = None,
        **options: Any,
    ) -> None:
        use_tls, context = tls_settings(tls)
        for key, value in default_identity().items():
            options.setdefault(key, value)
        options.setdefault("user_agent", f"nsq_anyio/{nsq_proto.__version__}")
        if "auth_secret" in options and isinstance(options["auth_secret"], str):
            options["auth_secret"] = options["auth_secret"].encode()
        self.config = ConsumerConfig(tls_v1=use_tls, **options)
        self._core = nsq_proto.Consumer(
            topic,
            channel,
            self.config,
            nsqd_tcp_addresses=nsqd_tcp_addresses,
            lookupd_http_addresses=lookupd_http_addresses,
            rng=rng,
        )
        self.topic = topic
        self.channel = channel
        self._driver = Driver(
            self._core, self._on_event, ssl_context=context, tls_hostname=tls_hostname
        )
        self._on_give_up = on_give_up
        send, receive = anyio.create_memory_object_stream[Message](math.inf)
        self._send: MemoryObjectSendStream[Message] = send
        self._receive: MemoryObjectReceiveStream[Message] = receive
        self._stopped = anyio.Event()
        self._tg: anyio.abc.TaskGroup | None = None
        self._conn_info: dict[int, tuple[str, int | None]] = {}
        self._taken = 0
        self.errors: list[nsq_proto.ErrorReceived] = []
        self.lookup_failures: list[nsq_proto.LookupFailed] = []

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> Consumer:
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._tg.start_soon(self._driver.run, self._tg)
        self._core.start(anyio.current_time())
        self._driver.wake()
        return self

    async def __aexit__(self, *exc_info: object) -> bool | None:
        cancelled = isinstance(exc_info[1], anyio.get_cancelled_exc_class())
        await self._stop(requeue_unanswered=cancelled)
        self._send.close()
        self._receive.close()
        with anyio.CancelScope(shield=True):
            await self._driver.aclose()
        assert self._tg is not None
        self._tg.cancel_scope.cancel()
        return await self._tg.__aexit__(*exc_info)  # type: ignore[arg-type]

    async def _stop(self, *, requeue_unanswered: bool = False) -> None:
        with anyio.CancelScope(shield=True):
            now = anyio.current_time()
            self._core.stop(now, requeue_unanswered=requeue_unanswered)
            # messages delivered but never handed to the application go back at once
            while True:
                try:
                    message = self._receive.receive_nowait()
                except (anyio.WouldBlock, anyio.EndOfStream):
                    break
                message._responded = True
                self._core.requeue(message.conn_id, message.id, now, delay=0.0, backoff=False)
            if requeue_unanswered:
                # the pump task is being cancelled with us: carry out the requeues and closes
                with anyio.move_on_after(5.0):
                    await self._driver.flush()
                return
            self._driver.wake()
            with anyio.move_on_after(self.config.stop_timeout + 5.0):
                await self._stopped.wait()

    async def stop(self) -> None:
        """Stop gracefully now (leaving the ``async with`` block does the same)."""
        await self._stop()

    # ------------------------------------------------------------------ events

    def _on_event(self, event: nsq_proto.Event) -> None:
        if type(event) is nsq_proto.MessageReceived:
            self._send.send_nowait(self._wrap(event.conn_id, event.message))
        elif isinstance(event, nsq_proto.MessageGivenUp):
            message = self._wrap(event.conn_id, event.message)
            if event.finished:
                message._responded = True
            log.warning("giving up on message %r after %d attempts", message.id, message.attempts)
            if self._on_give_up is not None:
                self._on_give_up(message)
        elif isinstance(event, nsq_proto.ErrorReceived):
            self.errors.append(event)
            log.warning("nsqd error on connection %d: %s %s", event.conn_id, event.code, event.text)
        elif isinstance(event, nsq_proto.LookupFailed):
            self.lookup_failures.append(event)
            log.warning("lookupd %s:%d failed: %s", *event.address, event.error)
        elif isinstance(event, nsq_proto.ConnectionClosed):
            self._conn_info.pop(event.conn_id, None)
            if event.error is not None:
                log.warning("connection %d closed: %s", event.conn_id, event.error)
        elif isinstance(event, nsq_proto.Stopped):
            self._stopped.set()
            self._send.close()

    def _wrap(self, conn_id: int, message: nsq_proto.Message) -> Message:
        info = self._conn_info.get(conn_id)
        if info is None:
            stats = self._core.connection_stats(conn_id)
            if stats is None:
                info = ("", None)
            else:
                info = (f"{stats.address[0]}:{stats.address[1]}", stats.partition)
            self._conn_info[conn_id] = info
        return Message(self, conn_id, message, info[0], info[1])

    # ------------------------------------------------------------------ answers (called by Message)

    def _finish(self, message: Message) -> None:
        self._core.finish(message.conn_id, message.id, anyio.current_time())
        self._driver.wake()

    def _requeue(self, message: Message, delay: float | None, backoff: bool) -> None:
        self._core.requeue(
            message.conn_id, message.id, anyio.current_time(), delay=delay, backoff=backoff
        )
        self._driver.wake()

    def _touch(self, message: Message) -> None:
        self._core.touch(message.conn_id, message.id, anyio.current_time())
        self._driver.wake()

    # ------------------------------------------------------------------ consuming

    def __aiter__(self) -> Consumer:
        return self

    async def __anext__(self) -> Message:
        self._taken += 1
        if self._taken & 255:
            # fast path: a message is waiting; no checkpoint, so answers given meanwhile go
            # out together in one write when this task next waits
            try:
                return self._receive.receive_nowait()
            except anyio.WouldBlock:
                pass
            except anyio.EndOfStream:
                raise StopAsyncIteration from None
        try:
            return await self._receive.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def run(self, handler: Handler, concurrency: int | None = None) -> None:
        """Handler style: returning FINishes, raising REQueues with backoff; at most
        ``concurrency`` handlers run at once (default: max_in_flight).  Returns when the
        consumer stops."""
        n = concurrency if concurrency is not None else max(1, self.config.max_in_flight)
        if n < 1:
            raise nsq_proto.ConfigError("concurrency must be at least 1")
        async with anyio.create_task_group() as tg:
            for _ in range(n):
                tg.start_soon(self._worker, handler)

    async def _worker(self, handler: Handler) -> None:
        async for message in self:
            try:
                await handler(message)
            except Exception:
                log.exception("handler failed for message %r", message.id)
                if not message.has_responded:
                    await message.requeue()
            else:
                if not message.has_responded:
                    await message.finish()

    # ------------------------------------------------------------------ introspection

    def is_starved(self) -> bool:
        return self._core.is_starved()

    def set_max_in_flight(self, max_in_flight: int) -> None:
        self._core.set_max_in_flight(max_in_flight, anyio.current_time())
        self._driver.wake()

    def stats(self) -> dict[str, Any]:
        core = self._core
        return {
            "topic": self.topic,
            "channel": self.channel,
            "max_in_flight": core.max_in_flight,
            "total_rdy": core.total_rdy,
            "backoff_level": core.backoff_level,
            "messages_received": core.messages_received,
            "messages_finished": core.messages_finished,
            "messages_requeued": core.messages_requeued,
            "messages_given_up": core.messages_given_up,
            "connections": [
                {
                    "conn_id": s.conn_id,
                    "address": s.key,
                    "state": s.state,
                    "rdy": s.rdy,
                    "in_flight": s.in_flight,
                    "partition": s.partition,
                }
                for s in core.connections()
            ],
        }
