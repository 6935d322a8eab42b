"""The runner (``nsq_client.CoreRunner``) carries out a core's outputs on a backend: here
the core is scripted (the test queues its outputs) and so is the network (``scripted.py``),
and every test runs on the three kinds of stream (plain, ``send_nowait``, pushed reads) on
asyncio and on trio."""

from __future__ import annotations

import gc
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest

import nsq_client
from nsq_proto import Close, Connect, Event, HeartbeatReceived, HttpRequest, Send, StartTLS

from .scripted import (
    KINDS,
    Kind,
    PushScriptedStream,
    ScriptedBackend,
    ScriptedCore,
    as_core,
    backend_protocol,
    scripted_network,
    wait_until,
)

pytestmark = pytest.mark.anyio

HOST, PORT = "nsqd1", 4150
ADDRESS = f"{HOST}:{PORT}"


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> Kind:
    value: Kind = request.param
    return value


class Harness:
    def __init__(
        self, backend: ScriptedBackend, core: ScriptedCore, runner: nsq_client.CoreRunner
    ) -> None:
        self.backend = backend
        self.core = core
        self.runner = runner
        self.events: list[Event] = []

    def after(self, entry: tuple[str, str, bytes]) -> list[tuple[str, str, bytes]]:
        """The log from ``entry`` on (itself excluded)."""
        log = self.backend.log
        return log[log.index(entry) + 1 :]

    def queue(self, *outputs: Any) -> None:
        """The core has these outputs now; the pump task carries them out."""
        self.core.queue(*outputs)
        self.runner.wake()

    async def connected(self, conn_id: int = 1, host: str = HOST) -> None:
        self.queue(Connect(conn_id, host, PORT, 5.0))
        entry = ("connection_made", str(conn_id), b"")
        await wait_until(lambda: entry in self.backend.log)


@asynccontextmanager
async def running(kind: Kind, **options: Any) -> AsyncIterator[Harness]:
    """A runner of a scripted core on a scripted network, its pump running in the block."""
    backend = ScriptedBackend(kind)
    core = ScriptedCore(backend)

    def on_event(event: Event) -> None:
        harness.events.append(event)
        backend.log.append(("event", type(event).__name__, b""))

    runner = nsq_client.CoreRunner(backend_protocol(backend), as_core(core), on_event, **options)
    harness = Harness(backend, core, runner)
    async with scripted_network(backend):
        async with anyio.create_task_group() as tg:
            runner.start(tg)
            yield harness
            tg.cancel_scope.cancel()
        with anyio.CancelScope(shield=True):
            await runner.aclose()


async def test_a_connection_is_opened_and_reported_made_then_its_reads_are_fed_to_the_core(
    kind: Kind,
) -> None:
    async with running(kind) as h:
        await h.connected()
        assert h.backend.log[:2] == [("connect", ADDRESS, b""), ("connection_made", "1", b"")]
        stream = h.backend.stream(ADDRESS)
        stream.feed(b"first")
        stream.feed(b"second")
        await wait_until(lambda: ("receive_data", "1", b"second") in h.backend.log)
        assert h.after(("connection_made", "1", b"")) == [
            ("receive_data", "1", b"first"),
            ("receive_data", "1", b"second"),
        ]
        if kind == "push":
            assert isinstance(stream, PushScriptedStream)
            assert stream.pushing  # handed over by the stream, no read in a task


async def test_the_outputs_are_carried_out_in_the_order_the_core_gave_them(kind: Kind) -> None:
    """Bytes and the close go out in the core's order; so do the events between them where
    the stream takes bytes without waiting.  On a plain stream the pump hands a write to a
    task of its own and goes on (it never waits on a peer): the event comes first, and the
    bytes queued meanwhile go out with the write."""
    async with running(kind) as h:
        await h.connected()
        h.queue(Send(1, b"one"), HeartbeatReceived(1), Send(1, b"two"), Close(1, "done"))
        await wait_until(lambda: h.backend.stream(ADDRESS).closed)
        done = h.after(("connection_made", "1", b""))
        if kind == "plain":
            assert done == [
                ("event", "HeartbeatReceived", b""),
                ("send", ADDRESS, b"onetwo"),
                ("close", ADDRESS, b""),
            ]
        else:
            assert done == [
                ("send", ADDRESS, b"one"),
                ("event", "HeartbeatReceived", b""),
                ("send", ADDRESS, b"two"),
                ("close", ADDRESS, b""),
            ]
        assert "1" not in [c for what, c, _ in h.backend.log if what == "connection_lost"]


async def test_the_outputs_of_a_read_are_carried_out_in_order_whichever_way_it_was_read(
    kind: Kind,
) -> None:
    async with running(kind) as h:
        await h.connected()

        def answer(conn_id: int, data: bytes) -> None:
            h.core.queue(Send(conn_id, b"pong"), HeartbeatReceived(conn_id), Send(conn_id, b"!"))
            h.core.queue(Close(conn_id, "bye"))

        h.core.on_receive = answer
        h.backend.stream(ADDRESS).feed(b"ping")
        await wait_until(lambda: h.backend.stream(ADDRESS).closed)
        assert h.after(("receive_data", "1", b"ping")) == [
            ("send", ADDRESS, b"pong"),
            ("event", "HeartbeatReceived", b""),
            ("send", ADDRESS, b"!"),
            ("close", ADDRESS, b""),
        ]


async def test_a_drain_in_another_task_waits_until_its_bytes_queued_behind_a_write_are_written(
    kind: Kind,
) -> None:
    async with running(kind) as h:
        await h.connected()
        stream = h.backend.stream(ADDRESS)
        stream.room = False  # send_nowait refuses: the write waits (in the pump task)
        stream.send_gate = gate = anyio.Event()
        h.queue(Send(1, b"first"))
        await wait_until(lambda: stream.sends_started == 1)
        drained = anyio.Event()

        async def drain() -> None:
            h.core.queue(Send(1, b"second"), Send(1, b"third"))
            await h.runner.drain_here()
            drained.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(drain)
            await anyio.sleep(0.05)
            assert not drained.is_set()
            assert stream.written == []
            gate.set()
            await drained.wait()
            # written behind it, in order, by the time the drain returned
            assert stream.written[0] == b"first"
            assert b"".join(stream.written) == b"firstsecondthird"


async def test_a_close_waits_for_the_write_under_way(kind: Kind) -> None:
    async with running(kind) as h:
        await h.connected()
        stream = h.backend.stream(ADDRESS)
        stream.room = False
        stream.send_gate = gate = anyio.Event()
        h.queue(Send(1, b"last words"))
        await wait_until(lambda: stream.sends_started == 1)
        async with anyio.create_task_group() as tg:
            h.core.queue(Close(1, "done"))
            tg.start_soon(h.runner.drain_here)
            await anyio.sleep(0.05)
            assert not stream.closed
            gate.set()
        await wait_until(lambda: stream.closed)
        assert h.after(("connection_made", "1", b"")) == [
            ("send", ADDRESS, b"last words"),
            ("close", ADDRESS, b""),
        ]


async def test_a_close_of_a_peer_judged_dead_aborts_at_once_without_waiting_for_the_write(
    kind: Kind,
) -> None:
    """The core judged nsqd dead (``Close(abort=True)``: nothing received in time) while a
    write waits on it: the stream is aborted at once, the write fails, nothing waits on the
    peer."""
    async with running(kind, write_timeout=30.0) as h:
        await h.connected()
        stream = h.backend.stream(ADDRESS)
        stream.room = False
        stream.send_gate = anyio.Event()  # never set by the test: the peer reads nothing
        h.queue(Send(1, b"stuck"))
        await wait_until(lambda: stream.sends_started == 1)
        h.queue(Close(1, "read timeout", abort=True))
        with anyio.fail_after(2.0):  # not the write timeout
            await wait_until(lambda: ("abort", ADDRESS, b"") in h.backend.log)
        assert ("close", ADDRESS, b"") not in h.backend.log
        assert stream.written == []  # dropped, not written late


async def test_a_write_timeout_aborts_its_connection(kind: Kind) -> None:
    async with running(kind, write_timeout=0.1) as h:
        await h.connected()
        stream = h.backend.stream(ADDRESS)
        stream.room = False
        stream.send_gate = anyio.Event()
        h.queue(Send(1, b"stuck"))
        await wait_until(lambda: 1 in h.core.lost)
        assert ("abort", ADDRESS, b"") in h.backend.log


async def test_bytes_before_a_start_tls_go_out_before_the_handshake_and_those_after_on_tls(
    kind: Kind,
) -> None:
    async with running(kind, tls_hostname="nsqd.example") as h:
        h.backend.after_handshake = None
        await h.connected()
        plain = h.backend.stream(ADDRESS)
        h.queue(Send(1, b"before"), StartTLS(1), Send(1, b"during"))
        await wait_until(lambda: ("send", ADDRESS, b"during") in h.backend.log)
        assert h.after(("connection_made", "1", b"")) == [
            ("send", ADDRESS, b"before"),
            ("start_tls", ADDRESS, b""),
            ("tls_established", "1", b""),
            ("send", ADDRESS, b"during"),
        ]
        tls = h.backend.stream(ADDRESS)
        assert tls.tls
        assert (plain.written, tls.written) == ([b"before"], [b"during"])
        assert h.backend.handshakes == [(ADDRESS, "nsqd.example")]
        # reads now come from the TLS stream
        tls.feed(b"secret")
        await wait_until(lambda: ("receive_data", "1", b"secret") in h.backend.log)
        if kind == "push":
            assert isinstance(plain, PushScriptedStream) and isinstance(tls, PushScriptedStream)
            assert not plain.pushing and tls.pushing


async def test_what_arrives_after_the_read_that_asked_for_tls_is_left_to_the_handshake(
    kind: Kind,
) -> None:
    async with running(kind) as h:
        h.backend.after_handshake = None
        await h.connected()

        def answer(conn_id: int, data: bytes) -> None:
            if data == b"tls please":
                h.core.queue(StartTLS(conn_id))

        h.core.on_receive = answer
        plain = h.backend.stream(ADDRESS)
        plain.feed(b"tls please")
        plain.feed(b"ServerHello")  # at once: before the connection's task runs again
        await wait_until(lambda: ("tls_established", "1", b"") in h.backend.log)
        h.backend.stream(ADDRESS).feed(b"over tls")
        await wait_until(lambda: ("receive_data", "1", b"over tls") in h.backend.log)
        fed = [data for what, _, data in h.backend.log if what == "receive_data"]
        assert fed == [b"tls please", b"over tls"]


async def test_the_handshake_checks_the_connected_host_unless_a_tls_hostname_is_given(
    kind: Kind,
) -> None:
    async with running(kind) as h:
        await h.connected()
        h.queue(StartTLS(1))
        await wait_until(lambda: ("tls_established", "1", b"") in h.backend.log)
        assert h.backend.handshakes == [(ADDRESS, HOST)]


async def test_bytes_that_came_with_the_start_tls_close_the_connection(kind: Kind) -> None:
    async with running(kind) as h:
        await h.connected()
        h.queue(StartTLS(1, b"\x16\x03"))
        await wait_until(lambda: 1 in h.core.lost)
        error = h.core.lost[1]
        assert isinstance(error, nsq_client.TransportError)
        assert str(error) == "data arrived before the TLS handshake"
        assert h.backend.handshakes == []
        # and the connection is closed, not left open and read until the peer closes it
        await wait_until(lambda: h.backend.stream(ADDRESS).closed)


async def test_a_refused_handshake_is_a_permanent_transport_error(kind: Kind) -> None:
    async with running(kind) as h:
        await h.connected()
        refusal = ssl.SSLCertVerificationError(1, "certificate verify failed")
        h.backend.tls_failure = refusal
        h.queue(StartTLS(1))
        await wait_until(lambda: 1 in h.core.lost)
        error = h.core.lost[1]
        assert isinstance(error, nsq_client.TransportError)
        assert error.permanent
        assert str(error).startswith(f"TLS handshake with {ADDRESS} failed: ")
        assert error.__cause__ is refusal
        assert h.backend.stream(ADDRESS).closed


async def test_a_handshake_cut_by_the_network_is_a_transport_error_worth_retrying(
    kind: Kind,
) -> None:
    async with running(kind) as h:
        await h.connected()
        cut = ssl.SSLEOFError(8, "EOF occurred in violation of protocol")
        h.backend.tls_failure = cut
        h.queue(StartTLS(1))
        await wait_until(lambda: 1 in h.core.lost)
        error = h.core.lost[1]
        assert isinstance(error, nsq_client.TransportError)
        assert not error.permanent
        assert error.__cause__ is cut


async def test_an_alert_on_the_first_read_after_the_handshake_is_a_refusal(kind: Kind) -> None:
    """TLS 1.3: nsqd refuses a client certificate only after the client's side of the
    handshake is done, so the refusal comes as the first read's error (read in a task, or
    handed over by a pushing stream)."""
    async with running(kind) as h:
        h.backend.after_handshake = None
        await h.connected()
        h.queue(StartTLS(1))
        await wait_until(lambda: ("tls_established", "1", b"") in h.backend.log)
        alert = ssl.SSLError(1, "[SSL: TLSV13_ALERT_CERTIFICATE_REQUIRED] alert")
        h.backend.stream(ADDRESS).end(alert)
        await wait_until(lambda: 1 in h.core.lost)
        error = h.core.lost[1]
        assert isinstance(error, nsq_client.TransportError)
        assert error.permanent
        assert error.__cause__ is alert


async def test_the_same_alert_after_a_read_is_only_the_connection_failing(kind: Kind) -> None:
    async with running(kind) as h:
        h.backend.after_handshake = None
        await h.connected()
        h.queue(StartTLS(1))
        await wait_until(lambda: ("tls_established", "1", b"") in h.backend.log)
        tls = h.backend.stream(ADDRESS)
        tls.feed(b"OK")
        await wait_until(lambda: ("receive_data", "1", b"OK") in h.backend.log)
        alert = ssl.SSLError(1, "[SSL: SSLV3_ALERT_BAD_RECORD_MAC] alert")
        tls.end(alert)
        await wait_until(lambda: 1 in h.core.lost)
        assert h.core.lost[1] is alert


async def test_a_failed_write_is_reported_once_the_peer_s_last_words_are_read(
    kind: Kind,
) -> None:
    async with running(kind) as h:
        await h.connected(1)
        await h.connected(2, host="nsqd2")
        failing = h.backend.stream(ADDRESS)
        other = h.backend.stream(f"nsqd2:{PORT}")
        reset = ConnectionResetError(104, "reset by peer")
        failing.send_error = reset
        h.queue(Send(1, b"FIN x"), Send(2, b"FIN y"))
        await wait_until(lambda: other.written == [b"FIN y"])
        assert 1 not in h.core.lost  # nsqd's error frame may be on its way
        failing.feed(b"E_FIN_FAILED")
        failing.end()
        await wait_until(lambda: 1 in h.core.lost)
        assert h.core.lost[1] is reset
        assert ("receive_data", "1", b"E_FIN_FAILED") in h.backend.log
        assert failing.closed
        # the other connection goes on
        h.queue(Send(1, b"dropped"), Send(2, b"RDY 1"))
        await wait_until(lambda: other.written == [b"FIN y", b"RDY 1"])
        assert failing.written == [] and 2 not in h.core.lost and not other.closed


async def test_a_stream_error_without_words_is_reported_with_its_cause_s(kind: Kind) -> None:
    """anyio on trio reads a reset as a ``BrokenResourceError`` with no message, the reset
    being its cause: the connection is reported lost with the cause's words (the user reads
    "Connection reset by peer", not nothing)."""
    async with running(kind) as h:
        await h.connected()
        broken = OSError()  # as anyio's BrokenResourceError on trio
        broken.__cause__ = ConnectionResetError(104, "Connection reset by peer")
        h.backend.stream(ADDRESS).end(OSError())  # no words at all: its type says it
        await wait_until(lambda: 1 in h.core.lost)
        assert str(h.core.lost[1]) == "OSError"
        await h.connected(2)
        h.backend.stream(ADDRESS).end(broken)
        await wait_until(lambda: 2 in h.core.lost)
        error = h.core.lost[2]
        assert isinstance(error, nsq_client.TransportError) and error.__cause__ is broken
        assert str(error) == "[Errno 104] Connection reset by peer"


async def test_a_write_slower_than_the_write_timeout_closes_its_connection(kind: Kind) -> None:
    async with running(kind, write_timeout=0.1) as h:
        await h.connected()
        stream = h.backend.stream(ADDRESS)
        stream.room = False
        stream.send_gate = anyio.Event()  # never set: the peer reads nothing
        h.queue(Send(1, b"stuck"))
        await wait_until(lambda: 1 in h.core.lost)
        error = h.core.lost[1]
        assert isinstance(error, nsq_client.TransportError)
        assert str(error) == f"writing to {ADDRESS} took over 0.1 s"
        assert stream.closed


async def test_a_refused_connection_is_reported_lost_with_the_reason(kind: Kind) -> None:
    async with running(kind) as h:
        h.backend.refused.add(ADDRESS)
        h.queue(Connect(1, HOST, PORT, 5.0))
        await wait_until(lambda: 1 in h.core.lost)
        error = h.core.lost[1]
        assert isinstance(error, nsq_client.TransportError)
        assert str(error) == f"connecting to {ADDRESS} failed: connection refused"
        assert isinstance(error.__cause__, ConnectionRefusedError)
        assert ("connection_made", "1", b"") not in h.backend.log


async def test_an_http_request_is_sent_and_its_response_fed_to_the_core_to_its_end(
    kind: Kind,
) -> None:
    async with running(kind) as h:
        h.queue(HttpRequest(7, "lookupd", 4161, b"GET /lookup?topic=t HTTP/1.1\r\n\r\n", 5.0))
        await wait_until(lambda: h.backend.connections_to("lookupd:4161") == 1)
        stream = h.backend.stream("lookupd:4161")
        await wait_until(lambda: stream.written != [])
        assert stream.written == [b"GET /lookup?topic=t HTTP/1.1\r\n\r\n"]
        stream.feed(b"HTTP/1.1 200 OK\r\n\r\n")
        stream.feed(b"{}")
        stream.end()
        await wait_until(lambda: h.core.http.get(7, [])[-1:] == [b""])
        assert h.core.http[7] == [b"HTTP/1.1 200 OK\r\n\r\n", b"{}", b""]
        await wait_until(lambda: stream.closed)


async def test_a_refused_http_request_fails_with_a_connection_refused_error(kind: Kind) -> None:
    async with running(kind) as h:
        h.backend.refused.add("lookupd:4161")
        h.queue(HttpRequest(7, "lookupd", 4161, b"GET / HTTP/1.1\r\n\r\n", 5.0))
        await wait_until(lambda: 7 in h.core.http_errors)
        error = h.core.http_errors[7]
        assert type(error) is ConnectionRefusedError
        assert str(error) == "connection refused"


async def test_the_pump_calls_the_core_s_timer_once_its_deadline_has_come(kind: Kind) -> None:
    async with running(kind) as h:
        await wait_until(lambda: h.core.timer_calls != [])
        deadline = anyio.current_time() + 0.05
        h.core.deadline = deadline
        h.runner.wake()
        await wait_until(lambda: h.core.deadline is None)
        assert max(h.core.timer_calls) >= deadline


async def test_an_error_the_application_raises_on_a_read_ends_the_runner_s_tasks_with_it(
    kind: Kind,
) -> None:
    class Boom(Exception):
        pass

    with pytest.raises(BaseException) as raised:
        async with running(kind) as h:
            await h.connected()

            def answer(conn_id: int, data: bytes) -> None:
                raise Boom("from a read")

            h.core.on_receive = answer
            h.backend.stream(ADDRESS).feed(b"x")
            await anyio.sleep(5)
    found: list[BaseException] = []

    def collect(exc: BaseException) -> None:
        if isinstance(exc, BaseExceptionGroup):
            for inner in exc.exceptions:
                collect(inner)
        else:
            found.append(exc)

    collect(raised.value)
    assert [type(e) for e in found] == [Boom]


async def test_outputs_given_by_a_callback_while_the_group_winds_down_wait_for_the_close(
    kind: Kind,
) -> None:
    """A callback of the loop (a thread's FIN or publish handed over, a pushed read) drains
    the core while the runner's task group is ending: its last task has exited but the
    group's owner has not resumed, or it has left the group.  Nothing is started in that
    group then (on trio it is closed to new arrivals, and a task started there would never
    run): the outputs wait, and :meth:`CoreRunner.aclose` closes the connection."""
    backend = ScriptedBackend(kind)
    core = ScriptedCore(backend)
    runner = nsq_client.CoreRunner(backend_protocol(backend), as_core(core), lambda e: None)
    raised: list[BaseException] = []

    def late_callback() -> None:
        core.queue(Send(1, b"late"), Close(1, "done"))
        try:
            runner.drain_soon()
        except BaseException as exc:  # what the loop would get
            raised.append(exc)

    async with scripted_network(backend):
        async with anyio.create_task_group() as tg:
            runner.start(tg)
            core.queue(Connect(1, HOST, PORT, 5.0))
            runner.wake()
            await wait_until(lambda: ("connection_made", "1", b"") in backend.log)

            async def last_to_leave() -> None:
                try:
                    await anyio.sleep_forever()
                finally:
                    with anyio.CancelScope(shield=True):
                        await anyio.sleep(0.05)  # the pump and the reader have exited
                    # runs once this task has exited: the group has no task left
                    call_soon = _call_soon()
                    call_soon(late_callback)

            tg.start_soon(last_to_leave)
            await anyio.sleep(0.01)
            tg.cancel_scope.cancel()
        late_callback()  # and after the group is left
        stream = backend.stream(ADDRESS)
        with anyio.CancelScope(shield=True):
            await runner.aclose()
        assert stream.closed
    gc.collect()  # a coroutine made for a task that never ran warns here
    assert raised == []


def _call_soon() -> Any:
    """The running loop's call-soon (asyncio's ``call_soon``, trio's ``run_sync_soon``)."""
    import asyncio

    try:
        return asyncio.get_running_loop().call_soon
    except RuntimeError:  # trio
        import trio

        return trio.lowlevel.current_trio_token().run_sync_soon
