"""``nsq_client.Consumer`` and ``nsq_client.Producer`` on a scripted backend (``scripted.py``):
the bytes they write and what they make of what nsqd sends, on the three kinds of stream
(plain, ``send_nowait``, pushed reads), on asyncio and on trio."""

from __future__ import annotations

import json
import ssl
from typing import Any

import anyio
import anyio.lowlevel
import pytest

import nsq_client
import nsq_proto
from nsq_proto import ConnectionClosedError, ServerError

from ..ticks import Ticker
from .scripted import (
    KINDS,
    Kind,
    PushScriptedStream,
    ScriptedBackend,
    ScriptedStream,
    error,
    message,
    mid,
    response,
    scripted_network,
    wait_until,
)

pytestmark = pytest.mark.anyio

ADDRESS = "nsqd1:4150"
OTHER = "nsqd2:4150"


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> Kind:
    value: Kind = request.param
    return value


def consumer(backend: ScriptedBackend, *addresses: str, **options: Any) -> nsq_client.Consumer:
    options.setdefault("max_in_flight", 1)
    return nsq_client.Consumer(
        "t", "c", backend=backend, nsqd_tcp_addresses=addresses or [ADDRESS], **options
    )


async def next_message(c: nsq_client.Consumer) -> nsq_client.Message:
    with anyio.fail_after(5):
        return await c.__anext__()


async def subscribed(backend: ScriptedBackend) -> ScriptedStream:
    """The consumer's stream to ADDRESS, once its handshake is done and RDY 1 written."""
    await wait_until(lambda: backend.connections_to(ADDRESS) == 1)
    stream = backend.stream(ADDRESS)
    await wait_until(lambda: b"RDY 1" in stream.lines())
    return stream


async def test_a_consumer_writes_identify_once_connected_then_sub_then_rdy_as_nsqd_answers(
    kind: Kind,
) -> None:
    backend = ScriptedBackend(kind)
    backend.replies = {b"CLS": response(b"CLOSE_WAIT")}  # the rest is the test's
    async with scripted_network(backend), consumer(backend):
        await wait_until(lambda: backend.connections_to(ADDRESS) == 1)
        stream = backend.stream(ADDRESS)
        await wait_until(lambda: stream.names() == [b"IDENTIFY"])
        assert stream.written[0].startswith(b"  V2IDENTIFY\n")
        identify = stream.commands[0].body
        assert identify is not None
        assert json.loads(identify)["feature_negotiation"] is True
        stream.feed(response(json.dumps({"max_rdy_count": 2500}).encode()))
        await wait_until(lambda: b"SUB t c" in stream.lines())
        assert stream.lines()[:2] == [b"IDENTIFY", b"SUB t c"]
        stream.feed(response(b"OK"))
        await wait_until(lambda: b"RDY 1" in stream.lines())
        assert stream.lines() == [b"IDENTIFY", b"SUB t c", b"RDY 1"]
    assert stream.lines()[3:] == [b"CLS"]
    assert stream.closed


async def test_a_message_read_reaches_the_application_and_its_fin_is_written(
    kind: Kind,
) -> None:
    backend = ScriptedBackend(kind)
    async with scripted_network(backend), consumer(backend) as c:
        stream = await subscribed(backend)
        stream.feed(message(mid(1), b"hello", attempts=2))
        received = await next_message(c)
        assert (received.body, received.id, received.attempts) == (b"hello", mid(1), 2)
        assert received.nsqd_address == ADDRESS
        await received.finish()
        # written from the application's task before finish() returned
        assert b"FIN " + mid(1) in stream.lines()
        if kind == "push":
            assert isinstance(stream, PushScriptedStream) and stream.pushes_started == 1


async def test_a_message_is_the_cores_message_and_equal_only_to_itself(kind: Kind) -> None:
    backend = ScriptedBackend(kind)
    given_up: list[nsq_client.Message] = []
    async with scripted_network(backend), consumer(backend, on_give_up=given_up.append) as c:
        stream = await subscribed(backend)
        stream.feed(message(mid(1), b"hello", attempts=1, timestamp=7))
        received = await next_message(c)
        # the connection built the application's class: one object, the core's fields
        assert type(received) is nsq_client.Message
        assert isinstance(received, nsq_proto.Message)
        assert received.raw is received
        assert (received.timestamp, received.trace_id, received.queue_offset) == (7, None, None)
        # equal only to itself: nsqd may deliver the same id and body again
        same_fields = nsq_client.Message._of(received._origin, received)
        assert same_fields != received and received == received
        assert len({received, same_fields}) == 2
        await received.finish()
        assert received.has_responded and not same_fields.has_responded
        # a message delivered too often: given up (FIN), and the hook sees where it came from
        stream.feed(message(mid(2), b"again", attempts=6))
        await wait_until(lambda: b"FIN " + mid(2) in stream.lines())
        (dropped,) = given_up
        assert (dropped.id, dropped.body, dropped.attempts) == (mid(2), b"again", 6)
        assert dropped.nsqd_address == ADDRESS and dropped.has_responded


def answers(stream: ScriptedStream) -> list[bytes]:
    return [line for line in stream.lines() if line.split(b" ")[0] in (b"FIN", b"REQ", b"CLS")]


async def held(
    backend: ScriptedBackend, c: nsq_client.Consumer, n: int
) -> list[nsq_client.Message]:
    """``n`` messages the application took (max_in_flight ``n``), all still held."""
    await wait_until(lambda: backend.connections_to(ADDRESS) == 1)
    stream = backend.stream(ADDRESS)
    await wait_until(lambda: b"RDY 1" in stream.lines())
    stream.feed(message(mid(1), b"1"))
    await wait_until(lambda: b"RDY %d" % n in stream.lines())  # its share, once one came
    stream.feed(b"".join(message(mid(i), b"%d" % i) for i in range(2, n + 1)))
    return [await next_message(c) for _ in range(n)]


async def test_answers_given_while_others_are_held_go_out_in_the_order_given(
    kind: Kind,
) -> None:
    """A FIN given while the connection holds more is handed to the core later, with the
    others given meanwhile: the stats count it at once, and the answers given after it (in
    a batch, a REQ) are written after it."""
    backend = ScriptedBackend(kind)
    async with scripted_network(backend), consumer(backend, max_in_flight=5) as c:
        m1, m2, m3, m4, m5 = await held(backend, c, 5)
        await m1.finish()
        stats = c.stats()
        assert stats["messages_finished"] == 1
        assert stats["connections"][0]["in_flight"] == 4
        await m2.finish()
        await c.finish_many([m3])
        await m4.finish()
        await m5.requeue(delay=0)
        stream = backend.stream(ADDRESS)
        await wait_until(lambda: len(answers(stream)) == 5)
        fins = [b"FIN " + mid(i) for i in range(1, 5)]
        assert answers(stream) == [*fins, b"REQ " + mid(5) + b" 0"]


async def test_a_fin_given_just_before_the_stop_is_written_before_cls(kind: Kind) -> None:
    backend = ScriptedBackend(kind)
    async with scripted_network(backend), consumer(backend, max_in_flight=3) as c:
        m1, m2, m3 = await held(backend, c, 3)
        await m1.finish()
        await m2.finish()
        stopping = anyio.Event()

        async def stop() -> None:
            await c.stop()
            stopping.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(stop)
            stream = backend.stream(ADDRESS)
            await wait_until(lambda: b"CLS" in stream.lines())
            assert answers(stream) == [b"FIN " + mid(1), b"FIN " + mid(2), b"CLS"]
            await m3.finish()  # the last one held: the stop ends
        assert stopping.is_set()
    assert answers(stream) == [b"FIN " + mid(1), b"FIN " + mid(2), b"CLS", b"FIN " + mid(3)]


@pytest.mark.parametrize("refused", [False, True])
async def test_answers_are_confirmed_only_if_nsqd_refused_none_before_its_close_wait(
    kind: Kind, refused: bool
) -> None:
    backend = ScriptedBackend(kind)
    async with scripted_network(backend), consumer(backend) as c:
        stream = await subscribed(backend)
        stream.feed(message(mid(1), b"hello"))
        await (await next_message(c)).finish()
        if refused:  # the message had timed out on nsqd: the FIN came too late
            stream.feed(error(b"E_FIN_FAILED FIN 0000000000000001 failed"))
            await wait_until(lambda: len(c.errors) == 1)
        assert c.answers_confirmed is False  # not stopped yet
    assert c.answers_confirmed is not refused


async def test_a_failed_write_closes_that_connection_only(kind: Kind) -> None:
    backend = ScriptedBackend(kind)
    async with scripted_network(backend), consumer(backend, ADDRESS, OTHER, max_in_flight=2) as c:
        await wait_until(
            lambda: backend.connections_to(ADDRESS) == backend.connections_to(OTHER) == 1
        )
        failing, other = backend.stream(ADDRESS), backend.stream(OTHER)
        await wait_until(lambda: b"RDY 1" in failing.lines() and b"RDY 1" in other.lines())
        failing.feed(message(mid(1), b"one"))
        first = await next_message(c)
        reset = ConnectionResetError(104, "reset by peer")
        failing.send_error = reset  # the FIN fails
        await first.finish()
        failing.feed(error(b"E_FIN_FAILED FIN failed"))  # what nsqd said before it went
        failing.end()
        await wait_until(lambda: len(c.connection_errors) == 1)
        lost = c.connection_errors[0]
        assert isinstance(lost, ConnectionClosedError)
        assert lost.__cause__ is reset
        assert [e.code for e in c.errors] == ["E_FIN_FAILED"]
        assert failing.closed
        # the other connection goes on
        other.feed(message(mid(2), b"two"))
        second = await next_message(c)
        assert (second.body, second.nsqd_address) == (b"two", OTHER)
        await second.finish()
        assert b"FIN " + mid(2) in other.lines()
        assert not other.closed


async def test_a_consumer_upgrades_to_tls_when_nsqd_agrees_and_goes_on_over_it(
    kind: Kind,
) -> None:
    backend = ScriptedBackend(kind, tls_v1=True)
    async with scripted_network(backend), consumer(backend, tls=True) as c:
        await wait_until(lambda: any(s.tls for s in backend.streams))
        plain, tls = backend.streams
        await wait_until(lambda: b"RDY 1" in tls.lines())
        assert backend.handshakes == [(ADDRESS, "nsqd1")]
        assert json.loads(plain.commands[0].body or b"")["tls_v1"] is True
        assert plain.written == [plain.written[0]]  # the magic and IDENTIFY, nothing more
        assert tls.lines() == [b"IDENTIFY", b"SUB t c", b"RDY 1"]  # (IDENTIFY: before it)
        tls.feed(message(mid(1), b"secret"))
        received = await next_message(c)
        assert received.body == b"secret"
        await received.finish()
        assert tls.lines()[-1] == b"FIN " + mid(1)
        if kind == "push":
            assert isinstance(plain, PushScriptedStream) and isinstance(tls, PushScriptedStream)
            assert not plain.pushing and tls.pushing


@pytest.mark.parametrize(
    ("failure", "permanent"),
    [
        (ssl.SSLCertVerificationError(1, "certificate verify failed"), True),
        (ssl.SSLEOFError(8, "EOF occurred in violation of protocol"), False),
    ],
    ids=["refused", "cut"],
)
async def test_a_failed_tls_handshake_closes_the_connection_with_a_transport_error(
    kind: Kind, failure: ssl.SSLError, permanent: bool
) -> None:
    backend = ScriptedBackend(kind, tls_v1=True)
    backend.tls_failure = failure
    async with scripted_network(backend), consumer(backend, tls=True) as c:
        await wait_until(lambda: len(c.connection_errors) > 0)
        lost = c.connection_errors[0]
        cause = lost.__cause__
        assert isinstance(cause, nsq_client.TransportError)
        assert cause.permanent is permanent
        assert cause.__cause__ is failure
        assert backend.stream(ADDRESS).closed


async def test_an_alert_right_after_the_tls_handshake_is_nsqd_refusing_it(kind: Kind) -> None:
    backend = ScriptedBackend(kind, tls_v1=True)
    backend.after_handshake = None
    async with scripted_network(backend), consumer(backend, tls=True) as c:
        await wait_until(lambda: any(s.tls for s in backend.streams))
        alert = ssl.SSLError(1, "[SSL: TLSV13_ALERT_CERTIFICATE_REQUIRED] alert")
        backend.stream(ADDRESS).end(alert)
        await wait_until(lambda: len(c.connection_errors) > 0)
        cause = c.connection_errors[0].__cause__
        assert isinstance(cause, nsq_client.TransportError) and cause.permanent
        assert cause.__cause__ is alert


async def test_a_publish_is_written_from_the_caller_and_returns_once_nsqd_said_ok(
    kind: Kind,
) -> None:
    backend = ScriptedBackend(kind)
    async with scripted_network(backend):
        async with nsq_client.Producer(backend=backend, nsqd_tcp_addresses=[ADDRESS]) as p:
            with anyio.fail_after(5):
                await p.publish("t", b"one")
            stream = backend.stream(ADDRESS)
            assert stream.lines() == [b"IDENTIFY", b"PUB t"]
            stream.replies[b"PUB"] = error(b"E_BAD_MESSAGE refused")
            with anyio.fail_after(5), pytest.raises(ServerError):
                await p.publish("t", b"two")
            assert [c.body for c in stream.commands[1:]] == [b"one", b"two"]
    assert stream.closed


async def test_a_handler_that_never_awaits_still_lets_the_loop_run(kind: Kind) -> None:
    """3,000 messages in one read and a handler that never awaits: the worker yields to the
    loop every CHECKPOINT_EVERY messages it takes without waiting (another task runs between
    runs of messages), and every message is handled and FINished."""
    from nsq_client._message import CHECKPOINT_EVERY

    count = 3_000
    backend = ScriptedBackend(kind)
    ticker = Ticker()

    async def handler(m: nsq_client.Message) -> None:
        ticker.mark()  # no await: the handler alone never lets the loop run

    async with scripted_network(backend), consumer(backend, max_in_flight=count) as c:
        stream = await subscribed(backend)
        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker.run)
            tg.start_soon(c.run, handler, 1)
            await anyio.lowlevel.checkpoint()
            stream.feed(b"".join(message(mid(i), b"x") for i in range(count)))
            await wait_until(lambda: len(ticker.seen_at) == count, 20)
            await wait_until(
                lambda: sum(line.startswith(b"FIN ") for line in stream.lines()) == count
            )
            tg.cancel_scope.cancel()
    runs = ticker.runs()
    assert len(runs) >= 2
    assert max(runs) <= 2 * CHECKPOINT_EVERY < count
