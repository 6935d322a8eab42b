"""The consumer: a sans-IO consumer core driven on a backend, with the application's API."""

from __future__ import annotations

import logging
import random
import ssl
from collections import deque
from collections.abc import AsyncIterator, Iterable
from contextlib import suppress
from contextvars import ContextVar
from typing import Any, Unpack

from nsq_proto import (
    ConfigError,
    ConnectionClosed,
    ConsumerConfig,
    ErrorReceived,
    Event,
    LocalProtocolError,
    LookupFailed,
    LookupSucceeded,
    MessageGivenUp,
    MessagesReceived,
    NSQError,
    StartFromFailed,
    Stopped,
)
from nsq_proto import Consumer as ConsumerCore
from nsq_proto.wire import NON_FATAL_ERRORS

from ._backend import Backend
from ._client import ClientBase
from ._message import (
    CHECKPOINT_EVERY,
    GiveUpHook,
    Handler,
    Message,
    _Inbox,
    _Origin,
    check_handler,
)
from ._options import ConsumerOptions, build_config, chose_max_in_flight
from ._stats import ConsumerStats
from ._telemetry import consumers as _consumers
from ._telemetry import hooks as _telemetry

__all__ = ["Consumer"]

log = logging.getLogger("nsq.consumer")

#: the consumer whose handler the current task runs (set in each worker task of ``run()``)
_HANDLING: ContextVar[Consumer | None] = ContextVar("nsq_handling", default=None)

#: how many recent errors a consumer keeps for inspection
_KEEP_ERRORS = 100


class Consumer(ClientBase):
    """Consume ``topic``/``channel`` from nsqd (a fixed list) or from what lookupd lists.

    Every option of :class:`nsq_proto.ConsumerConfig` is a keyword argument of the same name.
    ``tls`` takes an ``ssl.SSLContext`` (or True for the default, verifying context).
    Leaving the ``async with`` block stops gracefully: CLS, then wait (up to
    ``stop_timeout``) for the messages the application holds to be answered; the rest is
    requeued.  Cancelled, it requeues what the application holds at once.
    """

    def __init__(
        self,
        topic: str,
        channel: str,
        *,
        backend: Backend | None = None,
        nsqd_tcp_addresses: Iterable[str] = (),
        lookupd_http_addresses: Iterable[str] = (),
        tls: bool | ssl.SSLContext | None = None,
        tls_hostname: str | None = None,
        on_give_up: GiveUpHook | None = None,
        rng: random.Random | None = None,
        config: ConsumerConfig | None = None,
        **options: Unpack[ConsumerOptions],
    ) -> None:
        super().__init__(backend, tls, tls_hostname)
        backend = self._backend
        self.config = build_config(ConsumerConfig, backend, config, options, tls=self._use_tls)
        #: run(handler, concurrency=N) raises max_in_flight to N unless the user chose it
        self._max_in_flight_chosen = chose_max_in_flight(config, options)
        self._core = ConsumerCore(
            topic,
            channel,
            self.config,
            nsqd_tcp_addresses=nsqd_tcp_addresses,
            lookupd_http_addresses=lookupd_http_addresses,
            rng=rng,
            message_batches=True,
            message_class=Message,
        )
        self.topic = topic
        self.channel = channel
        #: the origins (connections) whose messages were FINished since the runner's last
        #: pass, each holding its answered messages; the pass hands each origin's to the core
        #: in one call (:meth:`_take_answers`): the core's books, RDY and FIN bytes per read,
        #: not per message; the same list all along (each origin holds it too)
        self._answering: list[_Origin] = []
        self._drive(
            self._core, self._on_event, self.config.write_timeout, before_output=self._take_answers
        )
        self._on_give_up = on_give_up
        self._inbox = _Inbox(backend, self._runner)
        self._closing = False
        self._stopped = backend.event()
        self._origins: dict[int, _Origin] = {}
        #: the latest error frames, lookupd failures and connection failures (bounded)
        self.errors: deque[ErrorReceived] = deque(maxlen=_KEEP_ERRORS)
        self.lookup_failures: deque[LookupFailed] = deque(maxlen=_KEEP_ERRORS)
        self.connection_errors: deque[BaseException] = deque(maxlen=_KEEP_ERRORS)
        #: the latest answer of a lookupd (None before the first)
        self.last_lookup: LookupSucceeded | None = None
        self._told_topic_missing = False
        self._answers_refused = 0
        self._closes_unconfirmed = 0
        _consumers.add(self)  # for nsq_client.otel's gauges, once instrumented

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        backend = self._backend
        # cancelled (a scope around the block, Ctrl-C): nothing can answer the messages held
        abrupt = isinstance(exc_info[1], (backend.cancelled_exc_class(), KeyboardInterrupt))
        # the block is over: nothing takes messages from the inbox any more, so those still
        # on their way (sent by nsqd before it read our CLS) go back at once
        self._closing = True
        if not abrupt:
            await self._stop()
            with backend.cancel_scope(shield=True):
                await self._runner.aclose()
            return await self._exit(exc_info)
        # the client's tasks were cancelled with the caller: end them (one may have failed:
        # that is what the block ends with), then finish the exchange in tasks of our own
        failure: BaseException | None = None
        try:
            await self._end_tasks()
        except BaseException as exc:
            failure = exc
        try:
            await self._stop_abruptly()
        finally:
            with backend.cancel_scope(shield=True):
                await self._runner.aclose()
        if failure is not None:
            raise failure
        return None

    async def _stop_abruptly(self) -> None:
        """Stop when nothing can answer the messages held any more: CLS, every unanswered
        message requeued at once, then read on (shielded, briefly) until nsqd confirmed the
        CLS, requeueing what it sent meanwhile, so that it holds nothing in flight for us
        (nsqd keeps a closed connection's messages until msg_timeout)."""
        backend = self._backend
        with backend.cancel_scope(shield=True):
            self._take_answers()
            now = backend.current_time()
            self._core.stop(now, requeue_unanswered=True)
            self._requeue_inbox(now)
            # the core closes every connection within stop_timeout (within REQUEUE_GRACE of
            # the last byte nsqd sent): this bound is a backstop
            with backend.cancel_scope(deadline=now + self.config.stop_timeout + 5.0):
                async with backend.task_group() as tg:
                    self._runner.resume(tg)
                    await self._stopped.wait()
                    tg.cancel_scope.cancel()
            self._inbox.close()

    def _requeue_inbox(self, now: float) -> None:
        """Messages delivered but never handed to the application go back at once."""
        for message in self._inbox.drain():
            message._responded = True
            # a message that timed out and came back is in the inbox twice: only the
            # newest copy's REQ is sent
            self._requeue_now(message.conn_id, message.id, message.attempts, now)

    def _requeue_now(self, conn_id: int, msg_id: bytes, attempts: int, now: float) -> None:
        """REQ at once, without backoff, of a message the application never got."""
        with suppress(LocalProtocolError):
            self._core.requeue(conn_id, msg_id, now, delay=0.0, backoff=False, attempts=attempts)

    def _begin_stop(self) -> float:
        """CLS everywhere, what waits in the inbox requeued; returns the time it began."""
        self._take_answers()
        now = self._backend.current_time()
        self._core.stop(now)
        self._requeue_inbox(now)
        self._runner.wake()
        return now

    async def _stop(self) -> None:
        backend = self._backend
        with backend.cancel_scope(shield=True):
            now = self._begin_stop()
            with backend.cancel_scope(deadline=now + self.config.stop_timeout + 5.0):
                await self._stopped.wait()
            self._inbox.close()

    @property
    def answers_confirmed(self) -> bool:
        """Once the consumer stopped: whether nsqd processed every answer given before the
        stop.  True when each of its connections closed after nsqd answered CLS with
        CLOSE_WAIT (nsqd processes a connection's commands in order, so every FIN, REQ and
        TOUCH sent before CLS had been) and nsqd refused none of them (no ``E_FIN_FAILED``,
        ``E_REQ_FAILED`` or ``E_TOUCH_FAILED``); False while it runs, or when a connection
        ended otherwise (lost, or closed by ``stop_timeout``): nsqd may then deliver again
        a message that was FINished.  For applications that must know, such as one that
        wrote a batch somewhere before it FINished it."""
        return self._stopped.is_set() and not self._answers_refused and not self._closes_unconfirmed

    async def stop(self) -> None:
        """Stop gracefully now (leaving the ``async with`` block does the same): CLS, then
        wait (up to ``stop_timeout``) for the messages the application holds to be answered.

        Called from a handler of :meth:`run` (or a task it started), it cannot wait for its
        own caller: it starts the stop and returns at once; the handler's message is
        answered by the handler's outcome as usual, and :meth:`run` returns once the stop
        is done."""
        if _HANDLING.get() is self:
            self._begin_stop()
            return
        await self._stop()

    def _on_event(self, event: Event) -> None:
        if type(event) is MessagesReceived:
            if self._closing:
                # the block is over: what nsqd sent before it read our CLS goes back at once
                now = self._backend.current_time()
                for late in event.messages:
                    self._requeue_now(event.conn_id, late.id, late.attempts, now)
                return
            origin = self._origins.get(event.conn_id)
            if origin is None:
                origin = self._origin(event.conn_id)
            messages: list[Message] = event.messages  # type: ignore[assignment]
            for message in messages:  # built by the connection as our class (message_class)
                message._origin = origin
                message._responded = False
            self._inbox.put_many(messages)
            return
        if _telemetry.active is not None:  # nsq_client.otel: connection and lookupd counters
            _telemetry.active.consumer_event(self, event)
        if isinstance(event, MessageGivenUp):
            message = Message._of(self._origin(event.conn_id), event.message)
            message._responded = event.finished
            log.warning("giving up on message %r after %d attempts", message.id, message.attempts)
            if self._on_give_up is not None:
                self._on_give_up(message)
        elif isinstance(event, ErrorReceived):
            if event.code in NON_FATAL_ERRORS:  # a FIN, REQ or TOUCH nsqd refused
                self._answers_refused += 1
            self.errors.append(event)
            log.warning("nsqd error on connection %d: %s %s", event.conn_id, event.code, event.text)
        elif isinstance(event, LookupSucceeded):
            self.last_lookup = event
            if not event.topic_found and not self._told_topic_missing:
                self._told_topic_missing = True
                log.info(
                    "topic %r does not exist yet (lookupd %s:%d): asking again soon, "
                    "from every %.0f s up to every %.0f s",
                    self.topic,
                    *event.address,
                    self.config.lookupd_recheck_delay,
                    self.config.lookupd_poll_interval,
                )
        elif isinstance(event, LookupFailed):
            self.lookup_failures.append(event)
            log.warning("lookupd %s:%d failed: %s", *event.address, event.error)
        elif isinstance(event, StartFromFailed):
            self.connection_errors.append(event.error)
            log.warning(
                "start_from of partition %d not set on %s:%d: %s",
                event.partition,
                *event.address,
                event.error,
            )
        elif isinstance(event, ConnectionClosed):
            self._origins.pop(event.conn_id, None)
            if not event.after_close_wait:
                self._closes_unconfirmed += 1
            if event.error is not None:
                self.connection_errors.append(event.error)
                cause = event.error.__cause__
                log.warning(
                    "connection %d%s: %s%s",
                    event.conn_id,
                    " closed" if event.connected else "",  # never opened: the error says why
                    event.error,
                    "" if cause is None or str(cause) in str(event.error) else f" ({cause})",
                )
        elif isinstance(event, Stopped):
            self._stopped.set()
            self._inbox.close()

    def _origin(self, conn_id: int) -> _Origin:
        origin = self._origins.get(conn_id)
        if origin is None:
            stats = self._core.connection_stats(conn_id)
            if stats is None:
                origin = _Origin(self, conn_id, "", None)
            else:
                address = f"{stats.address[0]}:{stats.address[1]}"
                origin = _Origin(self, conn_id, address, stats.partition)
            self._origins[conn_id] = origin
        return origin

    def _finish(self, message: Message) -> bool:
        """FIN; True when it should be written at once: nothing else the connection delivered
        is held, so no other answer will come to share the write (with ``max_in_flight=1`` the
        next message waits for this FIN).  Otherwise the FIN waits for the runner's next pass,
        which hands every answer given meanwhile to the core at once."""
        origin = message._origin
        conn_id = origin.conn_id
        answers = origin.answers
        # messages wait in the inbox, or the connection holds more than was answered: another
        # answer will come
        if self._inbox.items or self._core.in_flight_count(conn_id) > len(answers) + 1:
            if not answers:
                self._answering.append(origin)
            answers.append(message)
            runner = self._runner
            if not runner._woken:  # (wake's own test, without the call on every answer)
                runner.wake()
            return False
        if answers:
            answers.append(message)
            self._take_answers()
        else:  # the lone answer (one in flight): straight to the core
            self._core.finish(conn_id, message.id, self._clock(), attempts=message.attempts)
        return True

    def finish_soon(self, message: Message) -> None:
        """FIN of ``message`` (already marked answered) from a callback of the event loop, not
        a task: for a thread that does not wait for it (the blocking API's ``finish``), as
        ``await message.finish()`` would do it.  What the core refuses is logged."""
        try:
            if self._finish(message):
                self._runner.drain_soon()
        except NSQError as exc:
            log.warning("FIN of message %r not sent: %s", message.id, exc)

    def _take_answers(self) -> None:
        """Hand the FINs given since the last call to the core: one call, one write and one
        RDY decision per connection.  Called before the core's state is read or changed
        otherwise (the runner's passes, a REQ, a TOUCH, a stop, the stats)."""
        answering = self._answering
        if answering:
            core = self._core
            now = self._clock()
            try:
                for origin in answering:
                    answers = origin.answers
                    try:
                        core.finish_messages(origin.conn_id, answers, now)
                    except LocalProtocolError as exc:  # requeued meanwhile (a stop's)
                        log.warning("a FIN was not sent: %s", exc)
                    finally:
                        answers.clear()  # (the same list: the origin's messages hold it)
            finally:
                for origin in answering:  # (only after a failure of the core: none left)
                    origin.answers.clear()
                answering.clear()  # the same list (the origins hold it): emptied

    def _requeue(self, message: Message, delay: float | None, backoff: bool) -> bool:
        """REQ; True when it should be written at once (as :meth:`_finish` says)."""
        self._take_answers()  # in the order given
        conn_id = message._origin.conn_id
        core = self._core
        core.requeue(
            conn_id,
            message.id,
            self._clock(),
            delay=delay,
            backoff=backoff,
            attempts=message.attempts,
        )
        if core.in_flight_count(conn_id) == 0:
            return True
        self._runner.wake()
        return False

    def _touch(self, message: Message) -> None:
        self._take_answers()
        self._core.touch(message.conn_id, message.id, self._clock(), attempts=message.attempts)
        self._runner.wake()

    def __aiter__(self) -> AsyncIterator[Message]:
        return self

    async def __anext__(self) -> Message:
        inbox = self._inbox
        # the inbox's get and take, inline: one coroutine and one call fewer per message
        inbox._taken = taken = inbox._taken + 1
        items = inbox.items
        message: Message | None
        if items and taken % CHECKPOINT_EVERY:
            message = items.popleft()
        else:
            message = await inbox.wait_next()
            if message is None:
                raise StopAsyncIteration
        if _telemetry.active is not None:  # nsq_client.otel: a span until it is answered
            return _telemetry.active.received(self, message)
        return message

    async def get_many(self, max_messages: int) -> list[Message]:
        """Wait for a message, then take it and the others already delivered, up to
        ``max_messages`` in all; an empty list once the consumer has stopped.

        For applications that handle messages in batches (one database write for many):
        each message is still answered on its own, and RDY bounds how many can wait."""
        if max_messages < 1:
            raise ConfigError("max_messages must be at least 1")
        return await self._inbox.get_many(max_messages)

    async def finish_many(self, messages: Iterable[Message]) -> None:
        """FIN every message of ``messages`` (as ``await message.finish()`` on each), with
        one write per connection: for applications that answer a whole batch at once.

        A message already answered, or given twice, or delivered by another consumer, is a
        :class:`LocalProtocolError` raised before any FIN is sent."""
        batch = list(messages)
        answers = []
        for i, message in enumerate(batch):
            origin = message._origin
            try:
                if origin.consumer is not self:
                    raise LocalProtocolError(f"{message!r} was delivered by another consumer")
                message._mark()
            except LocalProtocolError:
                for marked in batch[:i]:
                    marked._responded = False
                raise
            answers.append((origin.conn_id, message.id, message.attempts))
        self._take_answers()
        self._core.finish_many(answers, self._clock())
        self._runner.wake()

    async def touch_many(self, messages: Iterable[Message]) -> None:
        """TOUCH every message of ``messages`` (as ``await message.touch()`` on each), with
        one write per connection: for applications that hold many messages at once.

        A message already answered, or delivered by another consumer, is a
        :class:`LocalProtocolError` raised before any TOUCH is sent."""
        batch = list(messages)
        for message in batch:
            if message._consumer is not self:
                raise LocalProtocolError(f"{message!r} was delivered by another consumer")
            if message._responded:
                raise LocalProtocolError(f"{message!r} has already been answered")
        self._take_answers()
        self._core.touch_many([(m.conn_id, m.id, m.attempts) for m in batch], self._clock())
        self._runner.wake()

    async def run(self, handler: Handler, concurrency: int | None = None) -> None:
        """Handler style: returning FINishes, raising REQueues with backoff; at most
        ``concurrency`` handlers run at once (default: max_in_flight).  Returns when the
        consumer stops.  ``handler`` must be an async function (a TypeError otherwise, before
        any message is taken).

        Unless max_in_flight was set (as an option, in ``config=``, or by
        :meth:`set_max_in_flight`), it is raised to ``concurrency``, so that nsqd sends
        enough messages for every handler."""
        check_handler(handler)
        n = concurrency if concurrency is not None else max(1, self.config.max_in_flight)
        if n < 1:
            raise ConfigError("concurrency must be at least 1")
        self._make_room_for(n)
        async with self._backend.task_group() as tg:
            for _ in range(n):
                tg.start_soon(self._worker, handler)

    async def _worker(self, handler: Handler) -> None:
        _HANDLING.set(self)  # this task's own context: what its handlers call sees it
        inbox = self._inbox
        items = inbox.items
        runner = self._runner
        answering = self._answering  # (emptied by each pass, never replaced)
        while True:
            # inbox.take(), inline: the next message without a checkpoint while one waits
            inbox._taken = taken = inbox._taken + 1
            message: Message | None
            if items and taken % CHECKPOINT_EVERY:
                message = items.popleft()
            else:
                message = await inbox.wait_next()
                if message is None:
                    return
            try:
                if _telemetry.active is None:
                    await handler(message)
                else:  # nsq_client.otel: the handler inside a CONSUMER span
                    await _telemetry.active.process(self, handler, message)
            except self._backend.cancelled_exc_class():
                # run() was cancelled mid-handler: the message goes back at once, so that a
                # stop does not wait stop_timeout for an answer that cannot come
                if not message.has_responded:
                    message._responded = True
                    with suppress(NSQError):
                        self._requeue(message, 0.0, False)
                        self._runner.wake()  # cancelled: the pump writes it
                raise
            except Exception:
                log.exception("handler failed for message %r", message.id)
                if not message.has_responded:
                    await message.requeue()
            else:
                if not message._responded:
                    message._responded = True  # what ``await message.finish()`` does
                    if items:
                        # _finish's first case, inline: more wait, so another answer will
                        # share the write; the runner's next pass hands them over
                        origin = message._origin
                        answers = origin.answers
                        if not answers:
                            answering.append(origin)
                        answers.append(message)
                        if not runner._woken:
                            runner.wake()
                    elif self._finish(message):
                        await runner.drain_here()

    def is_starved(self) -> bool:
        self._take_answers()
        return self._core.is_starved()

    def set_max_in_flight(self, max_in_flight: int) -> None:
        """Change max_in_flight (0 pauses the consumer); :meth:`run` then keeps it."""
        self._take_answers()
        self._core.set_max_in_flight(max_in_flight, self._backend.current_time())
        self._max_in_flight_chosen = True
        self._runner.wake()

    def _make_room_for(self, handlers: int) -> None:
        """Raise max_in_flight to ``handlers`` (that many run at once) unless the user chose it."""
        if not self._max_in_flight_chosen and self._core.max_in_flight < handlers:
            self._core.set_max_in_flight(handlers, self._backend.current_time())
            self._runner.wake()

    def stats(self) -> ConsumerStats:
        """Counters and each connection's state, as a JSON-ready dict."""
        self._take_answers()
        core = self._core
        return {
            "topic": self.topic,
            "channel": self.channel,
            "max_in_flight": core.max_in_flight,
            "total_rdy": core.total_rdy,
            "backoff_level": core.backoff_level,
            "starved": core.is_starved(),
            "messages_received": core.messages_received,
            "messages_finished": core.messages_finished,
            "messages_requeued": core.messages_requeued,
            "messages_given_up": core.messages_given_up,
            "last_error": str(self.connection_errors[-1]) if self.connection_errors else None,
            "connections": [
                {
                    "conn_id": s.conn_id,
                    "address": f"{s.address[0]}:{s.address[1]}",
                    "state": s.state,
                    "rdy": s.rdy,
                    "in_flight": s.in_flight,
                    "partition": s.partition,
                    # the RDY nsqd allows on it (IDENTIFY's max_rdy_count; None before it)
                    "max_rdy_count": _max_rdy_count(core, s.conn_id),
                }
                for s in core.connections()
            ],
        }


def _max_rdy_count(core: ConsumerCore, conn_id: int) -> int | None:
    conn = core.connection(conn_id)
    features = None if conn is None else conn.features
    return None if features is None else features.max_rdy_count
