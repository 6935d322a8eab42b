"""The settings of ``_config.py``: what ``ConnectionConfig``, ``ConsumerConfig`` and
``ProducerConfig`` refuse, the addresses a core needs, and the IDENTIFY body they make."""

from __future__ import annotations

from typing import Any

import pytest

from nsq_proto import (
    ConfigError,
    ConnectionConfig,
    Consumer,
    ConsumerConfig,
    ExtFilter,
    LocalProtocolError,
    Producer,
    ProducerConfig,
    StartFrom,
)


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"read_timeout": 0}, "read_timeout must be a positive number of seconds, not 0"),
        ({"read_timeout": float("inf")}, "read_timeout must be a positive number"),
        ({"handshake_timeout": True}, "handshake_timeout must be a positive number"),
        ({"handshake_timeout": 0}, "handshake_timeout must be a positive number"),
        ({"handshake_timeout": float("inf")}, "handshake_timeout must be a positive number"),
        (
            {"heartbeat_interval": 30.0, "read_timeout": 30.0},
            "read_timeout must be longer than heartbeat_interval",
        ),
        ({"snappy": True, "deflate": True}, "snappy and deflate are mutually exclusive"),
        ({"deflate_level": 0}, "deflate_level must be 1..9, not 0"),
        ({"sample_rate": 100}, "sample_rate must be 0..99, not 100"),
        ({"msg_timeout": 0.5}, "msg_timeout must be at least 1 s, not 0.5"),
        ({"output_buffer_size": 63}, "output_buffer_size must be -1 or >= 64, not 63"),
        ({"output_buffer_timeout": 0.01}, "output_buffer_timeout must be 0 or 0.025..30 s"),
        ({"max_frame_size": 1023}, "max_frame_size must be at least 1024"),
        ({"desired_tag": "x" * 101}, "desired_tag is at most 100 characters"),
        ({"ext_filter": {"type": 1}}, "ext_filter must be an ExtFilter"),
    ],
)
def test_connection_config_refuses_what_nsqd_would(changes: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError) as info:
        ConnectionConfig(**changes)
    assert says in str(info.value)
    # a ConfigError is both a local protocol error and a ValueError
    assert isinstance(info.value, LocalProtocolError)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"max_in_flight": True}, "max_in_flight must be an int"),
        ({"max_in_flight": 2.0}, "max_in_flight must be an int"),
        ({"max_attempts": 65536}, "max_attempts must be 0..65535, not 65536"),
        ({"reconnect_jitter": 1.5}, "reconnect_jitter must be 0..1, not 1.5"),
        ({"stop_timeout": -1}, "stop_timeout must be a non-negative number of seconds, not -1"),
        ({"dial_timeout": 0}, "dial_timeout must be a positive number of seconds, not 0"),
        ({"partitions": (0, -1)}, "partitions must be non-negative"),
        ({"start_from": "end"}, "start_from must be a StartFrom or a mapping"),
        ({"start_from": {-1: StartFrom.end()}}, "start_from must be a StartFrom or a mapping"),
        ({"start_from": {0: "end"}}, "start_from must be a StartFrom or a mapping"),
    ],
)
def test_consumer_config_errors(changes: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError, match="^" + says.replace(".", r"\.")):
        ConsumerConfig(**changes)


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"pool_size": 0}, "pool_size must be an int >= 1, not 0"),
        ({"max_outstanding": True}, "max_outstanding must be an int >= 1, not True"),
        ({"max_publish_attempts": 1.0}, "max_publish_attempts must be an int >= 1, not 1.0"),
        ({"publish_timeout": 0}, "publish_timeout must be a positive number of seconds"),
        ({"reconnect_jitter": -0.1}, "reconnect_jitter must be 0..1"),
        ({"hasher": 5}, "hasher must be a function of the key bytes, not 5"),
    ],
)
def test_producer_config_errors(changes: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError) as info:
        ProducerConfig(**changes)
    assert str(info.value).startswith(says)


def test_cores_need_an_address_and_start_once() -> None:
    for make in (lambda: Consumer("t", "c"), lambda: Producer()):
        with pytest.raises(ConfigError, match="give nsqd_tcp_addresses or lookupd_http_addresses"):
            make()
    with pytest.raises(ConfigError, match="start_from needs lookupd_http_addresses"):
        Consumer("t", "c", ConsumerConfig(start_from=StartFrom.end()), nsqd_tcp_addresses=["h:1"])
    core = Consumer("t", "c", nsqd_tcp_addresses=["h:4150"])
    core.start(0.0)
    with pytest.raises(LocalProtocolError, match="the consumer is already started"):
        core.start(1.0)
    prod = Producer(nsqd_tcp_addresses=["h:4150"])
    prod.start(0.0)
    with pytest.raises(LocalProtocolError, match="the producer is already started"):
        prod.start(1.0)


def test_identify_carries_the_partitioned_options_in_a_stable_order() -> None:
    config = ConnectionConfig(
        client_id="me",
        hostname="box",
        heartbeat_interval=None,
        user_agent=None,
        deflate=True,
        deflate_level=3,
        msg_timeout=2.5,
        sample_rate=10,
        output_buffer_size=-1,
        output_buffer_timeout=0,
        extend_support=True,
        desired_tag="blue",
        ext_filter=ExtFilter.exact("k", "v"),
        identify_extra={"extra": 1},
    )
    assert config.identify_body() == {
        "client_id": "me",
        "hostname": "box",
        "heartbeat_interval": -1,
        "feature_negotiation": True,
        "deflate": True,
        "deflate_level": 3,
        "msg_timeout": 2500,
        "sample_rate": 10,
        "output_buffer_size": -1,
        "output_buffer_timeout": -1,
        "extend_support": True,
        "desired_tag": "blue",
        "ext_filter": {"type": 1, "filter_ext_key": "k", "filter_data": "v"},
        "extra": 1,
    }
    assert list(config.identify_body())[-1] == "extra"  # extras come after the known keys
    # no heartbeats and no read timeout: nothing ever times a quiet connection out
    assert config.effective_read_timeout is None
    assert ConnectionConfig(read_timeout=90.0).effective_read_timeout == 90.0
