"""OpenTelemetry instrumentation (``nsq_client.otel``) against a real nsqd and the real
partitioned cluster, read through the SDK's in-memory span exporter and metric reader.

Runs when ``NSQD`` (and, for the trace across the partitioned server, ``NSQD_PARTITIONED``,
``NSQLOOKUPD_PARTITIONED`` and ``ETCD``) point at the binaries; skipped otherwise."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import anyio
import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import nsq_anyio
import nsq_client.otel
from tests.support.partitioned import NEEDS_CLUSTER, PartitionedCluster, partitioned_cluster
from tests.support.servers import MISSING, NSQD, Nsqd

pytestmark = [pytest.mark.real_nsqd]

NEEDS_NSQD = pytest.mark.skipif(not NSQD, reason=MISSING)


@dataclass
class Recorded:
    spans: InMemorySpanExporter
    metrics: InMemoryMetricReader
    tracer: trace.Tracer

    def finished(self, kind: SpanKind) -> list[ReadableSpan]:
        return [s for s in self.spans.get_finished_spans() if s.kind is kind]

    def points(self, name: str, topic: str | None = None) -> list[Any]:
        """The data points of metric ``name`` at a collection now (of ``topic`` alone: the
        consumers of the other tests this process ran count too)."""
        data = self.metrics.get_metrics_data()
        found: list[Any] = []
        if data is None:  # nothing recorded
            return found
        for resource in data.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name == name:
                        found.extend(
                            p
                            for p in metric.data.data_points
                            if topic is None
                            or (p.attributes or {}).get("messaging.destination.name") == topic
                        )
        return found

    def total(self, name: str, topic: str | None = None) -> int:
        return sum(p.value for p in self.points(name, topic))

    def count(self, name: str) -> int:
        """How many values histogram ``name`` recorded."""
        return sum(p.count for p in self.points(name))


@pytest.fixture
def recorded() -> Iterator[Recorded]:
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    nsq_client.otel.instrument(tracer_provider=tracer_provider, meter_provider=meter_provider)
    try:
        yield Recorded(spans, reader, tracer_provider.get_tracer("test"))
    finally:
        nsq_client.otel.uninstrument()
        meter_provider.shutdown()


@pytest.fixture(scope="module")
def nsqd() -> Iterator[Nsqd]:
    if not NSQD:
        pytest.skip(MISSING)
    server = Nsqd()
    server.start()
    yield server
    server.cleanup()


@NEEDS_NSQD
def test_publishes_and_handlers_are_spans_and_metrics_and_handlers_are_root_spans(
    nsqd: Nsqd, recorded: Recorded
) -> None:
    """Three PUBs and one MPUB of four: four PRODUCER spans; seven handler calls: seven
    CONSUMER spans, each a root span on standard nsqd (no header to carry a context), even
    with run() called inside a span; a span the handler starts is its child."""
    address = nsqd.tcp_address
    host, port = address.split(":")
    inner: dict[bytes, trace.SpanContext] = {}
    gauges: dict[str, list[Any]] = {}

    async def main() -> None:
        async with nsq_anyio.Producer(nsqd_tcp_addresses=[address]) as producer:
            for i in range(3):
                await producer.publish("otel_spans", b"single %d" % i)
            await producer.publish_many("otel_spans", [b"m%d" % i for i in range(4)])

        async def handler(message: nsq_anyio.Message) -> None:
            with recorded.tracer.start_as_current_span("work") as span:
                inner[message.body] = span.get_span_context()
            if len(inner) == 1:  # while connected, this message in flight
                for name in ("nsq.client.connection.in_flight", "nsq.client.connection.rdy"):
                    gauges[name] = recorded.points(name)
            if len(inner) == 7:
                await consumer.stop()

        async with nsq_anyio.Consumer("otel_spans", "c", nsqd_tcp_addresses=[address]) as consumer:
            with recorded.tracer.start_as_current_span("service"), anyio.fail_after(30):
                await consumer.run(handler, concurrency=4)
            assert recorded.total("nsq.client.messages.finished", "otel_spans") == 7

    anyio.run(main)
    # stopped, then collected: its counts stay in the counter (a counter never goes down)
    gc.collect()
    assert recorded.total("nsq.client.messages.finished", "otel_spans") == 7
    in_flight = gauges["nsq.client.connection.in_flight"]
    assert [(p.attributes["server.port"], p.value >= 1) for p in in_flight] == [(int(port), True)]
    assert [p.value >= 1 for p in gauges["nsq.client.connection.rdy"]] == [True]
    producers = recorded.finished(SpanKind.PRODUCER)
    assert [s.name for s in producers] == ["publish otel_spans"] * 4
    for span in producers:
        assert span.attributes is not None
        assert span.attributes["messaging.system"] == "nsq"
        assert span.attributes["messaging.destination.name"] == "otel_spans"
        assert span.attributes["messaging.operation.type"] == "send"
        assert span.attributes["messaging.operation.name"] == "publish"
        assert span.attributes["server.address"] == host
        assert span.attributes["server.port"] == int(port)
    assert [
        s.attributes and s.attributes.get("messaging.message.body.size") for s in producers
    ] == [
        8,
        8,
        8,
        None,
    ]
    assert producers[3].attributes is not None
    assert producers[3].attributes["messaging.batch.message_count"] == 4

    consumers = recorded.finished(SpanKind.CONSUMER)
    assert len(consumers) == 7
    assert {s.name for s in consumers} == {"process otel_spans"}
    for span in consumers:
        assert span.parent is None  # a root span: standard nsqd carries no context
        assert not span.links
        assert span.status.status_code is StatusCode.UNSET
        attributes = span.attributes
        assert attributes is not None
        assert attributes["messaging.consumer.group.name"] == "c"
        assert attributes["messaging.operation.type"] == "process"
        assert attributes["nsq.message.attempts"] == 1
        assert len(str(attributes["messaging.message.id"])) == 16
        assert attributes["server.address"] == host
        assert attributes["server.port"] == int(port)
    by_id = {s.context.span_id: s for s in consumers if s.context is not None}
    works = [s for s in recorded.spans.get_finished_spans() if s.name == "work"]
    assert len(works) == 7
    assert all(s.parent is not None and s.parent.span_id in by_id for s in works)
    sizes = [(s.attributes or {}).get("messaging.message.body.size") for s in consumers]
    assert sorted(sizes, key=str) == [2] * 4 + [8] * 3

    assert recorded.total("messaging.client.sent.messages") == 7
    assert recorded.count("messaging.client.operation.duration") == 4
    assert recorded.total("messaging.client.consumed.messages") == 7
    assert recorded.count("messaging.process.duration") == 7


@NEEDS_NSQD
def test_a_handler_that_raises_makes_an_error_span_and_its_retry_an_ok_one(
    nsqd: Nsqd, recorded: Recorded
) -> None:
    address = nsqd.tcp_address
    attempts: list[int] = []

    async def main() -> None:
        async with nsq_anyio.Producer(nsqd_tcp_addresses=[address]) as producer:
            await producer.publish("otel_errors", b"fails once")

        async def handler(message: nsq_anyio.Message) -> None:
            attempts.append(message.attempts)
            if message.attempts == 1:
                raise ValueError("not yet")
            await consumer.stop()

        async with nsq_anyio.Consumer(
            "otel_errors",
            "c",
            nsqd_tcp_addresses=[address],
            default_requeue_delay=0,
            backoff=False,
        ) as consumer:
            with anyio.fail_after(30):
                await consumer.run(handler)
            assert recorded.total("nsq.client.messages.requeued", "otel_errors") == 1

    anyio.run(main)
    assert attempts == [1, 2]
    failed, retried = recorded.finished(SpanKind.CONSUMER)
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.status.description == "ValueError: not yet"
    assert failed.attributes is not None and failed.attributes["error.type"] == "ValueError"
    assert [e.name for e in failed.events] == ["exception"]
    assert retried.status.status_code is StatusCode.UNSET
    assert retried.attributes is not None and retried.attributes["nsq.message.attempts"] == 2
    errors = [p.attributes.get("error.type") for p in recorded.points("messaging.process.duration")]
    assert sorted(errors, key=str) == [None, "ValueError"]


@NEEDS_NSQD
def test_a_message_taken_with_async_for_has_a_span_until_it_is_answered(
    nsqd: Nsqd, recorded: Recorded
) -> None:
    address = nsqd.tcp_address

    async def main() -> None:
        async with nsq_anyio.Producer(nsqd_tcp_addresses=[address]) as producer:
            await producer.publish_many("otel_iterate", [b"a", b"b"])
        async with nsq_anyio.Consumer(
            "otel_iterate", "c", nsqd_tcp_addresses=[address], max_in_flight=2
        ) as consumer:
            with anyio.fail_after(30):
                held = [await consumer.__anext__(), await consumer.__anext__()]
            spans = [nsq_client.otel.span_of(m) for m in held]
            assert all(span is not None and span.is_recording() for span in spans)
            assert recorded.finished(SpanKind.CONSUMER) == []
            await held[0].finish()
            await held[1].requeue(delay=0, backoff=False)
            assert [s.is_recording() for s in spans if s is not None] == [False, False]
            with anyio.fail_after(30):
                again = await consumer.__anext__()
            await again.finish()

    anyio.run(main)
    spans = recorded.finished(SpanKind.CONSUMER)
    answers = [(s.attributes or {}).get("nsq.message.answer") for s in spans]
    assert answers == ["finish", "requeue", "finish"]
    assert recorded.count("messaging.process.duration") == 3
    assert nsq_client.otel.span_of(nsq_client.Message.__new__(nsq_client.Message)) is None


@NEEDS_NSQD
def test_the_span_of_a_message_never_answered_ends_when_its_consumer_stops(
    nsqd: Nsqd, recorded: Recorded
) -> None:
    """A message taken with ``async for`` and left unanswered: its span ends (answer ``none``,
    an error status saying why) when the consumer stops, and answering it later ends nothing
    twice."""
    address = nsqd.tcp_address
    held: list[nsq_client.Message] = []

    async def main() -> None:
        async with nsq_anyio.Producer(nsqd_tcp_addresses=[address]) as producer:
            await producer.publish_many("otel_unanswered", [b"a", b"b"])
        async with nsq_anyio.Consumer(
            "otel_unanswered",
            "c",
            nsqd_tcp_addresses=[address],
            max_in_flight=2,
            stop_timeout=0.5,
        ) as consumer:
            with anyio.fail_after(30):
                held.extend([await consumer.__anext__(), await consumer.__anext__()])
            await held[0].finish()
        await held[1].finish()  # too late: its connection is gone

    anyio.run(main)
    spans = recorded.finished(SpanKind.CONSUMER)
    answers = [(s.attributes or {}).get("nsq.message.answer") for s in spans]
    assert answers == ["finish", "none"]
    assert spans[0].status.status_code is StatusCode.UNSET
    assert spans[1].status.status_code is StatusCode.ERROR
    assert "before an answer" in (spans[1].status.description or "")
    assert recorded.count("messaging.process.duration") == 2


@NEEDS_NSQD
def test_uninstrumented_nothing_is_recorded(nsqd: Nsqd, recorded: Recorded) -> None:
    nsq_client.otel.uninstrument()
    address = nsqd.tcp_address

    async def main() -> None:
        async with nsq_anyio.Producer(nsqd_tcp_addresses=[address]) as producer:
            await producer.publish("otel_off", b"x")
        async with nsq_anyio.Consumer("otel_off", "c", nsqd_tcp_addresses=[address]) as consumer:
            with anyio.fail_after(30):
                message = await consumer.__anext__()
            assert nsq_client.otel.span_of(message) is None
            await message.finish()

    anyio.run(main)
    assert recorded.spans.get_finished_spans() == ()
    assert recorded.points("messaging.client.sent.messages") == []
    assert recorded.points("nsq.client.messages.finished") == []


@pytest.fixture(scope="module")
def cluster() -> Iterator[PartitionedCluster]:
    with partitioned_cluster() as running:
        yield running


@NEEDS_CLUSTER
def test_one_trace_crosses_the_partitioned_server_in_the_json_header(
    cluster: PartitionedCluster, recorded: Recorded
) -> None:
    """publish -> nsqd -> handler: the handler's span is a child of the publish span (and
    links to it), through ``traceparent`` in the extension header, beside the application's
    keys; a key the application set itself is never replaced."""
    cluster.create_topic("otel_trace", extend="true")
    got: dict[bytes, dict[str, Any] | None] = {}

    async def main() -> None:
        async with nsq_anyio.Producer(lookupd_http_addresses=[cluster.lookupd_http]) as producer:
            with recorded.tracer.start_as_current_span("request"):
                await producer.publish("otel_trace", b"traced", partition=0, ext={"k": "v"})
            await producer.publish(
                "otel_trace", b"own key", partition=0, ext={"traceparent": "mine"}
            )
            # no header given: the topic is extended (lookupd said so), the context goes alone
            with recorded.tracer.start_as_current_span("second request"):
                await producer.publish("otel_trace", b"no header given", partition=0)

        async def handler(message: nsq_anyio.Message) -> None:
            got[message.body] = message.ext
            if len(got) == 3:
                await consumer.stop()

        async with nsq_anyio.Consumer(
            "otel_trace", "c", lookupd_http_addresses=[cluster.lookupd_http], max_in_flight=10
        ) as consumer:
            with anyio.move_on_after(60):
                await consumer.run(handler)
            # what the consumer saw, should a message not come: its lookups and connections
            assert len(got) == 3, (
                f"got {sorted(got)} in 60 s; last lookup {consumer.last_lookup}; lookup "
                f"failures {consumer.lookup_failures}; connection errors "
                f"{consumer.connection_errors}; nsqd errors {consumer.errors}; "
                f"{consumer.stats()}"
            )

    anyio.run(main)
    traced, own = got[b"traced"], got[b"own key"]
    assert traced is not None and traced["k"] == "v" and "traceparent" in traced
    assert own == {"traceparent": "mine"}
    alone = got[b"no header given"]
    assert alone is not None and set(alone) == {"traceparent"}

    request = next(s for s in recorded.spans.get_finished_spans() if s.name == "request")
    publishes = recorded.finished(SpanKind.PRODUCER)
    assert len(publishes) == 3
    publish = next(
        s for s in publishes if s.parent is not None and s.parent.span_id == request.context.span_id
    )
    assert publish.parent is not None and request.context is not None
    assert publish.parent.span_id == request.context.span_id
    assert publish.context is not None
    trace_id = publish.context.trace_id
    spans = {
        (s.attributes or {}).get("messaging.message.body.size"): s
        for s in recorded.finished(SpanKind.CONSUMER)
    }
    child, root = spans[len(b"traced")], spans[len(b"own key")]
    assert child.context is not None and child.context.trace_id == trace_id
    assert child.parent is not None and child.parent.span_id == publish.context.span_id
    assert [link.context.span_id for link in child.links] == [publish.context.span_id]
    assert child.attributes is not None
    assert child.attributes["messaging.destination.partition.id"] == "0"
    assert root.parent is None  # "mine" is no context: a root span
    second = spans[len(b"no header given")]
    assert second.parent is not None
    assert second.parent.span_id in {p.context.span_id for p in publishes if p.context}
