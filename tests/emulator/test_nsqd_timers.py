"""Time in the emulator: heartbeats, read timeouts, message timeouts, REQ/DPUB delays."""

from __future__ import annotations

import pytest

from nsq_emulator import Nsqd, NsqdOptions
from tests.support.emulator_client import Client

HB = b"_heartbeat_"


#: every timer exact (nsqd refreshes its queue-scan list every 5 s; tested at the end)
EXACT = NsqdOptions(queue_scan_refresh_interval=0.0)


def ident(hb_ms: int = 1000, **extra: object) -> dict[str, object]:
    return {"feature_negotiation": True, "heartbeat_interval": hb_ms, **extra}


def test_heartbeats_every_interval_and_close_after_two_silent_intervals() -> None:
    nsqd = Nsqd(EXACT)
    c = Client(nsqd, 10.0, identify=ident(1000))
    assert nsqd.next_deadline() == pytest.approx(11.0)
    nsqd.handle_timer(10.999)
    assert c.read() == []
    nsqd.handle_timer(11.0)
    assert c.read() == [(0, HB)]
    assert not c.conn.closed
    # the read deadline (2 intervals after the last command) wins the race with the tick
    nsqd.handle_timer(12.0)
    assert c.read() == []
    assert c.conn.closed
    assert c.conn.close_reason == "read timeout"
    assert nsqd.next_deadline() is None


def test_nop_keeps_the_connection_alive() -> None:
    nsqd = Nsqd(EXACT)
    c = Client(nsqd, 0.0, identify=ident(1000))
    t = 0.0
    for _ in range(5):
        t += 1.0
        nsqd.handle_timer(t)
        assert c.read() == [(0, HB)]
        c.send(b"NOP\n", t + 0.01)
    assert not c.conn.closed


def test_late_handle_timer_catches_up_in_order() -> None:
    nsqd = Nsqd(EXACT)
    c = Client(nsqd, 0.0, identify=ident(1000))
    nsqd.handle_timer(100.0)
    assert c.read() == [(0, HB)]
    assert c.conn.closed


def test_default_heartbeat_is_thirty_seconds_and_timeout_sixty() -> None:
    nsqd = Nsqd(EXACT)
    c = Client(nsqd, 0.0)
    assert nsqd.next_deadline() == pytest.approx(30.0)
    nsqd.handle_timer(30.0)
    assert c.read() == [(0, HB)]
    nsqd.handle_timer(59.9)
    assert not c.conn.closed
    nsqd.handle_timer(60.0)
    assert c.conn.closed


def test_heartbeats_disabled() -> None:
    nsqd = Nsqd(EXACT)
    c = Client(nsqd, 0.0, identify=ident(-1))
    assert nsqd.next_deadline() is None
    c.send(b"SUB t c\n", 1.0)
    assert c.read() == [(1, b"E_INVALID cannot SUB with heartbeats disabled")]


def test_partitioned_server_waits_three_intervals() -> None:
    nsqd = Nsqd(NsqdOptions(partitioned=True))
    c = Client(nsqd, 0.0, identify=ident(1000))
    nsqd.handle_timer(2.5)
    assert not c.conn.closed
    nsqd.handle_timer(3.0)
    assert c.conn.closed
    assert [d for _, d in c.read()] == [HB, HB]


def test_msg_timeout_redelivers_with_attempts_plus_one() -> None:
    nsqd = Nsqd(EXACT)
    c = Client(nsqd, 0.0, identify=ident(30000, msg_timeout=1000))
    c.subscribe("t", "c", 0.0, rdy=1)
    nsqd.publish("t", b"slow", 0.5)
    (first,) = c.messages()
    assert first.attempts == 1
    assert nsqd.next_deadline() == pytest.approx(1.5)
    nsqd.handle_timer(1.4999)
    assert c.messages() == []
    nsqd.handle_timer(1.5)
    (again,) = c.messages()
    assert (again.id, again.attempts, again.timestamp) == (first.id, 2, first.timestamp)
    assert nsqd.channel_stats("t", "c").timeout_count == 1
    assert c.conn.in_flight_count == 1


def test_req_with_delay_defers_then_redelivers() -> None:
    nsqd = Nsqd(EXACT)
    c = Client(nsqd, 0.0, identify=ident(30000))
    c.subscribe("t", "c", 0.0, rdy=1)
    nsqd.publish("t", b"later", 0.0)
    (msg,) = c.messages()
    c.req(msg.id, 1000, 0.2)
    stats = nsqd.channel_stats("t", "c")
    assert (stats.deferred_count, stats.in_flight_count, stats.requeue_count) == (1, 0, 1)
    assert c.conn.in_flight_count == 0
    nsqd.handle_timer(1.1999)
    assert c.messages() == []
    nsqd.handle_timer(1.2)
    (again,) = c.messages()
    assert again.attempts == 2


def test_req_zero_requeues_at_once_to_the_end() -> None:
    nsqd = Nsqd(EXACT)
    c = Client(nsqd, 0.0, identify=ident(30000))
    c.subscribe("t", "c", 0.0, rdy=1)
    nsqd.publish("t", b"a", 0.0)
    nsqd.publish("t", b"b", 0.0)
    (a,) = c.messages()
    c.req(a.id, 0, 0.1)
    (b,) = c.messages()
    assert b.body == b"b"
    c.fin(b.id, 0.2)
    (a2,) = c.messages()
    assert (a2.body, a2.attempts) == (b"a", 2)


def test_req_delay_is_clamped_to_max_req_timeout() -> None:
    nsqd = Nsqd(NsqdOptions(max_req_timeout=2.0, queue_scan_refresh_interval=0.0))
    c = Client(nsqd, 0.0, identify=ident(30000))
    c.subscribe("t", "c", 0.0, rdy=1)
    nsqd.publish("t", b"x", 0.0)
    (msg,) = c.messages()
    c.req(msg.id, 999999, 1.0)
    assert c.read() == []
    assert nsqd.next_deadline() == pytest.approx(3.0)


def test_touch_restarts_the_timeout_up_to_max_msg_timeout() -> None:
    nsqd = Nsqd(NsqdOptions(max_msg_timeout=2.5, msg_timeout=1.0, queue_scan_refresh_interval=0.0))
    c = Client(nsqd, 0.0, identify=ident(30000))
    c.subscribe("t", "c", 0.0, rdy=1)
    nsqd.publish("t", b"x", 0.0)
    (msg,) = c.messages()
    c.touch(msg.id, 0.6)
    assert nsqd.next_deadline() == pytest.approx(1.6)
    c.touch(msg.id, 1.5)
    c.touch(msg.id, 2.0)
    assert nsqd.next_deadline() == pytest.approx(2.5)  # capped: delivery + max_msg_timeout
    nsqd.handle_timer(2.5)
    (again,) = c.messages()
    assert again.attempts == 2


def test_touch_uses_the_current_msg_timeout() -> None:
    nsqd = Nsqd(EXACT)
    c = Client(nsqd, 0.0, identify=ident(30000, msg_timeout=1000))
    c.subscribe("t", "c", 0.0, rdy=1)
    nsqd.publish("t", b"x", 0.0)
    (msg,) = c.messages()
    c.touch(msg.id, 0.5)
    assert nsqd.next_deadline() == pytest.approx(1.5)


def test_dpub_delivers_after_the_delay_with_publish_timestamp() -> None:
    nsqd = Nsqd(NsqdOptions(wall_clock_offset=0.0, queue_scan_refresh_interval=0.0))
    c = Client(nsqd, 0.0, identify=ident(30000))
    c.subscribe("t", "c", 0.0, rdy=1)
    c.send(b"DPUB t 1000\n\x00\x00\x00\x08deferred", 2.0)
    assert c.read() == [(0, b"OK")]
    assert nsqd.channel_stats("t", "c").deferred_count == 1
    nsqd.handle_timer(2.999)
    assert c.messages() == []
    nsqd.handle_timer(3.0)
    (msg,) = c.messages()
    assert (msg.body, msg.attempts, msg.timestamp) == (b"deferred", 1, 2_000_000_000)


@pytest.mark.parametrize(
    ("delay", "error"),
    [
        (b"3600001", b"E_INVALID DPUB timeout 3600001 out of range 0-3600000"),
        (b"-1", b"E_INVALID DPUB could not parse timeout -1"),
        (b"", None),
    ],
)
def test_dpub_delay_range(delay: bytes, error: bytes | None) -> None:
    nsqd = Nsqd(EXACT)
    c = Client(nsqd, 0.0)
    c.send(b"DPUB t " + delay + b"\n\x00\x00\x00\x01x", 0.1)
    if error is None:
        assert c.read() == [(0, b"OK")]  # an empty token parses as 0
    else:
        assert c.read() == [(1, error)]
        assert c.conn.closed


def test_queue_scan_refresh_delays_timers_of_new_channels() -> None:
    nsqd = Nsqd(NsqdOptions(queue_scan_refresh_interval=5.0), now=0.0)
    c = Client(nsqd, 0.6, identify=ident(30000, msg_timeout=1000))
    c.subscribe("t", "c", 0.6, rdy=1)
    nsqd.publish("t", b"x", 0.9)
    assert len(c.messages()) == 1
    assert nsqd.next_deadline() == pytest.approx(5.0)
    nsqd.handle_timer(4.99)
    assert c.messages() == []
    nsqd.handle_timer(5.0)
    assert c.messages()[0].attempts == 2
    assert nsqd.next_deadline() == pytest.approx(6.0)  # now on time


def test_tls_handshake_timeout_closes() -> None:
    nsqd = Nsqd(NsqdOptions(tls=True))
    c = Client(nsqd, 0.0)
    from tests.support.emulator_client import identify_cmd

    c.send(identify_cmd(feature_negotiation=True, tls_v1=True), 0.0)
    assert c.read()[0][0] == 0
    assert c.conn.tls_requested
    assert nsqd.next_deadline() == pytest.approx(5.0)
    nsqd.handle_timer(5.0)
    assert c.conn.closed and not c.conn.tls_requested
