"""The source's and the sink's options (``nsq_spark._options``) without a JVM: their defaults
and spellings, their errors, the read mode each belongs to, and the options' tables."""

from __future__ import annotations

from typing import Any

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable
from pyspark.sql.types import StringType, StructField, StructType

from nsq_spark import SCHEMA, NSQDataSource, OptionError
from nsq_spark._options import parse_sink_options, parse_source_options


def test_source_options_defaults_and_spellings() -> None:
    o = parse_source_options(
        {
            "topic": "t",
            "channel": "c",
            "nsqdTcpAddresses": "a:1, b:2",
            "MAX_IN_FLIGHT": "300",
            "read_mode": "driver",
        }
    )
    assert o.connection.nsqd_tcp_addresses == ("a:1", "b:2")
    assert (o.max_in_flight, o.max_messages_per_trigger, o.num_partitions) == (300, 150, 1)
    assert (o.msg_timeout, o.max_attempts) == (60.0, 0)
    kwargs = o.consumer_kwargs()
    assert kwargs["max_in_flight"] == 300 and kwargs["backoff"] is False
    assert kwargs["max_attempts"] == 0  # never give a message up: Spark decides
    o = parse_source_options(
        {
            "topic": "t",
            "channel": "c",
            "lookupd_http_addresses": "l:4161",
            "maxMessagesPerTrigger": "7",
            "compression": "snappy",
            "auth_secret": "s",
            "ordered": "true",
            "partitions": "0,2",
            "read_mode": "driver",
        }
    )
    kwargs = o.consumer_kwargs()
    assert o.max_messages_per_trigger == 7
    assert kwargs["lookupd_http_addresses"] == ["l:4161"] and kwargs["snappy"] is True
    assert kwargs["ordered"] is True and kwargs["partitions"] == (0, 2)
    assert kwargs["auth_secret"] == "s"


def test_start_from_applies_to_a_new_query_only() -> None:
    from nsq_proto import StartFrom

    base = {"topic": "t", "channel": "c", "lookupd_http_addresses": "l:4161", "read_mode": "driver"}
    o = parse_source_options({**base, "startFrom": "end"})
    assert o.consumer_kwargs(fresh=True)["start_from"] == StartFrom.end()
    assert "start_from" not in o.consumer_kwargs()  # resuming from a checkpoint
    o = parse_source_options({**base, "start_from": "0=msgcount:5, 1=timestamp:1700000000"})
    assert o.start_from == {0: StartFrom.message_count(5), 1: StartFrom.timestamp(1700000000)}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"topic": "t", "channel": "c", "lookupd_http_addresses": "l:1", "start_from": "now"},
            "start_from",
        ),
        (
            {"topic": "t", "channel": "c", "lookupd_http_addresses": "l:1", "start_from": "x=end"},
            "start_from",
        ),
        (
            {"topic": "t", "channel": "c", "nsqd_tcp_addresses": "a:1", "start_from": "end"},
            "lookupd",
        ),
        ({"channel": "c", "nsqd_tcp_addresses": "a:1"}, "topic"),
        ({"topic": "t", "nsqd_tcp_addresses": "a:1"}, "channel"),
        ({"topic": "t", "channel": "c"}, "nsqd_tcp_addresses"),
        ({"topic": "t", "channel": "c", "nsqd_tcp_addresses": "nohost"}, "host:port"),
        (
            {"topic": "t", "channel": "c", "nsqd_tcp_addresses": "a:1", "max_in_flight": "0"},
            "at least",
        ),
        (
            {"topic": "t", "channel": "c", "nsqd_tcp_addresses": "a:1", "compression": "lz4"},
            "snappy",
        ),
        (
            {"topic": "t", "channel": "c", "nsqd_tcp_addresses": "a:1", "tls": "maybe"},
            "true or false",
        ),
        (
            {"topic": "t", "channel": "c", "nsqd_tcp_addresses": "a:1", "maxInFlght": "3"},
            "maxInFlght",
        ),
        (
            {"topic": "t", "channel": "c", "nsqd_tcp_addresses": "a:1", "max_in_flight": "-5"},
            "at least 1",
        ),
        (
            {"topic": "t", "channel": "c", "nsqd_tcp_addresses": "a:1", "max_in_flight": "abc"},
            "integer",
        ),
        ({"topic": "a b", "channel": "c", "nsqd_tcp_addresses": "a:1"}, "not a topic name"),
        ({"topic": "t", "channel": "c" * 65, "nsqd_tcp_addresses": "a:1"}, "not a channel"),
        (
            {"topic": "t", "channel": "c", "nsqd_tcp_addresses": "http://127.0.0.1:4150"},
            "no scheme",
        ),
        (
            {"topic": "t", "channel": "c", "lookupd_http_addresses": "127.0.0.1:4161/lookup"},
            "no path",
        ),
        ({"topic": "t", "channel": "c", "nsqd_tcp_addresses": "a:70000"}, "host:port"),
    ],
)
def test_source_option_errors(options: dict[str, str], message: str) -> None:
    with pytest.raises(OptionError, match=message):
        parse_source_options(options)


def test_source_options_are_checked_when_spark_asks_for_the_schema() -> None:
    options = {"topic": "t", "channel": "c", "nsqd_tcp_addresses": "a:1", "read_mode": "driver"}
    assert NSQDataSource(options).schema() == SCHEMA
    with pytest.raises(OptionError, match="'channel'"):
        NSQDataSource({"topic": "t", "nsqd_tcp_addresses": "a:1"}).schema()
    # given a schema, Spark first meets the options in streamReader(): the reader it gets
    # fails the query at its first call, with the option error itself
    reader = NSQDataSource({**options, "max_in_flight": "0"}).streamReader(SCHEMA)
    with pytest.raises(OptionError, match="max_in_flight"):
        reader.initialOffset()
    with pytest.raises(OptionError, match="max_in_flight"):
        reader.latestOffset({"seq": 0}, ReadAllAvailable())
    reader.stop()
    narrow = StructType([StructField("nope", StringType())])
    with pytest.raises(ValueError, match="no column 'nope'"):
        NSQDataSource(options).streamReader(narrow).initialOffset()


def test_sink_options() -> None:
    with pytest.raises(OptionError, match=r"max_attempts \(did you mean max_publish_attempts\?\)"):
        parse_sink_options({"nsqd_tcp_addresses": "a:1", "max_attempts": "2"})
    o = parse_sink_options({"nsqd_tcp_addresses": "a:1", "max_publish_attempts": "2"})
    assert o.producer_kwargs()["max_publish_attempts"] == 2
    with pytest.raises(OptionError, match="not a topic name"):
        parse_sink_options({"nsqd_tcp_addresses": "a:1", "topic": "a b"})
    o = parse_sink_options({"nsqd_tcp_addresses": "a:1", "batchSize": "10", "deflate_level": "3"})
    assert (o.topic, o.batch_size, o.max_outstanding) == (None, 10, 8)
    assert o.producer_kwargs()["nsqd_tcp_addresses"] == ["a:1"]
    with pytest.raises(OptionError, match="publish_timeout"):
        parse_sink_options({"nsqd_tcp_addresses": "a:1", "publish_timeout": "soon"})
    # sinks that differ in topic or batching share the worker's producer
    assert (
        o.producer_key()
        == parse_sink_options(
            {"nsqd_tcp_addresses": "a:1", "topic": "other", "batch_size": "3", "deflate_level": "3"}
        ).producer_key()
    )


def test_tls_options_build_a_verifying_context(tmp_path: Any) -> None:
    import trustme

    ca = trustme.CA()
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    o = parse_source_options(
        {
            "topic": "t",
            "channel": "c",
            "nsqd_tcp_addresses": "a:1",
            "tls_ca_file": str(ca_file),
            "read_mode": "driver",
        }
    )
    context = o.connection.ssl_context()
    assert o.connection.tls and context is not None and context.check_hostname
    assert (
        parse_source_options(
            {"topic": "t", "channel": "c", "nsqd_tcp_addresses": "a:1", "read_mode": "driver"}
        ).connection.ssl_context()
        is None
    )


def test_max_bytes_in_flight_is_an_option_of_the_driver_reader() -> None:
    base = {"topic": "t", "channel": "c", "nsqd_tcp_addresses": "127.0.0.1:4150"}
    o = parse_source_options({**base, "read_mode": "driver"})
    assert (o.max_bytes_in_flight, o.max_bytes_per_trigger) == (128 << 20, 32 << 20)
    o = parse_source_options({**base, "read_mode": "driver", "max_bytes_in_flight": "1000"})
    assert (o.max_bytes_in_flight, o.max_bytes_per_trigger) == (1000, 250)
    with pytest.raises(OptionError, match="'max_bytes_in_flight' needs read_mode 'driver'"):
        parse_source_options(
            {**base, "nsqd_http_addresses": "127.0.0.1:4151", "max_bytes_in_flight": "1000"}
        )


def test_an_option_of_the_other_read_mode_is_refused_in_either_mode() -> None:
    base = {"topic": "t", "channel": "c", "nsqd_tcp_addresses": "127.0.0.1:4150"}
    executors = {**base, "nsqd_http_addresses": "127.0.0.1:4151"}
    for name, value in [
        ("staging_location", "/tmp/staged"),
        ("max_messages_per_task", "10"),
        ("max_bytes_per_task", "10"),
        ("min_partitions", "2"),
        ("task_idle_timeout", "2"),
        ("redelivery_window", "60"),
    ]:
        with pytest.raises(OptionError, match=f"^option '{name}' needs read_mode 'executors'$"):
            parse_source_options({**base, "read_mode": "driver", name: value})
        assert getattr(parse_source_options({**executors, name: value}), name) is not None
    with pytest.raises(OptionError, match=r"^option 'nsqd_http_addresses' needs read_mode 'exec"):
        parse_source_options({**executors, "read_mode": "driver"})
    for name, value in [
        ("max_in_flight", "10"),
        ("num_partitions", "2"),
        ("max_msg_timeout", "100"),
        ("available_now_idle_timeout", "1"),
    ]:
        with pytest.raises(OptionError, match=f"^option '{name}' needs read_mode 'driver'$"):
            parse_source_options({**executors, name: value})
        parse_source_options({**base, "read_mode": "driver", name: value})
    # every one of them is named, in any spelling; an empty value is no option
    with pytest.raises(
        OptionError,
        match=r"^option 'staging_location' needs read_mode 'executors'; "
        r"option 'task_idle_timeout' needs read_mode 'executors'$",
    ):
        parse_source_options(
            {**base, "readMode": "DRIVER", "stagingLocation": "/s", "TASK_IDLE_TIMEOUT": "2"}
        )
    parse_source_options({**base, "read_mode": "driver", "staging_location": ""})


def test_the_parsed_options_are_the_tables_options() -> None:
    from dataclasses import MISSING, fields

    from nsq_spark._options import (
        CONNECTION_OPTIONS,
        SINK_OPTIONS,
        SOURCE_OPTIONS,
        ConnectionOptions,
        SinkOptions,
        SourceOptions,
    )

    for cls, table in [
        (ConnectionOptions, CONNECTION_OPTIONS),
        (SourceOptions, SOURCE_OPTIONS),
        (SinkOptions, SINK_OPTIONS),
    ]:
        own = [f for f in fields(cls) if f.name != "connection"]
        assert [f.name for f in own] == [o.name for o in table], cls.__name__
        # the defaults are the table's alone
        assert all(f.default is MISSING and f.default_factory is MISSING for f in own)
    # given nothing but what it needs, each option is its table's default
    o = parse_source_options({"topic": "t", "channel": "c", "lookupd_http_addresses": "l:1"})
    for option in SOURCE_OPTIONS[3:]:
        if option.name not in ("max_bytes_per_trigger", "max_messages_per_trigger"):
            assert getattr(o, option.name) == option.default, option.name
    assert (o.max_messages_per_trigger, o.max_bytes_per_trigger) == (1_000_000, 256 << 20)
    sink = parse_sink_options({"nsqd_tcp_addresses": "a:1"})
    for option in SINK_OPTIONS:
        assert getattr(sink, option.name) == option.default, option.name
    for option in CONNECTION_OPTIONS[2:]:
        assert getattr(sink.connection, option.name) == option.default, option.name
