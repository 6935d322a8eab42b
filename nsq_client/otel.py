"""OpenTelemetry traces and metrics for the client (``pip install "nsq-sansio[otel]"``).

.. code-block:: python

    import nsq_client.otel

    nsq_client.otel.instrument()  # the global providers, or tracer_provider=, meter_provider=

:func:`instrument` turns it on for every ``Consumer`` and ``Producer`` of ``nsq_client``,
``nsq_anyio`` and ``nsq_trio`` (those made before too), :func:`uninstrument` off again.  It
uses OpenTelemetry's API alone: without an SDK configured (``opentelemetry-sdk`` or another)
nothing is recorded.  Off, the client pays one check per message or publish.

- A PRODUCER span per ``publish`` (``publish {topic}``) and per ``publish_many`` (one span for
  the MPUB, with ``messaging.batch.message_count``), from the call until nsqd's answer.  When
  the publish carries a JSON extension header (``ext=``), or goes to an extended topic of the
  partitioned server (lookupd said so: from the topic's first lookup on), the span's context
  goes into it (``traceparent``, ``tracestate``: the global
  propagator's fields), beside the application's own keys, none of which it replaces.
- A CONSUMER span per message handled (``process {topic}``): around each handler call of
  ``Consumer.run`` (the handler runs inside it: its spans are children), or, for a message
  taken with ``async for``, from then until it is finished or requeued (:func:`span_of` gives
  it).  Its parent is the context the message carries in its extension header, and it links
  to it as well; without one (standard nsqd, or a topic without headers) it is a root span.
  A handler that raised makes it an ERROR span with the exception recorded.
- The metrics of OpenTelemetry's messaging conventions, and NSQ's own under ``nsq.``: the
  names are in the telemetry page of the documentation (``docs/telemetry.md``).
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

try:
    from opentelemetry import context as otel_context
    from opentelemetry import metrics, propagate, trace
    from opentelemetry.metrics import CallbackOptions, Observation
    from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode
except ModuleNotFoundError as missing:  # pragma: no cover - the test runs it in a subprocess
    raise ModuleNotFoundError(
        'nsq_client.otel needs OpenTelemetry\'s API: pip install "nsq-sansio[otel]" '
        '(or "opentelemetry-api>=1.25")',
        name=missing.name,
    ) from missing

from nsq_proto import (
    ConnectionClosed,
    Event,
    LookupFailed,
    MessageGivenUp,
    Ready,
    Stopped,
    TraceReceipt,
    __version__,
)

from . import _telemetry
from ._consumer import Consumer
from ._message import Handler, Message
from ._producer import Producer

__all__ = ["instrument", "is_instrumented", "span_of", "uninstrument"]

log = logging.getLogger("nsq.otel")

#: ``messaging.system``
SYSTEM = "nsq"
#: the instrumentation scope's name (the tracer's and the meter's)
SCOPE = "nsq_client.otel"
#: the conventions' buckets for the duration histograms, in seconds
#: the status of the span of a message taken with ``async for`` that can no longer be answered
CLOSED_UNANSWERED = "its connection closed before an answer (nsqd delivers it again)"
STOPPED_UNANSWERED = "the consumer stopped before an answer (requeued, or nsqd delivers it again)"
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10)


def instrument(
    *,
    tracer_provider: trace.TracerProvider | None = None,
    meter_provider: metrics.MeterProvider | None = None,
) -> None:
    """Record spans and metrics for every consumer and producer, through ``tracer_provider``
    and ``meter_provider`` (the global ones by default).  Called again while on, it logs a
    warning and changes nothing (call :func:`uninstrument` first), as OpenTelemetry's own
    instrumentors do."""
    if _telemetry.hooks.active is not None:
        log.warning("nsq_client.otel is already instrumented: call uninstrument() first")
        return
    tracer = trace.get_tracer(SCOPE, __version__, tracer_provider=tracer_provider)
    meter = metrics.get_meter(SCOPE, __version__, meter_provider=meter_provider)
    _telemetry.hooks.active = _Instrumentation(tracer, meter)


def uninstrument() -> None:
    """Stop recording: the client is as if never instrumented (spans already started end as
    usual; the observable instruments report nothing more)."""
    _telemetry.hooks.active = None


def is_instrumented() -> bool:
    return _telemetry.hooks.active is not None


def span_of(message: Message) -> Span | None:
    """The CONSUMER span of a message taken with ``async for`` while instrumented (until it is
    answered; ``with trace.use_span(span_of(message), end_on_exit=False):`` makes it the
    current span), else None."""
    return message._span if isinstance(message, _TracedMessage) else None


def _message_id(raw: bytes) -> str:
    """nsqd's ids are 16 ASCII characters; the partitioned server's are binary (hex then)."""
    return raw.decode() if raw.isascii() and raw.isalnum() else raw.hex()


def _split(address: str) -> tuple[str, int] | None:
    host, sep, port = address.rpartition(":")
    return (host, int(port)) if sep and port.isdigit() else None


class _TracedMessage(Message):
    """A message taken with ``async for`` while instrumented: its span ends with its answer,
    or when its connection closes or its consumer stops before one (answer ``none``)."""

    __slots__ = ("_answer", "_attributes", "_held", "_span", "_start", "_telemetry")

    _telemetry: _Instrumentation
    _span: Span
    _attributes: dict[str, Any]
    _start: float
    _answer: str
    #: the unanswered traced messages of its connection, itself among them
    _held: set[_TracedMessage]

    @classmethod
    def traced(
        cls,
        message: Message,
        telemetry: _Instrumentation,
        span: Span,
        attributes: dict[str, Any],
        held: set[_TracedMessage],
    ) -> _TracedMessage:
        """A copy of ``message`` whose answer ends ``span``."""
        self = cls._of(message._origin, message)
        self._telemetry = telemetry
        self._span = span
        self._attributes = attributes
        self._start = time.perf_counter()
        self._answer = "finish"
        self._held = held
        held.add(self)
        return self

    def _mark(self) -> None:
        super()._mark()
        self._end(self._answer)

    def _end(self, answer: str, unanswered: str | None = None) -> None:
        """End the span once: with the answer, or ``unanswered`` (why none can come)."""
        if self not in self._held:
            return  # ended already (its connection closed, then the application answered)
        self._held.discard(self)
        span = self._span
        span.set_attribute("nsq.message.answer", answer)
        if unanswered is not None:
            span.set_status(Status(StatusCode.ERROR, unanswered))
        span.end()
        self._telemetry.process_duration.record(time.perf_counter() - self._start, self._attributes)

    async def finish(self) -> None:
        if not self._responded:  # its span ends with the answer (finish marks it inline)
            self._end(self._answer)
        await super().finish()

    async def requeue(self, delay: float | None = None, backoff: bool = True) -> None:
        if not self._responded:
            self._answer = "requeue"
        await super().requeue(delay, backoff)


class _ConsumerSeen:
    """What the instrumentation remembers of a consumer: its connections' addresses, and
    the messages taken with ``async for`` that wait for an answer."""

    __slots__ = ("addresses", "conns", "held")

    def __init__(self) -> None:
        #: every address a connection was ready to (a new one to it is a reconnect)
        self.addresses: set[tuple[str, int]] = set()
        #: conn_id -> address, while connected
        self.conns: dict[int, tuple[str, int]] = {}
        #: conn_id -> its unanswered traced messages
        self.held: dict[int, set[_TracedMessage]] = {}


class _Instrumentation:
    """The hooks of :mod:`nsq_client._telemetry`, recording through OpenTelemetry's API."""

    def __init__(self, tracer: trace.Tracer, meter: metrics.Meter) -> None:
        self.tracer = tracer
        self._seen: weakref.WeakKeyDictionary[Consumer, _ConsumerSeen] = weakref.WeakKeyDictionary()
        #: (topic, channel) -> [finished, requeued] of the consumers that stopped, whose
        #: counts the observable counters keep (a counter never goes down when a consumer
        #: stops and is collected); those consumers are in ``_retired_consumers``
        self._retired: dict[tuple[str, str], list[int]] = {}
        self._retired_consumers: weakref.WeakSet[Consumer] = weakref.WeakSet()
        counter = meter.create_counter
        self.sent = counter(
            "messaging.client.sent.messages",
            "{message}",
            "Number of messages the producer attempted to send to nsqd",
        )
        self.consumed = counter(
            "messaging.client.consumed.messages",
            "{message}",
            "Number of messages delivered to the application",
        )
        self.operation_duration = meter.create_histogram(
            "messaging.client.operation.duration",
            "s",
            "Duration of a publish, from the call to nsqd's answer",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self.process_duration = meter.create_histogram(
            "messaging.process.duration",
            "s",
            "Duration of processing a message: the handler's call, or from `async for` to "
            "the answer",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self.given_up = counter(
            "nsq.client.messages.given_up",
            "{message}",
            "Messages delivered with more attempts than max_attempts, not handed to the "
            "application",
        )
        self.losses = counter(
            "nsq.client.connection.losses",
            "{connection}",
            "Connections to nsqd that ended with an error after they were up",
        )
        self.failures = counter(
            "nsq.client.connection.failures",
            "{connection}",
            "Connection attempts to nsqd that failed before the connection was up",
        )
        self.reconnects = counter(
            "nsq.client.reconnects",
            "{connection}",
            "Connections ready to an nsqd the consumer had been connected to before",
        )
        self.lookupd_failures = counter(
            "nsq.client.lookupd.failures", "{request}", "lookupd queries that failed"
        )
        meter.create_observable_counter(
            "nsq.client.messages.finished",
            [self._observe_finished],
            "{message}",
            "Messages finished (FIN) by the consumers of this process",
        )
        meter.create_observable_counter(
            "nsq.client.messages.requeued",
            [self._observe_requeued],
            "{message}",
            "Messages requeued (REQ) by the consumers of this process",
        )
        meter.create_observable_gauge(
            "nsq.client.connection.in_flight",
            [self._observe_in_flight],
            "{message}",
            "Messages delivered on a connection and not yet answered",
        )
        meter.create_observable_gauge(
            "nsq.client.connection.rdy",
            [self._observe_rdy],
            "{message}",
            "The RDY count of a connection",
        )
        meter.create_observable_gauge(
            "nsq.client.backoff.level",
            [self._observe_backoff],
            "{level}",
            "A consumer's backoff level (0: normal flow)",
        )

    # ------------------------------------------------------------------ publishing

    async def publish(
        self,
        producer: Producer,
        topic: str,
        bodies: Sequence[bytes],
        batch: bool,
        ext: Mapping[str, Any] | None,
        send: Callable[[Mapping[str, Any] | None], int],
    ) -> TraceReceipt | None:
        metric_attributes: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.destination.name": topic,
            "messaging.operation.name": "publish",
        }
        attributes = {**metric_attributes, "messaging.operation.type": "send"}
        if batch:
            attributes["messaging.batch.message_count"] = len(bodies)
        else:
            attributes["messaging.message.body.size"] = len(bodies[0])
        start = time.perf_counter()
        sent = False
        with self.tracer.start_as_current_span(
            f"publish {topic}", kind=SpanKind.PRODUCER, attributes=attributes
        ) as span:
            try:
                if ext is not None:
                    ext = _with_context(ext)
                elif producer._core.extended(topic):
                    # an extended topic (lookupd said so): a header of the context alone
                    ext = _with_context({}) or None
                request_id = send(ext)
                sent = True
                return await producer._wait(request_id)
            except BaseException as exc:
                metric_attributes["error.type"] = type(exc).__qualname__
                span.set_attribute("error.type", type(exc).__qualname__)
                raise
            finally:
                address = _one_address(producer)
                if address is not None:
                    span.set_attributes({"server.address": address[0], "server.port": address[1]})
                    metric_attributes["server.address"] = address[0]
                    metric_attributes["server.port"] = address[1]
                self.operation_duration.record(time.perf_counter() - start, metric_attributes)
                if sent:
                    self.sent.add(len(bodies), metric_attributes)

    # ------------------------------------------------------------------ consuming

    def _attributes(
        self, consumer: Consumer, message: Message
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """(the metrics' attributes, the span's) of a message delivered to ``consumer``."""
        metric_attributes: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.destination.name": consumer.topic,
            "messaging.consumer.group.name": consumer.channel,
            "messaging.operation.name": "process",
        }
        address = _split(message.nsqd_address)
        if address is not None:
            metric_attributes["server.address"] = address[0]
            metric_attributes["server.port"] = address[1]
        if message.partition is not None:
            metric_attributes["messaging.destination.partition.id"] = str(message.partition)
        attributes = {
            **metric_attributes,
            "messaging.operation.type": "process",
            "messaging.message.id": _message_id(message.id),
            "messaging.message.body.size": len(message.body),
            "nsq.message.attempts": message.attempts,
        }
        return metric_attributes, attributes

    def _creation(self, message: Message) -> tuple[otel_context.Context, list[Link]]:
        """The context to start a message's span in: the one its extension header carries
        (and a link to it), else an empty one (a root span)."""
        if message.ext_version == 4 and message.ext_data:
            ext = message.ext
            if ext:
                carrier = {k: v for k, v in ext.items() if isinstance(v, str)}
                parent = propagate.extract(carrier, context=otel_context.Context())
                creation = trace.get_current_span(parent).get_span_context()
                if creation.is_valid:
                    return parent, [Link(creation)]
        return otel_context.Context(), []

    async def process(self, consumer: Consumer, handler: Handler, message: Message) -> None:
        metric_attributes, attributes = self._attributes(consumer, message)
        self.consumed.add(1, _consumer_attributes(consumer))
        parent, links = self._creation(message)
        start = time.perf_counter()
        with self.tracer.start_as_current_span(
            f"process {consumer.topic}",
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes=attributes,
            links=links,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                await handler(message)
            except Exception as exc:
                error_type = type(exc).__qualname__
                span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR, f"{error_type}: {exc}"))
                span.set_attribute("error.type", error_type)
                metric_attributes["error.type"] = error_type
                raise
            finally:
                self.process_duration.record(time.perf_counter() - start, metric_attributes)

    def received(self, consumer: Consumer, message: Message) -> Message:
        metric_attributes, attributes = self._attributes(consumer, message)
        self.consumed.add(1, _consumer_attributes(consumer))
        parent, links = self._creation(message)
        span = self.tracer.start_span(
            f"process {consumer.topic}",
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes=attributes,
            links=links,
        )
        seen = self._seen.setdefault(consumer, _ConsumerSeen())
        held = seen.held.setdefault(message.conn_id, set())
        return _TracedMessage.traced(message, self, span, metric_attributes, held)

    def consumer_event(self, consumer: Consumer, event: Event) -> None:
        if isinstance(event, Ready):
            stats = consumer._core.connection_stats(event.conn_id)
            if stats is not None:
                seen = self._seen.setdefault(consumer, _ConsumerSeen())
                seen.conns[event.conn_id] = stats.address
                if stats.address in seen.addresses:
                    self.reconnects.add(1, _consumer_attributes(consumer, stats.address))
                seen.addresses.add(stats.address)
        elif isinstance(event, ConnectionClosed):
            known = self._seen.get(consumer)
            address = None if known is None else known.conns.pop(event.conn_id, None)
            if known is not None:
                for message in list(known.held.pop(event.conn_id, ())):
                    message._end("none", CLOSED_UNANSWERED)
            if event.error is not None:
                counter = self.losses if event.connected else self.failures
                counter.add(1, _consumer_attributes(consumer, address))
        elif isinstance(event, LookupFailed):
            self.lookupd_failures.add(1, _consumer_attributes(consumer, event.address))
        elif isinstance(event, MessageGivenUp):
            self.given_up.add(1, _consumer_attributes(consumer))
        elif isinstance(event, Stopped) and consumer not in self._retired_consumers:
            known = self._seen.get(consumer)
            for held in [] if known is None else list(known.held.values()):
                for message in list(held):
                    message._end("none", STOPPED_UNANSWERED)
            # its counts stop moving: kept among the retired ones from now on
            self._retired_consumers.add(consumer)
            totals = self._retired.setdefault((consumer.topic, consumer.channel), [0, 0])
            totals[0] += consumer._core.messages_finished
            totals[1] += consumer._core.messages_requeued

    # ------------------------------------------------------------------ observed

    def _consumers(self) -> Iterator[Consumer]:
        if _telemetry.hooks.active is self:  # nothing once uninstrumented
            yield from list(_telemetry.consumers)

    def _summed(self, count: Callable[[Consumer], int], retired: int) -> Iterable[Observation]:
        """Per topic and channel, ``count`` summed over the consumers running and the
        ``retired`` count of those that stopped."""
        totals = {key: counts[retired] for key, counts in self._retired.items()}
        if _telemetry.hooks.active is not self:  # nothing once uninstrumented
            return
        for consumer in self._consumers():
            if consumer in self._retired_consumers:
                continue
            key = (consumer.topic, consumer.channel)
            totals[key] = totals.get(key, 0) + count(consumer)
        for (topic, channel), total in totals.items():
            yield Observation(
                total,
                {
                    "messaging.system": SYSTEM,
                    "messaging.destination.name": topic,
                    "messaging.consumer.group.name": channel,
                },
            )

    def _observe_finished(self, options: CallbackOptions) -> Iterable[Observation]:
        return self._summed(lambda c: c._core.messages_finished, 0)

    def _observe_requeued(self, options: CallbackOptions) -> Iterable[Observation]:
        return self._summed(lambda c: c._core.messages_requeued, 1)

    def _per_connection(self, field: str) -> Iterator[Observation]:
        for consumer in self._consumers():
            for conn in consumer._core.connections():
                attributes = _consumer_attributes(consumer, conn.address)
                attributes["nsq.connection.id"] = conn.conn_id
                if conn.partition is not None:
                    attributes["messaging.destination.partition.id"] = str(conn.partition)
                yield Observation(getattr(conn, field), attributes)

    def _observe_in_flight(self, options: CallbackOptions) -> Iterable[Observation]:
        return self._per_connection("in_flight")

    def _observe_rdy(self, options: CallbackOptions) -> Iterable[Observation]:
        return self._per_connection("rdy")

    def _observe_backoff(self, options: CallbackOptions) -> Iterable[Observation]:
        for consumer in self._consumers():
            yield Observation(consumer._core.backoff_level, _consumer_attributes(consumer))


def _consumer_attributes(
    consumer: Consumer, address: tuple[str, int] | None = None
) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.destination.name": consumer.topic,
        "messaging.consumer.group.name": consumer.channel,
    }
    if address is not None:
        attributes["server.address"] = address[0]
        attributes["server.port"] = address[1]
    return attributes


def _with_context(ext: Mapping[str, Any]) -> Mapping[str, Any]:
    """``ext`` with the current context's fields (``traceparent``, ``tracestate``) added,
    none of the application's keys replaced."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    if not carrier or all(key in ext for key in carrier):
        return ext
    merged = dict(ext)
    for key, value in carrier.items():
        merged.setdefault(key, value)
    return merged


def _one_address(producer: Producer) -> tuple[str, int] | None:
    """The producer's nsqd when it has connections to one alone (else None: which one took
    a publish is not known)."""
    addresses = {conn.address for conn in producer._core.connections()}
    return addresses.pop() if len(addresses) == 1 else None
