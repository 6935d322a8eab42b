"""Fault injection: dropped connections, stopped nsqd, injected errors, held output."""

from __future__ import annotations

import json

import pytest

from nsq_emulator import Lookupd, Nsqd, NsqdOptions, NsqdStopped
from tests.support.emulator_client import Client, pub_cmd

IDENT = {"feature_negotiation": True, "heartbeat_interval": 30000}


def test_drop_discards_output_and_keeps_in_flight_until_timeout() -> None:
    nsqd = Nsqd(NsqdOptions(msg_timeout=2.0, queue_scan_refresh_interval=0.0))
    c = Client(nsqd, 0.0, identify=IDENT)
    c.subscribe("t", "c", 0.0, rdy=1)
    nsqd.publish("t", b"x", 0.1)
    c.conn.drop(0.2)
    assert c.conn.closed and c.conn.data_to_send() == b""
    assert nsqd.connections == []
    assert nsqd.channel_stats("t", "c").in_flight_count == 1
    nsqd.handle_timer(2.1)
    assert nsqd.channel_stats("t", "c").depth == 1
    other = Client(nsqd, 3.0, identify=IDENT)
    other.subscribe("t", "c", 3.0, rdy=1)
    (msg,) = other.messages()
    assert (msg.body, msg.attempts) == (b"x", 2)


def test_stop_keeps_messages_and_restart_serves_them() -> None:
    nsqd = Nsqd()
    c = Client(nsqd, 0.0, identify=IDENT)
    c.subscribe("t", "c", 0.0, rdy=1)
    for body in (b"a", b"b"):
        nsqd.publish("t", body, 0.0)
    nsqd.publish("t", b"later", 0.0, delay=100.0)
    assert len(c.messages()) == 1
    nsqd.stop(1.0)
    assert c.conn.closed and not nsqd.running
    with pytest.raises(NsqdStopped):
        nsqd.accept(1.5)
    with pytest.raises(NsqdStopped):
        nsqd.handle("GET", "/ping")
    nsqd.start(2.0)
    stats = nsqd.channel_stats("t", "c")
    assert (stats.depth, stats.in_flight_count, stats.deferred_count) == (3, 0, 0)
    again = Client(nsqd, 2.0, identify=IDENT)
    again.subscribe("t", "c", 2.0, rdy=10)
    assert sorted(m.body for m in again.messages()) == [b"a", b"b", b"later"]


def test_stop_losing_messages_and_ephemeral_topics() -> None:
    nsqd = Nsqd()
    nsqd.create_channel("t", "c", 0.0)
    nsqd.create_channel("e#ephemeral", "c", 0.0)
    nsqd.publish("t", b"a", 0.0)
    nsqd.stop(1.0, lose_messages=True)
    nsqd.start(2.0)
    assert nsqd.topic_names() == ["t"]
    assert nsqd.channel_stats("t", "c").depth == 0


def test_fail_next_rejects_one_command_with_the_chosen_error() -> None:
    nsqd = Nsqd()
    p = Client(nsqd, 0.0)
    nsqd.fail_next(command="PUB", code="E_PUB_FAILED", description="PUB failed boom", fatal=False)
    p.send(pub_cmd("t", b"first") + pub_cmd("t", b"second"), 0.0)
    assert p.read() == [(1, b"E_PUB_FAILED PUB failed boom"), (0, b"OK")]
    assert nsqd.topic_stats("t").message_count == 1
    nsqd.fail_next(code="E_INVALID")
    p.send(b"NOP\n", 0.1)
    assert p.read() == [(1, b"E_INVALID ")]
    assert p.conn.closed


def test_stall_and_resume() -> None:
    nsqd = Nsqd()
    p = Client(nsqd, 0.0)
    p.conn.stall()
    p.send(pub_cmd("t", b"x"), 0.0)
    assert p.read() == []
    p.conn.resume(1.0)
    assert p.read() == [(0, b"OK")]


def test_delayed_output_is_released_on_time() -> None:
    nsqd = Nsqd()
    p = Client(nsqd, 0.0)
    p.conn.delay_output(0.5)
    p.send(pub_cmd("t", b"x"), 1.0)
    assert p.read() == []
    assert nsqd.next_deadline() == pytest.approx(1.5)
    nsqd.handle_timer(1.5)
    assert p.read() == [(0, b"OK")]


def test_delayed_fatal_error_closes_after_release() -> None:
    nsqd = Nsqd()
    nsqd.delay_output(1.0)
    p = Client(nsqd, 0.0)
    p.send(b"BAD\n", 0.0)
    assert not p.conn.closed and p.read() == []
    nsqd.handle_timer(1.0)
    assert p.read() == [(1, b"E_INVALID invalid command BAD")]
    assert p.conn.closed


def test_drop_connections_and_lookupd_view_of_a_stopped_nsqd() -> None:
    lookupd = Lookupd()
    nsqd = Nsqd()
    lookupd.register(nsqd)
    clients = [Client(nsqd, 0.0, identify=IDENT) for _ in range(3)]
    nsqd.create_topic("t", 0.0)
    nsqd.drop_connections(1.0)
    assert all(c.conn.closed for c in clients)
    nsqd.stop(2.0)
    data = json.loads(lookupd.handle("GET", "/lookup?topic=t").body)
    assert data == {"channels": [], "producers": []}
    nsqd.start(3.0)
    data = json.loads(lookupd.handle("GET", "/lookup?topic=t").body)
    assert len(data["producers"]) == 1


def test_connection_lost_is_like_eof() -> None:
    nsqd = Nsqd()
    c = Client(nsqd, 0.0, identify=IDENT)
    c.subscribe("t", "c", 0.0, rdy=1)
    c.conn.connection_lost(1.0)
    assert c.conn.closed and nsqd.channel_stats("t", "c").client_count == 0


def test_pending_lists_connections_an_adapter_must_serve() -> None:
    nsqd = Nsqd()
    c = Client(nsqd, 0.0, identify=IDENT)
    c.subscribe("t", "c", 0.0, rdy=1)
    p = Client(nsqd, 0.0)
    nsqd.pending()
    p.send(pub_cmd("t", b"x"), 1.0)
    assert nsqd.pending() == [p.conn, c.conn]  # the OK, then the delivery
    assert nsqd.pending() == []
    p.send(b"BAD\n", 2.0)
    (conn,) = nsqd.pending()
    assert conn is p.conn and conn.closed
