"""``ext_filter`` (``_ext_filter.py``): the filters as IDENTIFY sends them, what they refuse,
and against the emulator: the partitioned server delivers only extended messages whose JSON
header matches; the others are finished for the whole channel."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from nsq_emulator import Cluster, MemoryNetwork
from nsq_proto import (
    ConfigError,
    ConnectionConfig,
    Consumer,
    ConsumerConfig,
    ExtFilter,
    MessageReceived,
    Producer,
    ProducerConfig,
)

# -- the filters, as IDENTIFY sends them (sans-IO) --------------------------------------------


def test_ext_filters_as_identify_sends_them() -> None:
    assert ExtFilter.regexp("a.b", "^x+$", inverse=True).to_json() == {
        "type": 2,
        "inverse": True,
        "filter_ext_key": "a.b",
        "filter_data": "^x+$",
    }
    assert ExtFilter.glob("k", "v*").to_json() == {
        "type": 3,
        "filter_ext_key": "k",
        "filter_data": "v*",
    }
    assert ExtFilter.any_of({"k1": "v1", "k2": "v2"}).to_json() == {
        "type": 4,
        "filter_ext_key": "any",
        "filter_data_list": [
            {"filter_ext_key": "k1", "filter_data": "v1"},
            {"filter_ext_key": "k2", "filter_data": "v2"},
        ],
    }
    assert ExtFilter.all_of({"k": "v"}, inverse=True).to_json() == {
        "type": 4,
        "inverse": True,
        "filter_ext_key": "all",
        "filter_data_list": [{"filter_ext_key": "k", "filter_data": "v"}],
    }


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda: ExtFilter("like", "k", "v"), "ext_filter kind must be one of"),  # type: ignore[arg-type]
        (lambda: ExtFilter.exact("k", "v", inverse=1), "ext_filter inverse must be a bool"),  # type: ignore[arg-type]
        (lambda: ExtFilter.any_of({}), "an ext_filter of kind 'any' needs at least one match"),
        (lambda: ExtFilter.all_of({"k": ""}), "an ext_filter value must be a non-empty string"),
        (lambda: ExtFilter.exact("", "v"), "an ext_filter key must be a non-empty string"),
        (lambda: ExtFilter.regexp("k", "(unclosed"), "ext_filter regexp '(unclosed' does not"),
    ],
)
def test_ext_filter_refuses_what_the_server_would_ignore(make: Any, says: str) -> None:
    with pytest.raises(ConfigError) as info:
        make()
    assert str(info.value).startswith(says)


# -- against the emulator --------------------------------------------------------------------

LOOKUPD = ["127.0.0.1:4161"]
HEADERS: list[dict[str, object] | None] = [
    {"region": "eu"},
    {"region": "us"},
    {"region": "eu-west", "tier": "gold"},
    {"region": 7},
    {"tier": "gold"},
    None,
]


def delivered(ext_filter: ExtFilter) -> tuple[list[bytes], int]:
    """Bodies a consumer with ``ext_filter`` gets of one message per header, and the depth
    left in its channel afterwards."""
    net = MemoryNetwork()
    cluster = net.add_cluster(Cluster(nodes=1))
    cluster.create_topic("events", net.now, partitions=1, ext=True)
    cluster.create_channel("events", "c", net.now)
    producer = Producer(ProducerConfig(), lookupd_http_addresses=LOOKUPD)
    net.attach(producer)
    consumer = Consumer(
        "events",
        "c",
        ConsumerConfig(max_in_flight=10, ext_filter=ext_filter),
        lookupd_http_addresses=LOOKUPD,
    )
    got: list[bytes] = []

    def on_event(event: object) -> None:
        if isinstance(event, MessageReceived):
            got.append(event.message.body)
            consumer.finish(event.conn_id, event.message.id, net.now)

    net.attach(consumer, on_event)
    net.start()
    for i, header in enumerate(HEADERS):
        producer.publish("events", b"m%d" % i, net.now, ext=header)
    net.advance(80.0)
    node = cluster.nodes[0]
    return got, node.channel_stats("events", "c", partition=0).depth


@pytest.mark.parametrize(
    ("rule", "expected"),
    [
        (ExtFilter.exact("region", "eu"), [b"m0"]),
        (ExtFilter.exact("region", "eu", inverse=True), [b"m1", b"m2", b"m3", b"m4", b"m5"]),
        (ExtFilter.regexp("region", "^eu"), [b"m0", b"m2"]),
        (ExtFilter.glob("region", "{eu,us}*"), [b"m0", b"m1", b"m2"]),
        (ExtFilter.any_of({"region": "us", "tier": "gold"}), [b"m1", b"m2", b"m4"]),
        (ExtFilter.all_of({"region": "eu-west", "tier": "gold"}), [b"m2"]),
    ],
    ids=["exact", "inverse", "regexp", "glob", "any", "all"],
)
def test_the_server_delivers_only_what_the_filter_matches(
    rule: ExtFilter, expected: list[bytes]
) -> None:
    got, depth = delivered(rule)
    assert sorted(got) == expected
    assert depth == 0  # the filtered-out messages are finished, not left for others


def test_the_filter_travels_in_identify() -> None:
    body = ConnectionConfig(ext_filter=ExtFilter.any_of({"a": "1"}, inverse=True)).identify_body()
    assert body["ext_filter"] == {
        "type": 4,
        "inverse": True,
        "filter_ext_key": "any",
        "filter_data_list": [{"filter_ext_key": "a", "filter_data": "1"}],
    }
    assert json.dumps(ExtFilter.glob("k", "a*").to_json()) == (
        '{"type": 3, "filter_ext_key": "k", "filter_data": "a*"}'
    )


@pytest.mark.parametrize(
    "make",
    [
        lambda: ExtFilter.exact("", "x"),
        lambda: ExtFilter.exact("k", ""),
        lambda: ExtFilter.regexp("k", "("),
        lambda: ExtFilter.any_of({}),
        lambda: ExtFilter.all_of({"k": ""}),
        lambda: ExtFilter("nearly", "k", "v"),  # type: ignore[arg-type]
        lambda: ConnectionConfig(ext_filter={"type": 1}),  # type: ignore[arg-type]
    ],
)
def test_a_filter_the_server_would_silently_ignore_is_refused_here(
    make: Callable[[], object],
) -> None:
    # the server logs a filter it cannot build and then delivers everything
    with pytest.raises(ConfigError):
        make()
