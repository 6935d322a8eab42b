"""Topic and channel semantics of the emulated nsqd, seen from clients."""

from __future__ import annotations

import random

from nsq_emulator import ClientState, Nsqd, NsqdOptions
from tests.support.emulator_client import Client, mpub_cmd, pub_cmd

IDENT = {"feature_negotiation": True, "heartbeat_interval": 30000}


def test_each_channel_gets_a_copy() -> None:
    nsqd = Nsqd()
    a = Client(nsqd, identify=IDENT)
    b = Client(nsqd, identify=IDENT)
    a.subscribe("t", "one", 0.0, rdy=10)
    b.subscribe("t", "two", 0.0, rdy=10)
    for i in range(3):
        nsqd.publish("t", f"m{i}".encode(), 1.0)
    got_a = [m.body for m in a.messages()]
    got_b = [m.body for m in b.messages()]
    assert got_a == got_b == [b"m0", b"m1", b"m2"]
    ids_a = [m.id for m in a.messages(a.frames)]
    ids_b = [m.id for m in b.messages(b.frames)]
    assert ids_a == ids_b  # the same message (same id) in both channels


def test_topic_holds_messages_until_a_channel_exists() -> None:
    nsqd = Nsqd()
    for i in range(3):
        nsqd.publish("t", b"early%d" % i, 0.0)
    assert nsqd.topic_stats("t").depth == 3
    c = Client(nsqd, 1.0, identify=IDENT)
    c.subscribe("t", "c", 1.0, rdy=5)
    assert [m.body for m in c.messages()] == [b"early0", b"early1", b"early2"]
    assert nsqd.topic_stats("t").depth == 0


def test_messages_spread_over_subscribers_by_rdy() -> None:
    nsqd = Nsqd()
    clients = [Client(nsqd, identify=IDENT) for _ in range(3)]
    for c, rdy in zip(clients, (1, 2, 0), strict=True):
        c.subscribe("t", "c", 0.0, rdy=rdy)
    for i in range(10):
        nsqd.publish("t", b"%d" % i, 1.0)
    counts = [len(c.messages()) for c in clients]
    assert counts == [1, 2, 0]
    stats = nsqd.channel_stats("t", "c")
    assert stats.depth == 7 and stats.in_flight_count == 3
    for c in clients:
        assert c.conn.in_flight_count <= c.conn.ready_count


def test_fin_frees_a_slot_and_the_next_message_follows() -> None:
    nsqd = Nsqd()
    c = Client(nsqd, identify=IDENT)
    c.subscribe("t", "c", 0.0, rdy=1)
    nsqd.publish("t", b"a", 0.1)
    nsqd.publish("t", b"b", 0.1)
    (first,) = c.messages()
    assert first.body == b"a"
    c.fin(first.id, 0.2)
    (second,) = c.messages()
    assert second.body == b"b" and second.attempts == 1
    assert c.conn.finish_count == 1


def test_rdy_zero_pauses_and_lowering_rdy_keeps_in_flight() -> None:
    nsqd = Nsqd()
    c = Client(nsqd, identify=IDENT)
    c.subscribe("t", "c", 0.0, rdy=3)
    for i in range(5):
        nsqd.publish("t", b"%d" % i, 0.1)
    msgs = c.messages()
    assert len(msgs) == 3
    c.send(b"RDY 0\n", 0.2)
    c.fin(msgs[0].id, 0.3)
    assert c.messages() == []
    assert (c.conn.ready_count, c.conn.in_flight_count) == (0, 2)
    c.send(b"RDY\n", 0.4)  # no count means 1, and in flight (2) is not below 1
    assert c.messages() == []
    c.fin(msgs[1].id, 0.5)
    c.fin(msgs[2].id, 0.5)
    assert [m.body for m in c.messages()] == [b"3"]


def test_fin_by_another_client_fails_not_owner() -> None:
    nsqd = Nsqd()
    a = Client(nsqd, identify=IDENT)
    b = Client(nsqd, identify=IDENT)
    a.subscribe("t", "c", 0.0, rdy=1)
    b.subscribe("t", "c", 0.0)
    nsqd.publish("t", b"x", 0.1)
    (msg,) = a.messages()
    b.fin(msg.id, 0.2)
    assert b.read() == [(1, b"E_FIN_FAILED FIN " + msg.id + b" failed client does not own message")]
    assert not b.conn.closed


def test_cls_then_rdy_ignored_fin_allowed() -> None:
    nsqd = Nsqd()
    c = Client(nsqd, identify=IDENT)
    c.subscribe("t", "c", 0.0, rdy=1)
    nsqd.publish("t", b"x", 0.1)
    nsqd.publish("t", b"y", 0.1)
    (msg,) = c.messages()
    c.send(b"CLS\n", 0.2)
    assert c.read() == [(0, b"CLOSE_WAIT")]
    assert c.conn.state is ClientState.CLOSING and c.conn.ready_count == 0
    c.send(b"RDY 5\n", 0.3)
    c.fin(msg.id, 0.4)
    assert c.read() == []
    assert not c.conn.closed
    c.send(b"CLS\n", 0.5)
    assert c.read() == [(1, b"E_INVALID cannot CLS in current state")]
    assert c.conn.closed


def test_ephemeral_channel_and_topic_vanish_with_their_last_client() -> None:
    nsqd = Nsqd()
    c = Client(nsqd, identify=IDENT)
    c.subscribe("e#ephemeral", "c#ephemeral", 0.0, rdy=1)
    nsqd.publish("e#ephemeral", b"x", 0.1)
    assert c.messages()
    assert nsqd.topic_names() == ["e#ephemeral"]
    c.send(b"", 0.2)
    assert c.conn.closed
    assert nsqd.topic_names() == []


def test_durable_channel_keeps_in_flight_after_disconnect_until_timeout() -> None:
    nsqd = Nsqd(NsqdOptions(msg_timeout=5.0))
    c = Client(nsqd, identify=IDENT)
    c.subscribe("t", "c", 0.0, rdy=1)
    nsqd.publish("t", b"x", 0.0)
    assert c.messages()
    c.send(b"", 1.0)
    assert nsqd.channel_stats("t", "c").in_flight_count == 1
    nsqd.handle_timer(5.0)
    stats = nsqd.channel_stats("t", "c")
    assert (stats.in_flight_count, stats.depth, stats.timeout_count) == (0, 1, 1)


def test_mpub_keeps_order_and_pub_counts() -> None:
    nsqd = Nsqd()
    p = Client(nsqd)
    p.send(mpub_cmd("t", b"1", b"2", b"3") + pub_cmd("t", b"4"), 0.0)
    assert p.read() == [(0, b"OK"), (0, b"OK")]
    assert p.conn.pub_counts == {"t": 4}
    c = Client(nsqd, identify=IDENT)
    c.subscribe("t", "c", 0.1, rdy=10)
    assert [m.body for m in c.messages()] == [b"1", b"2", b"3", b"4"]


def test_message_ids_are_unique_hex_and_timestamps_follow_now() -> None:
    opts = NsqdOptions(wall_clock_offset=1_800_000_000.0, node_id=617)
    nsqd = Nsqd(opts)
    ids = [nsqd.publish("t", b"x", 0.0) for _ in range(5000)]
    assert len(set(ids)) == 5000
    assert all(len(i) == 16 and all(c in b"0123456789abcdef" for c in i) for i in ids)
    assert int(ids[0], 16) >> 12 & 0x3FF == 617
    c = Client(nsqd, 2.5, identify=IDENT)
    c.subscribe("t", "c", 2.5, rdy=1)
    (msg,) = c.messages()
    assert msg.timestamp == 1_800_000_000_000_000_000


def test_sample_rate_drops_messages_from_the_channel() -> None:
    nsqd = Nsqd(rng=random.Random(3))
    c = Client(nsqd, identify={**IDENT, "sample_rate": 10})
    c.subscribe("t", "c", 0.0, rdy=100)
    for i in range(200):
        nsqd.publish("t", b"%d" % i, 0.1)
    got = len(c.messages())
    assert 5 < got < 60
    assert nsqd.channel_stats("t", "c").depth == 0


def test_paused_channel_delivers_nothing_until_unpaused() -> None:
    nsqd = Nsqd()
    c = Client(nsqd, identify=IDENT)
    c.subscribe("t", "c", 0.0, rdy=5)
    nsqd.pause_channel("t", "c", 0.1)
    nsqd.publish("t", b"x", 0.2)
    assert c.messages() == []
    nsqd.pause_channel("t", "c", 0.3, paused=False)
    assert [m.body for m in c.messages()] == [b"x"]


def test_channel_messages_inspection() -> None:
    nsqd = Nsqd()
    c = Client(nsqd, identify=IDENT)
    c.subscribe("t", "c", 0.0, rdy=1)
    nsqd.publish("t", b"a", 0.0)
    nsqd.publish("t", b"b", 0.0)
    nsqd.publish("t", b"c", 0.0, delay=10.0)
    infos = nsqd.channel_messages("t", "c")
    assert [(i.body, i.state) for i in infos] == [
        (b"b", "queued"),
        (b"a", "in_flight"),
        (b"c", "deferred"),
    ]
    assert infos[1].client == c.conn.id
    assert nsqd.client_stats(c.conn)[0].in_flight_count == 1
