"""The blocking API as a web application uses it: a producer opened at start-up and closed at
shut-down (``start()``/``close()``), a consumer's errors and starvation inspected like the async
one's, and the same LocalProtocolError as the async API outside its block."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from nsq_anyio.blocking import Consumer, Producer
from nsq_proto import ConnectionClosedError, LocalProtocolError
from tests.support.served import server

__all__ = ["server"]


def test_a_long_lived_producer_starts_and_closes(server: dict[str, str]) -> None:
    nsqd = server["nsqd TCP"]
    threads_before = threading.active_count()
    producer = Producer(nsqd_tcp_addresses=[nsqd])
    assert producer.start() is producer
    try:
        with pytest.raises(LocalProtocolError, match=r"^this producer is already started"):
            producer.start()
        producer.publish("app", b"one")
        producer.publish_many("app", [b"two", b"three"])
    finally:
        producer.close()
    producer.close()  # closing twice is harmless
    assert threading.active_count() == threads_before  # its thread is gone
    with pytest.raises(LocalProtocolError, match=r"^use the producer inside its 'with' block"):
        producer.publish("app", b"late")
    with Consumer("app", "c", nsqd_tcp_addresses=[nsqd], max_in_flight=3) as consumer:
        got = []
        for message in consumer:
            got.append(message.body)
            message.finish()
            if len(got) == 3:
                break
    assert sorted(got) == [b"one", b"three", b"two"]


def test_outside_its_block_the_error_is_the_async_apis() -> None:
    producer = Producer(nsqd_tcp_addresses=["127.0.0.1:4150"])
    consumer = Consumer("t", "c", nsqd_tcp_addresses=["127.0.0.1:4150"])
    for call in (
        lambda: producer.publish("t", b"x"),
        lambda: producer.stats(),
        lambda: consumer.stats(),
        lambda: consumer.stop(),
        lambda: consumer.is_starved(),
        lambda: consumer.errors,
        lambda: next(iter(consumer)),
    ):
        with pytest.raises(LocalProtocolError, match=r"inside its 'with' block"):
            call()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def test_a_consumer_reports_its_connection_errors() -> None:
    address = f"127.0.0.1:{_closed_port()}"
    with Consumer("t", "c", nsqd_tcp_addresses=[address], reconnect_delay=0.1) as consumer:
        deadline = time.monotonic() + 20
        while not consumer.connection_errors and time.monotonic() < deadline:
            time.sleep(0.05)
        errors = consumer.connection_errors
        assert errors and all(isinstance(e, ConnectionClosedError) for e in errors)
        assert address in str(errors[0])
        assert consumer.errors == []
        assert consumer.lookup_failures == []


def test_is_starved_while_the_messages_nsqd_may_send_are_held(server: dict[str, str]) -> None:
    nsqd = server["nsqd TCP"]
    with Consumer("starved", "c", nsqd_tcp_addresses=[nsqd], max_in_flight=1) as consumer:
        assert consumer.is_starved() is False  # nothing published yet: nothing held
        with Producer(nsqd_tcp_addresses=[nsqd]) as producer:
            producer.publish("starved", b"a")
        message = next(iter(consumer))
        assert consumer.is_starved() is True  # the one message RDY allows is held
        message.finish()
        assert consumer.is_starved() is False
