"""The blocking API as a web application uses it: a producer opened at start-up and closed at
shut-down (``start()``/``close()``), a consumer's errors and starvation inspected like the async
one's, and the same LocalProtocolError as the async API outside its block."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from nsq_anyio.blocking import Consumer, Producer
from nsq_proto import ConnectionClosedError, InvalidName, LocalProtocolError, NSQError
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


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_bad_publish_raises_in_its_own_thread_as_in_the_async_api(
    server: dict[str, str], backend: str
) -> None:
    with Producer(nsqd_tcp_addresses=[server["nsqd TCP"]], backend=backend) as producer:
        with pytest.raises(InvalidName):
            producer.publish("bad!topic", b"x")
        with pytest.raises(LocalProtocolError, match="non-empty bytes"):
            producer.publish("t", b"")
        with pytest.raises(LocalProtocolError, match="non-empty bytes"):
            producer.publish("t", "text")  # type: ignore[arg-type]
        producer.publish("t", b"good")  # the producer goes on


class _Mute:
    """A TCP server that accepts and reads, and never answers (an nsqd that hangs)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.held: list[socket.socket] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_threads_waiting_on_a_silent_nsqd_get_an_error_when_the_producer_closes(
    backend: str,
) -> None:
    """Publishes from 20 threads wait for an nsqd that never answers; another thread closes
    the producer: each gets an error (none hangs), within publish_timeout of the close."""
    mute = _Mute()
    try:
        producer = Producer(
            nsqd_tcp_addresses=[mute.address],
            backend=backend,
            publish_timeout=3.0,
            handshake_timeout=30.0,
        ).start()
        outcome: list[BaseException | None] = []

        def publish() -> None:
            try:
                producer.publish("t", b"x")
                outcome.append(None)
            except Exception as exc:
                outcome.append(exc)

        threads = [threading.Thread(target=publish) for _ in range(20)]
        for thread in threads:
            thread.start()
        time.sleep(0.5)
        assert outcome == []  # all waiting
        started = time.monotonic()
        producer.close()
        for thread in threads:
            thread.join(timeout=30)
        assert not any(thread.is_alive() for thread in threads)
        assert len(outcome) == 20
        assert all(isinstance(exc, NSQError) for exc in outcome), outcome
        assert time.monotonic() - started < 20
    finally:
        mute.close()
