"""A blocking API for synchronous code: the same Producer and Consumer, driven by an event
loop in a background thread.

.. code-block:: python

    from nsq_anyio.blocking import Consumer, Producer

    with Producer(nsqd_tcp_addresses=["127.0.0.1:4150"]) as producer:
        producer.publish("clicks", b"body")  # returns once nsqd said OK

    with Consumer("clicks", "archive", nsqd_tcp_addresses=["127.0.0.1:4150"]) as consumer:
        for message in consumer:
            message.finish()

Options and errors are those of :class:`nsq_anyio.Producer` / :class:`nsq_anyio.Consumer`.
Each object runs its own event-loop thread, started when its ``with`` block is entered and
joined when it is left, so an object made before a pre-fork server forks is safe to use in
the children.  A producer is thread-safe: any number of threads may publish through it at
once, over its pipelined connections.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import ExitStack
from functools import partial
from types import TracebackType
from typing import Any, Generic, Self, TypeVar, Unpack

from anyio.from_thread import BlockingPortal, start_blocking_portal

import nsq_client
from nsq_client import Message as AsyncMessage
from nsq_client._message import is_async_callable
from nsq_client._options import chose_max_in_flight
from nsq_client._producer import ThreadWaiter
from nsq_client._telemetry import hooks as _telemetry
from nsq_proto import (
    ErrorReceived,
    LocalProtocolError,
    LookupFailed,
    PublishTimeout,
    TraceReceipt,
    parse_client_addresses,
)

from ._asyncio_stream import as_asyncio
from ._consumer import Consumer as AsyncConsumer
from ._producer import Producer as AsyncProducer

__all__ = ["Consumer", "Message", "Producer"]

C = TypeVar("C", AsyncProducer, AsyncConsumer)


def _check_addresses(options: nsq_client.ProducerArguments | nsq_client.ConsumerArguments) -> None:
    """Check the addresses now, as the async client's constructor does (it is made later, in
    the event-loop thread); the lists given are copied first, so that an iterator given is
    read once."""
    nsqd = options.get("nsqd_tcp_addresses", ())
    if not isinstance(nsqd, str | bytes):
        nsqd = options["nsqd_tcp_addresses"] = list(nsqd)
    lookupd = options.get("lookupd_http_addresses", ())
    if not isinstance(lookupd, str | bytes):
        lookupd = options["lookupd_http_addresses"] = list(lookupd)
    parse_client_addresses(nsqd, lookupd)


#: the blocking consumer whose handler this thread runs (a thread of ``Consumer.run``)
_handler_thread = threading.local()


class _Runner(Generic[C]):
    """One event-loop thread and the async client it drives (entered and left in one task)."""

    def __init__(self, backend: str, make: Callable[[], C], what: str) -> None:
        self._backend = backend
        self._make: Callable[[], C] = make
        self._what = what
        self._stack: ExitStack | None = None
        self._portal: BlockingPortal | None = None
        self._client: C | None = None
        #: how another thread schedules a callback on the thread's loop
        self.soon: Callable[[Callable[[], object]], object] | None = None

    def open(self) -> None:
        if self._stack is not None:
            raise LocalProtocolError(f"this {self._what} is already started")
        stack = ExitStack()
        try:
            portal = stack.enter_context(start_blocking_portal(self._backend))
            client = stack.enter_context(portal.wrap_async_context_manager(self._make()))
            soon = portal.call(_call_soon_threadsafe)
        except BaseException:
            stack.close()
            raise
        self._stack, self._portal, self._client = stack, portal, client
        self.soon = soon

    def close(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        stack, self._stack, self._portal, self._client = self._stack, None, None, None
        self.soon = None
        if stack is not None:
            stack.__exit__(exc_type, exc, tb)

    def _outside(self) -> LocalProtocolError:
        # the async API's error for the same mistake
        return LocalProtocolError(
            f"use the {self._what} inside its 'with' block (or between start() and close())"
        )

    @property
    def client(self) -> C:
        if self._client is None:
            raise self._outside()
        return self._client

    def call(self, func: Callable[..., Any], *args: Any) -> Any:
        portal = self._portal
        if portal is None:
            raise self._outside()
        return portal.call(func, *args)


async def _call_soon_threadsafe() -> Callable[[Callable[[], object]], object]:
    """How another thread schedules a callback on this thread's event loop: through a
    :class:`_Handoff`, so that the callbacks many threads give while the loop is busy wake it
    once.  On asyncio the callbacks run knowing they are on asyncio: a callback has no task
    for anyio to tell the library by, and the client may start a task there (a write that
    waits for room, a close)."""
    try:
        call_soon = asyncio.get_running_loop().call_soon_threadsafe
    except RuntimeError:  # trio's thread (trio tells anyio itself)
        import trio

        return _Handoff(trio.lowlevel.current_trio_token().run_sync_soon)

    def wake(run: Callable[[], object]) -> object:
        return call_soon(as_asyncio, run)

    return _Handoff(wake)


class _Handoff:
    """Callbacks from other threads, run in the loop's thread in the order given.  Only the
    first given while none waits wakes the loop (each wake-up is a system call, and 200
    threads publishing at once would make one each); the loop then runs every callback
    given until it has run them all."""

    __slots__ = ("_lock", "_pending", "_scheduled", "_wake")

    def __init__(self, wake: Callable[[Callable[[], object]], object]) -> None:
        self._wake = wake
        self._lock = threading.Lock()
        self._pending: list[Callable[[], object]] = []
        self._scheduled = False

    def __call__(self, callback: Callable[[], object]) -> None:
        with self._lock:
            self._pending.append(callback)
            if self._scheduled:
                return
            self._scheduled = True
        try:
            self._wake(self._run)
        except BaseException:
            with self._lock:
                self._scheduled = False
                self._pending.remove(callback)
            raise

    def _run(self) -> None:
        while True:
            with self._lock:
                batch = self._pending
                if not batch:
                    self._scheduled = False
                    return
                self._pending = []
            for index, callback in enumerate(batch):
                try:
                    callback()
                except BaseException:
                    # the rest still run, in a call of their own (as separate callbacks would)
                    with self._lock:
                        self._pending[:0] = batch[index + 1 :]
                    self._wake(self._run)
                    raise


class _Blocking(Generic[C]):
    """``with`` plumbing: the thread starts on enter and is joined on exit (or on
    :meth:`start` and :meth:`close`, for an object that lives as long as an application)."""

    _runner: _Runner[C]

    def __enter__(self) -> Self:
        self._runner.open()
        return self

    def start(self) -> Self:
        """Connect and start the event-loop thread, as entering the ``with`` block does; for an
        object that lives as long as the application (a web application's producer, opened
        at start-up).  Raises LocalProtocolError when it is started already."""
        self._runner.open()
        return self

    def close(self) -> None:
        """Stop as leaving the ``with`` block does and join the thread; nothing once closed."""
        self._runner.close(None, None, None)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._runner.close(exc_type, exc, tb)

    def _client(self) -> C:
        return self._runner.client


class Producer(_Blocking[AsyncProducer]):
    """Publish from synchronous code; every option of :class:`nsq_anyio.Producer`."""

    def __init__(
        self, *, backend: str = "asyncio", **options: Unpack[nsq_client.ProducerArguments]
    ) -> None:
        _check_addresses(options)
        self._runner = _Runner(backend, lambda: AsyncProducer(**options), "producer")

    def publish(
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
        """PUB (DPUB with ``delay``); returns once nsqd acknowledged it."""
        producer = self._client()
        soon = self._runner.soon
        if (
            soon is not None
            and delay is None
            and partition is None
            and sharding_key is None
            and trace_id is None
            and ext is None
            and _telemetry.active is None
        ):
            # the everyday publish: queued from a callback of the loop, answered to this
            # thread's lock (no task and no future per publish, one hop each way)
            lock = threading.Lock()
            lock.acquire()
            waiter = ThreadWaiter(lock.release)
            soon(partial(producer.publish_soon, topic, body, waiter))
            # bounded: the core fails a publish at publish_timeout, and fails every publish
            # when the producer closes
            if not lock.acquire(timeout=producer.config.publish_timeout + 30.0):
                raise PublishTimeout("no answer from the producer's event-loop thread")
            if waiter.failure is not None:
                raise waiter.failure
            if waiter.error is not None:
                raise waiter.error
            return waiter.receipt

        async def publish() -> TraceReceipt | None:
            return await producer.publish(
                topic,
                body,
                delay=delay,
                partition=partition,
                sharding_key=sharding_key,
                trace_id=trace_id,
                ext=ext,
            )

        result: TraceReceipt | None = self._runner.call(publish)
        return result

    def publish_many(
        self,
        topic: str,
        bodies: Iterable[bytes],
        *,
        partition: int | None = None,
        sharding_key: bytes | str | None = None,
        ext: Mapping[str, Any] | None = None,
    ) -> TraceReceipt | None:
        """MPUB: all or nothing, once nsqd acknowledged it."""
        producer = self._client()
        batch = list(bodies)

        async def publish_many() -> TraceReceipt | None:
            return await producer.publish_many(
                topic, batch, partition=partition, sharding_key=sharding_key, ext=ext
            )

        result: TraceReceipt | None = self._runner.call(publish_many)
        return result

    def stats(self) -> nsq_client.ProducerStats:
        producer = self._client()

        async def stats() -> nsq_client.ProducerStats:
            return producer.stats()

        result: nsq_client.ProducerStats = self._runner.call(stats)
        return result


class Message:
    """A delivered message; answer it once (from any thread): :meth:`finish` or
    :meth:`requeue` (:meth:`touch` buys time first)."""

    __slots__ = ("_message", "_runner")

    def __init__(self, message: AsyncMessage, runner: _Runner[AsyncConsumer]) -> None:
        self._message = message
        self._runner = runner

    @property
    def id(self) -> bytes:
        return self._message.id

    @property
    def body(self) -> bytes:
        return self._message.body

    @property
    def attempts(self) -> int:
        return self._message.attempts

    @property
    def timestamp(self) -> int:
        return self._message.timestamp

    @property
    def nsqd_address(self) -> str:
        return self._message.nsqd_address

    @property
    def has_responded(self) -> bool:
        return self._message.has_responded

    def finish(self) -> None:
        """FIN: the message is done.  Hands the FIN to the consumer's event loop and returns
        without waiting for it to be written (as go-nsq's ``Finish``); answering twice
        raises here."""
        message = self._message
        soon = self._runner.soon
        if soon is None or type(message) is not AsyncMessage:  # closed, or traced (otel)
            self._runner.call(message.finish)
            return
        message._mark()
        try:
            # handed over by a callback of the loop (no task, no wait for it): it runs before
            # anything this thread asks of the loop next, such as its next message or stats()
            soon(partial(self._runner.client.finish_soon, message))
        except RuntimeError:  # the loop closed meanwhile
            message._responded = False
            raise self._runner._outside() from None

    def requeue(self, delay: float | None = None, backoff: bool = True) -> None:
        self._runner.call(self._message.requeue, delay, backoff)

    def touch(self) -> None:
        self._runner.call(self._message.touch)

    def __repr__(self) -> str:
        return repr(self._message)


class Consumer(_Blocking[AsyncConsumer]):
    """Consume from synchronous code; every option of :class:`nsq_anyio.Consumer`.

    Iterate for manual answers, or :meth:`run` a handler in a pool of threads.  Leaving the
    ``with`` block (Ctrl-C included) stops gracefully: CLS, the messages still held are
    waited for up to ``stop_timeout``, and what is left is requeued."""

    def __init__(
        self,
        topic: str,
        channel: str,
        *,
        backend: str = "asyncio",
        **options: Unpack[nsq_client.ConsumerArguments],
    ) -> None:
        _check_addresses(options)
        self._runner = _Runner(
            backend, lambda: AsyncConsumer(topic, channel, **options), "consumer"
        )
        #: run(handler, threads=N) raises max_in_flight to N unless the user chose it
        self._max_in_flight_chosen = chose_max_in_flight(options.get("config"), options)

    def __iter__(self) -> Iterator[Message]:
        consumer = self._client()

        async def next_message() -> AsyncMessage | None:
            try:
                message: AsyncMessage = await consumer.__anext__()
            except StopAsyncIteration:
                return None
            return message

        while (message := self._runner.call(next_message)) is not None:
            # while the loop's body holds the message, stop() from this thread cannot wait
            held, _handler_thread.consumer = getattr(_handler_thread, "consumer", None), self
            try:
                yield Message(message, self._runner)
            finally:
                _handler_thread.consumer = held

    def run(self, handler: Callable[[Message], object], threads: int = 4) -> None:
        """Handler style in ``threads`` threads: returning FINishes, raising REQueues with
        backoff.  Returns when the consumer stops (Ctrl-C stops it gracefully).

        Unless max_in_flight was set (as an option or by :meth:`set_max_in_flight`), it is
        raised to ``threads``, so that nsqd sends enough messages for every thread."""
        if threads < 1:
            raise ValueError("threads must be at least 1")
        if is_async_callable(handler):
            # it would return a coroutine, never run, and each message would be FINished
            raise TypeError(
                f"the blocking run() takes a plain function, not the async {handler!r}: give "
                "it to the run() of nsq_anyio.Consumer"
            )
        if not self._max_in_flight_chosen and self.stats()["max_in_flight"] < threads:
            self._set_max_in_flight(threads)
        errors: list[BaseException] = []

        def work() -> None:
            try:
                for message in self:
                    try:
                        handler(message)
                    except Exception:
                        if not message.has_responded:
                            message.requeue()
                    else:
                        if not message.has_responded:
                            message.finish()
            except BaseException as exc:  # a broken loop: reported by run()
                errors.append(exc)

        workers = [
            threading.Thread(target=work, name=f"nsq-handler-{i}", daemon=True)
            for i in range(threads)
        ]
        for worker in workers:
            worker.start()
        try:
            for worker in workers:
                while worker.is_alive():
                    worker.join(0.2)  # wakes up for Ctrl-C
        except KeyboardInterrupt:
            self.stop()
            for worker in workers:
                worker.join()
            raise
        if errors:
            raise errors[0]

    def stop(self) -> None:
        """Stop gracefully now (leaving the ``with`` block does the same): CLS, then wait (up
        to ``stop_timeout``) for the messages held to be answered.

        Called from a handler of :meth:`run` (or from the body of a ``for message in
        consumer`` loop), it cannot wait for its own caller: it starts the stop and returns
        at once; the message is answered as usual (by the handler's outcome), and
        :meth:`run` (or the loop) ends once the stop is done."""
        consumer = self._client()
        if getattr(_handler_thread, "consumer", None) is self:

            async def begin() -> None:
                consumer._begin_stop()

            self._runner.call(begin)
            return
        self._runner.call(consumer.stop)

    def stats(self) -> nsq_client.ConsumerStats:
        consumer = self._client()

        async def stats() -> nsq_client.ConsumerStats:
            return consumer.stats()

        result: nsq_client.ConsumerStats = self._runner.call(stats)
        return result

    def set_max_in_flight(self, max_in_flight: int) -> None:
        """Change max_in_flight (0 pauses the consumer); :meth:`run` then keeps it."""
        self._set_max_in_flight(max_in_flight)
        self._max_in_flight_chosen = True

    def _set_max_in_flight(self, max_in_flight: int) -> None:
        consumer = self._client()

        async def change() -> None:
            consumer.set_max_in_flight(max_in_flight)

        self._runner.call(change)

    def is_starved(self) -> bool:
        """Some connection has in-flight messages at >= 85 % of its RDY: nsqd sends no more
        until the application answers some of those it holds."""
        consumer = self._client()

        async def starved() -> bool:
            return consumer.is_starved()

        result: bool = self._runner.call(starved)
        return result

    @property
    def errors(self) -> list[ErrorReceived]:
        """The latest error frames of nsqd (oldest first), as the async consumer keeps them."""
        consumer = self._client()

        async def errors() -> list[ErrorReceived]:
            return list(consumer.errors)

        result: list[ErrorReceived] = self._runner.call(errors)
        return result

    @property
    def connection_errors(self) -> list[BaseException]:
        """Why the latest connections failed or closed (oldest first): refused, reset, ..."""
        consumer = self._client()

        async def connection_errors() -> list[BaseException]:
            return list(consumer.connection_errors)

        result: list[BaseException] = self._runner.call(connection_errors)
        return result

    @property
    def lookup_failures(self) -> list[LookupFailed]:
        """The latest failed nsqlookupd requests (oldest first)."""
        consumer = self._client()

        async def lookup_failures() -> list[LookupFailed]:
            return list(consumer.lookup_failures)

        result: list[LookupFailed] = self._runner.call(lookup_failures)
        return result
