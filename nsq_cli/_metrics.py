"""The worker's ``/metrics``: a ``prometheus_client`` collector reading the worker's state and
its consumer's stats at each scrape, in a registry of its own (not the global one).

Imported only when ``--http-address`` is given; it needs the ``metrics`` extra
(``prometheus_client``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from nsq_client import ConsumerStats

if TYPE_CHECKING:
    from ._worker import WorkerState

__all__ = ["COUNTERS", "CONNECTION_GAUGES", "GAUGES", "WorkerCollector", "exposition"]

_LABELS = ["topic", "channel"]
_CONNECTION_LABELS = ["topic", "channel", "nsqd"]

#: (name, help, the WorkerState attribute it reads)
COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("nsq_messages_received_total", "Messages received from nsqd.", "received"),
    ("nsq_messages_finished_total", "Messages finished (FIN): handled.", "finished"),
    ("nsq_messages_requeued_total", "Messages requeued (REQ) to be delivered again.", "requeued"),
    (
        "nsq_messages_given_up_total",
        "Messages given up after --max-attempts deliveries (finished unhandled).",
        "given_up",
    ),
)
GAUGES: tuple[tuple[str, str, str], ...] = (
    ("nsq_messages_in_flight", "Messages received and not answered yet.", "in_flight"),
    ("nsq_handlers_running", "Handlers running now.", "handling"),
    ("nsq_connections", "Connections to nsqd open (handshake or subscribed).", "connected"),
    ("nsq_connections_subscribed", "Connections to nsqd subscribed to the channel.", "subscribed"),
    ("nsq_backoff_level", "The consumer's backoff level (0: no backoff).", "backoff_level"),
)
#: 1 when /readyz answers 200
READY = ("nsq_worker_ready", "1 when the worker is ready (/readyz answers 200), else 0.")
#: (name, help, the key of a connection's stats), labelled by the nsqd's address
CONNECTION_GAUGES: tuple[tuple[str, str, str], ...] = (
    (
        "nsq_connection_in_flight",
        "Messages in flight on the connections to this nsqd.",
        "in_flight",
    ),
    ("nsq_connection_rdy", "RDY count given to this nsqd (messages it may send).", "rdy"),
)


class WorkerCollector(Collector):
    """The worker's metrics, read when scraped: ``snapshot`` refreshes the state from the
    consumer and gives its stats (None before the consumer is made); ``ready`` is the
    readiness."""

    def __init__(
        self,
        topic: str,
        channel: str,
        state: WorkerState,
        snapshot: Callable[[], ConsumerStats | None],
        ready: Callable[[], bool],
    ) -> None:
        self.labels = [topic, channel]
        self.state = state
        self.snapshot = snapshot
        self.ready = ready

    def collect(self) -> Iterator[Metric]:
        stats = self.snapshot()
        state = self.state
        for name, text, attribute in COUNTERS:
            counter = CounterMetricFamily(name, text, labels=_LABELS)
            counter.add_metric(self.labels, getattr(state, attribute))
            yield counter
        for name, text, attribute in GAUGES:
            gauge = GaugeMetricFamily(name, text, labels=_LABELS)
            gauge.add_metric(self.labels, getattr(state, attribute))
            yield gauge
        ready = GaugeMetricFamily(READY[0], READY[1], labels=_LABELS)
        ready.add_metric(self.labels, 1 if self.ready() else 0)
        yield ready
        # by nsqd: a partitioned nsqd's connections (one per partition) are summed
        per_nsqd: dict[str, dict[str, int]] = {}
        for connection in stats["connections"] if stats is not None else []:
            if connection["state"] in ("INIT", "CLOSED"):
                continue
            sums = per_nsqd.setdefault(connection["address"], {"in_flight": 0, "rdy": 0})
            sums["in_flight"] += connection["in_flight"]
            sums["rdy"] += connection["rdy"]
        for name, text, key in CONNECTION_GAUGES:
            gauge = GaugeMetricFamily(name, text, labels=_CONNECTION_LABELS)
            for address, sums in sorted(per_nsqd.items()):
                gauge.add_metric([*self.labels, address], sums[key])
            yield gauge


def exposition(collector: Collector) -> Callable[[str], tuple[bytes, str]]:
    """The collector in a registry of its own: a function of a request's Accept header that
    gives the exposition's body and content type (the text format, or OpenMetrics when
    asked for)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)

    def render(accept: str) -> tuple[bytes, str]:
        encoder, content_type = choose_encoder(accept)
        return encoder(registry), content_type

    return render
