"""Mistakes a user makes with addresses get one clear error, early: a bad address when the core
is made, a refused connection as the refusal (not a publish timeout), nsqd's HTTP port as what
it is."""

from __future__ import annotations

import pytest

from nsq_proto import (
    ConfigError,
    Connect,
    ConnectionClosed,
    ConnectionClosedError,
    ConnectionConfig,
    HttpRequest,
    PublishFailed,
    PublishSucceeded,
    RemoteProtocolError,
)
from nsq_proto import Consumer as ConsumerCore
from nsq_proto._producer import Producer, ProducerConfig

from .helpers import identify_response, response

HTTP_ANSWER = (
    b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b"Connection: close\r\n\r\n400 Bad Request"
)


@pytest.mark.parametrize(
    ("address", "message"),
    [
        ("http://127.0.0.1:4150", "'http://127.0.0.1:4150' is not host:port (no scheme, no path)"),
        ("tcp://127.0.0.1:4150", "'tcp://127.0.0.1:4150' is not host:port (no scheme"),
        ("127.0.0.1:4150/", "'127.0.0.1:4150/' is not host:port (no scheme, no path)"),
        ("127.0.0.1", "'127.0.0.1' is not host:port (it needs a port number)"),
        ("127.0.0.1:", "'127.0.0.1:' is not host:port (it needs a port number)"),
        (":4150", "':4150' is not host:port (it needs a host)"),
        ("127.0.0.1:70000", "'127.0.0.1:70000' is not host:port (the port must be 1..65535)"),
        ("127.0.0.1:0", "'127.0.0.1:0' is not host:port (the port must be 1..65535)"),
        (4150, '4150 is not a "host:port" string'),
    ],
)
def test_a_bad_nsqd_address_is_refused_when_the_core_is_made(address: str, message: str) -> None:
    for make in (
        lambda: Producer(nsqd_tcp_addresses=[address]),
        lambda: ConsumerCore("t", "c", nsqd_tcp_addresses=[address]),
    ):
        with pytest.raises(ConfigError) as info:
            make()
        assert str(info.value).startswith("nsqd_tcp_addresses: address ")
        assert message in str(info.value)


@pytest.mark.parametrize("name", ["nsqd_tcp_addresses", "lookupd_http_addresses"])
def test_a_string_given_for_a_list_is_refused(name: str) -> None:
    with pytest.raises(ConfigError) as info:
        Producer(**{name: "127.0.0.1:4150"})  # type: ignore[arg-type]
    assert str(info.value) == (
        f"{name} must be a list of \"host:port\" strings, not the string '127.0.0.1:4150' "
        "(write ['127.0.0.1:4150'])"
    )
    with pytest.raises(ConfigError, match=f"^{name} must be a list"):
        ConsumerCore("t", "c", **{name: "127.0.0.1:4150"})  # type: ignore[arg-type]


def test_lookupd_takes_host_port_or_http_host_port() -> None:
    for address in ("127.0.0.1:4161", "http://127.0.0.1:4161", "HTTP://127.0.0.1:4161/"):
        core = ConsumerCore("t", "c", lookupd_http_addresses=[address])
        core.start(0.0)
        (request,) = [o for o in core.outputs() if isinstance(o, HttpRequest)]
        assert (request.host, request.port) == ("127.0.0.1", 4161)
        assert b"\r\nHost: 127.0.0.1:4161\r\n" in request.data
    for address, message in [
        ("https://127.0.0.1:4161", "is not host:port or http://host:port (no other scheme"),
        ("127.0.0.1:4161/lookup", "is not host:port or http://host:port (no other scheme, no path"),
        ("http://127.0.0.1", "'http://127.0.0.1' is not host:port (it needs a port number)"),
        ("127.0.0.1:99999", "the port must be 1..65535"),
    ]:
        with pytest.raises(ConfigError, match=r"^lookupd_http_addresses: address ") as info:
            ConsumerCore("t", "c", lookupd_http_addresses=[address])
        assert message in str(info.value)


def _refuse(core: Producer, conn_id: int, now: float) -> None:
    error = OSError(f"[Errno 111] Connection refused (connection {conn_id})")
    core.connection_lost(conn_id, now, error)


def test_a_publish_fails_with_the_refusal_once_every_nsqd_refused() -> None:
    core = Producer(ProducerConfig(publish_timeout=30.0), nsqd_tcp_addresses=["n1:4150", "n2:4150"])
    core.start(0.0)
    conns = [o.conn_id for o in core.outputs() if isinstance(o, Connect)]
    rid = core.publish("t", b"x", 0.0)
    _refuse(core, conns[0], 0.1)
    assert not [o for o in core.outputs() if isinstance(o, PublishFailed)]  # n2 may answer
    _refuse(core, conns[1], 0.2)
    (failed,) = [o for o in core.outputs() if isinstance(o, PublishFailed)]
    assert failed.request_id == rid
    assert isinstance(failed.error, ConnectionClosedError)
    text = str(failed.error)
    assert text.startswith("could not connect to any nsqd: ")
    assert "n1:4150: [Errno 111] Connection refused" in text
    assert "n2:4150: [Errno 111] Connection refused" in text
    # a publish made while no nsqd can be reached fails at once too, with the same cause
    core.publish("t", b"y", 0.5)
    (failed,) = [o for o in core.outputs() if isinstance(o, PublishFailed)]
    assert str(failed.error).startswith("could not connect to any nsqd: ")


def test_a_publish_waits_for_a_reconnect_under_way_and_goes_out_when_it_succeeds() -> None:
    core = Producer(
        ProducerConfig(publish_timeout=30.0, reconnect_delay=1.0, reconnect_jitter=0.0),
        nsqd_tcp_addresses=["n1:4150"],
    )
    core.start(0.0)
    (connect,) = [o for o in core.outputs() if isinstance(o, Connect)]
    _refuse(core, connect.conn_id, 0.1)
    core.outputs()
    core.handle_timer(1.1)  # the reconnect is under way ...
    (connect,) = [o for o in core.outputs() if isinstance(o, Connect)]
    rid = core.publish("t", b"x", 1.2)  # ... so this publish waits for it
    assert not [o for o in core.outputs() if isinstance(o, PublishFailed)]
    core.connection_made(connect.conn_id, 1.3)
    core.receive_data(connect.conn_id, identify_response(), 1.3)
    core.outputs()
    core.receive_data(connect.conn_id, response(b"OK"), 1.4)
    (done,) = [o for o in core.outputs() if isinstance(o, PublishSucceeded)]
    assert done.request_id == rid


def test_a_publish_fails_over_while_one_nsqd_refuses() -> None:
    core = Producer(nsqd_tcp_addresses=["n1:4150", "n2:4150"])
    core.start(0.0)
    conns = [o.conn_id for o in core.outputs() if isinstance(o, Connect)]
    _refuse(core, conns[0], 0.1)
    core.connection_made(conns[1], 0.1)
    core.receive_data(conns[1], identify_response(), 0.1)
    core.outputs()
    rid = core.publish("t", b"x", 0.2)
    outputs = core.outputs()
    assert not [o for o in outputs if isinstance(o, PublishFailed)]
    core.receive_data(conns[1], response(b"OK"), 0.3)
    (done,) = [o for o in core.outputs() if isinstance(o, PublishSucceeded)]
    assert done.request_id == rid


EXPECTED_HTTP = "n1:4151 answered with HTTP: is this nsqd's HTTP port rather than its TCP port?"


@pytest.mark.parametrize("chunk", [1, 3, 4, 8, len(HTTP_ANSWER)])
def test_nsqd_http_port_is_recognised(chunk: int) -> None:
    core = Producer(nsqd_tcp_addresses=["n1:4151"])
    core.start(0.0)
    (connect,) = [o for o in core.outputs() if isinstance(o, Connect)]
    rid = core.publish("t", b"x", 0.0)
    core.connection_made(connect.conn_id, 0.1)
    for i in range(0, len(HTTP_ANSWER), chunk):
        core.receive_data(connect.conn_id, HTTP_ANSWER[i : i + chunk], 0.1)
    outputs = core.outputs()
    (closed,) = [o for o in outputs if isinstance(o, ConnectionClosed)]
    assert isinstance(closed.error, RemoteProtocolError)
    assert str(closed.error) == EXPECTED_HTTP
    # the publish fails with it at once (retrying cannot help), not at publish_timeout
    (failed,) = [o for o in outputs if isinstance(o, PublishFailed)]
    assert failed.request_id == rid
    assert str(failed.error) == EXPECTED_HTTP


def test_a_connection_without_its_address_names_nsqd() -> None:
    from nsq_proto import Connection

    conn = Connection(ConnectionConfig())
    conn.connection_made(0.0)
    with pytest.raises(RemoteProtocolError, match=r"^nsqd answered with HTTP: is this nsqd's"):
        conn.receive_data(HTTP_ANSWER, 0.0)


def test_a_consumer_names_the_http_port_too() -> None:
    core = ConsumerCore("t", "c", nsqd_tcp_addresses=["n1:4151"])
    core.start(0.0)
    (connect,) = [o for o in core.outputs() if isinstance(o, Connect)]
    core.connection_made(connect.conn_id, 0.1)
    core.receive_data(connect.conn_id, HTTP_ANSWER, 0.1)
    (closed,) = [o for o in core.outputs() if isinstance(o, ConnectionClosed)]
    assert str(closed.error) == EXPECTED_HTTP


def test_what_is_not_a_list_of_addresses_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"^nsqd_tcp_addresses must be a list of .* not None$"):
        Producer(nsqd_tcp_addresses=None)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"is not a \(host, port\) pair$"):
        Producer(nsqd_tcp_addresses=[("http://n1", 4150)])
