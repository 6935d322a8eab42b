"""The partitioned server: partitions, leaders, traced publishing, ordered consumption."""

from __future__ import annotations

import json
import struct

import pytest

from nsq_emulator import Cluster, Nsqd, NsqdOptions
from nsq_proto._features import parse_trace_receipt
from nsq_proto._message import MessageLayout
from tests.support.emulator_client import ORDERED_LAYOUT, PARTITIONED_LAYOUT, Client, body

IDENT = {"feature_negotiation": True, "heartbeat_interval": 30000}
V1 = [("Accept", "application/vnd.nsq; version=1.0")]


def cluster(*, ordered: bool = False, writable: bool = True) -> Cluster:
    # every timer exact (the real server refreshes its queue-scan list every 5 s)
    c = Cluster(3, options=NsqdOptions(partitioned=True, queue_scan_refresh_interval=0.0))
    c.create_topic("orders", 0.0, partitions=2, replicas=2, ordered=ordered, writable=writable)
    return c


def client(
    node: Nsqd, now: float = 0.0, layout: MessageLayout = PARTITIONED_LAYOUT, **ident: object
) -> Client:
    return Client(node, now, identify={**IDENT, **ident}, layout=layout)


def test_identify_response_of_the_partitioned_server() -> None:
    c = Client(Nsqd(NsqdOptions(partitioned=True)), 0.0)
    c.send(b"IDENTIFY\n" + body(b'{"feature_negotiation":true,"desired_tag":"t1"}'), 0.0)
    ((_, data),) = c.read()
    obj = json.loads(data)
    assert obj["version"] == "0.3.7-HA.1.13.0"
    assert (obj["deflate_level"], obj["desired_tag"]) == (0, "t1")
    assert list(obj)[-1] == "desired_tag"


def test_no_auto_creation_topic_not_exist_has_a_trailing_space() -> None:
    node = Nsqd(NsqdOptions(partitioned=True))
    c = Client(node, 0.0)
    c.send(b"PUB nope\n" + body(b"x"), 0.0)
    assert c.read() == [(1, b"E_TOPIC_NOT_EXIST ")]
    assert c.conn.closed
    s = client(node)
    s.send(b"SUB nope c 0\n", 0.0)
    assert s.read() == [(1, b"E_TOPIC_NOT_EXIST ")]


def test_internal_create_topic_standalone_then_ids_count_from_one() -> None:
    node = Nsqd(NsqdOptions(partitioned=True))
    p = Client(node, 0.0)
    p.send(b"INTERNAL_CREATE_TOPIC t 0\n", 0.0)
    assert p.read() == [(0, b"OK")]
    for i in range(3):
        p.send(b"PUB t 0\n" + body(b"m%d" % i), 0.1)
    assert p.read() == [(0, b"OK")] * 3
    s = client(node, 0.2)
    s.subscribe("t", "c", 0.2, rdy=10)
    msgs = s.messages()
    assert [(m.internal_id, m.trace_id, m.body) for m in msgs] == [
        (1, 0, b"m0"),
        (2, 0, b"m1"),
        (3, 0, b"m2"),
    ]
    node.stop(1.0)
    node.start(2.0)
    p2 = Client(node, 2.0)
    p2.send(b"PUB_TRACE t 0\n" + body(struct.pack(">Q", 7) + b"x"), 2.0)
    ((_, data),) = p2.read()
    assert parse_trace_receipt(data).internal_id == 1  # the in-memory counter starts over


def test_internal_create_topic_is_refused_in_a_cluster() -> None:
    c = cluster()
    p = Client(c.nodes[0], 0.0)
    p.send(b"INTERNAL_CREATE_TOPIC x 0\nNOP\n", 0.0)
    assert p.read() == [
        (
            1,
            b"E_CREATE_TOPIC_FAILED CREATE_TOPIC is not allowed here while cluster feature enabled.",
        )
    ]
    assert not p.conn.closed


def test_pub_trace_response_matches_the_documented_bytes() -> None:
    c = cluster()
    c.create_channel("orders", "c", 0.0)
    p = Client(c.nodes[0], 0.0)
    p.send(b"PUB_TRACE orders 0\n\x00\x00\x00\x0a\x00\x00\x00\x00\x00\x00\x30\x39hi", 0.0)
    out = p.conn.data_to_send()
    assert out == bytes.fromhex(
        # in a cluster, partition 0's commit log hands out ids from 2 (0 << 50, plus 2)
        "00000022 00000000 4f4b 0000000000000002 0000000000003039 0000000000000000 00000020"
    )
    p.send(
        b"MPUB_TRACE orders 0\n"
        + body(b"\x00\x00\x00\x02" + body(b"\0" * 7 + b"\1a") + body(b"\0" * 7 + b"\2bc")),
        0.1,
    )
    ((_, data),) = p.read()
    receipt = parse_trace_receipt(data)
    assert (receipt.internal_id, receipt.trace_id, receipt.queue_offset, receipt.raw_size) == (
        3,
        0,
        32,
        31 + 32,
    )
    p.send(b"PUB_TRACE orders 0\n" + body(b"12345678"), 0.2)
    assert p.read() == [(1, b"E_BAD_BODY invalid body size 8 with trace id enabled")]


def test_partition_is_recognised_by_token_count_only() -> None:
    c = cluster()
    c.create_channel("orders", "c", 0.0)
    p = Client(c.nodes[1], 0.0)  # leads partition 1, replica of partition 0
    p.send(b"PUB orders  1\n" + body(b"x"), 0.0)  # 4 tokens: the partition is ignored
    assert p.read() == [(0, b"OK")]
    assert c.topic("orders", 1).message_count == 1  # node 1's default partition
    p.send(b"PUB orders 0\n" + body(b"y"), 0.1)  # a replica, not the leader: non-fatal
    assert p.read() == [(1, b"E_FAILED_ON_NOT_LEADER ")]
    assert not p.conn.closed
    p.send(b"PUB orders x\n", 0.2)
    assert p.read() == [
        (
            1,
            b'E_BAD_PARTITION topic partition is not valid: strconv.Atoi: parsing "x": invalid syntax',
        )
    ]


def test_binary_ids_with_newline_and_space_are_parsed_by_offset() -> None:
    c = cluster()
    c.create_channel("orders", "c", 0.0)
    c.topic("orders", 0).next_internal_id = 0x0A20
    p = Client(c.nodes[0], 0.0)
    p.send(b"PUB_TRACE orders 0\n" + body(b"\x00" * 6 + b"\x0a\x20" + b"payload"), 0.0)
    s = client(c.nodes[0], 0.0)
    s.subscribe("orders", "c", 0.0, rdy=1)
    (msg,) = s.messages()
    assert msg.id == b"\x00" * 6 + b"\x0a\x20" + b"\x00" * 6 + b"\x0a\x20"
    s.touch(msg.id, 0.1)
    s.req(msg.id, 0, 0.2)
    (again,) = s.messages()
    assert again.attempts == 2
    s.fin(again.id, 0.3)
    assert s.read() == []
    assert c.topic("orders", 0).channels["c"].in_flight == {}
    s.fin(again.id, 0.4)
    ((kind, text),) = s.read()
    assert (
        kind == 1
        and text.startswith(b"E_FIN_FAILED FIN [0 0 0 0 0 0 10 32 ")
        and text.endswith(b" failed Message ID not in flight")
    )


def test_ordered_subscription_one_at_a_time_with_queue_position() -> None:
    c = cluster(ordered=True)
    node = c.nodes[0]
    p = Client(node, 0.0)
    for i in range(3):
        p.send(b"PUB orders 0\n" + body(b"o%d" % i), 0.0)
    p.send(b"PUB orders\n" + body(b"no partition"), 0.0)
    assert p.read()[-1] == (
        1,
        b"E_BAD_PARTITION topic partition is not valid for multi partition: -1",
    )
    plain = client(node)
    plain.send(b"SUB orders c 0\n", 0.0)
    assert plain.read() == [
        (1, b"E_SUB_ORDER_IS_MUST this topic is configured only allow ordered sub")
    ]
    s = client(node, layout=ORDERED_LAYOUT)
    s.send(b"SUB_ORDERED orders c 0\nRDY 5\n", 0.1)
    assert s.read()[0] == (0, b"OK")
    first, repeat = s.messages(s.frames)  # the head of a backlog comes twice (real server)
    assert repeat.id == first.id
    assert (first.body, first.queue_offset, first.raw_size) == (b"o0", 0, 32)
    s.req(first.id, 1000, 0.2)  # a delay is ignored on an ordered channel
    assert s.messages() == []
    s.req(first.id, 0, 0.3)
    (again,) = s.messages()
    assert (again.body, again.attempts) == (b"o0", 2)
    s.fin(again.id, 0.4)
    (second,) = s.messages()
    assert (second.body, second.queue_offset) == (b"o1", 32)


def test_ordered_timeout_redelivers_the_same_message_first() -> None:
    c = cluster(ordered=True)
    node = c.nodes[0]
    p = Client(node, 0.0)
    p.send(b"PUB orders 0\n" + body(b"a") + b"PUB orders 0\n" + body(b"b"), 0.0)
    s = client(node, layout=ORDERED_LAYOUT, msg_timeout=1000)
    s.send(b"SUB_ORDERED orders c 0\nRDY 2\n", 0.0)
    # the first ordered subscription over a backlog sends its head twice (the real server)
    assert [m.body for m in s.messages()] == [b"a", b"a"]
    c.handle_timer(1.0)
    assert [(m.body, m.attempts) for m in s.messages()] == [(b"a", 2)]


def test_no_dpub_on_the_partitioned_server() -> None:
    c = cluster()
    p = Client(c.nodes[0], 0.0)
    p.send(b"DPUB orders 1000\n" + body(b"x"), 0.0)
    assert p.read() == [
        (1, b"E_INVALID invalid command [[68 80 85 66] [111 114 100 101 114 115] [49 48 48 48]]")
    ]
    assert p.conn.closed


def test_move_leader_makes_the_old_leader_refuse() -> None:
    c = cluster()
    c.create_channel("orders", "c", 0.0)
    old, new = c.nodes[0], c.nodes[1]
    s = client(old)
    s.subscribe("orders", "c", 0.0, rdy=1)
    pub = Client(old, 0.0)
    pub.send(b"PUB orders 0\n" + body(b"x"), 0.0)
    assert pub.read() == [(0, b"OK")]
    (msg,) = s.messages()
    c.move_leader("orders", 0, 1, 1.0)
    pub.send(b"PUB orders 0\n" + body(b"y"), 1.1)
    assert pub.read() == [(1, b"E_FAILED_ON_NOT_LEADER ")] and not pub.conn.closed
    s.fin(msg.id, 1.2)
    assert s.read() == [(1, b"E_FAILED_ON_NOT_LEADER ")] and s.conn.closed
    again = client(new, 1.3)
    again.subscribe("orders", "c", 1.3, rdy=5)
    assert [(m.body, m.attempts) for m in again.messages()] == [(b"x", 2)]
    late = client(old, 1.4)
    late.send(b"SUB orders c 0\n", 1.4)
    assert late.read() == [(1, b"E_FAILED_ON_NOT_LEADER ")]
    data = json.loads(c.lookupd.handle("GET", "/lookup?topic=orders", V1).body)
    assert data["partitions"]["0"]["tcp_port"] == new.options.tcp_port


def test_stop_node_fails_over_to_a_replica() -> None:
    c = cluster()
    c.create_channel("orders", "c", 0.0)
    p = Client(c.nodes[0], 0.0)
    p.send(b"PUB orders 0\n" + body(b"kept"), 0.0)
    c.stop_node(0, 1.0)
    assert c.leader("orders", 0) is c.nodes[1]
    s = client(c.nodes[1], 2.0)
    s.subscribe("orders", "c", 2.0, rdy=5)
    assert [m.body for m in s.messages()] == [b"kept"]
    c.start_node(0, 3.0)
    assert c.nodes[0].running


def test_client_going_away_requeues_its_messages_at_once() -> None:
    c = cluster()
    c.create_channel("orders", "c", 0.0)
    node = c.nodes[0]
    a = client(node)
    a.subscribe("orders", "c", 0.0, rdy=1)
    Client(node, 0.0).send(b"PUB orders 0\n" + body(b"x"), 0.0)
    assert a.messages()
    b = client(node)
    b.subscribe("orders", "c", 0.0, rdy=1)
    a.send(b"", 0.5)
    assert [(m.body, m.attempts) for m in b.messages()] == [(b"x", 2)]


def test_extended_topics_need_extend_support() -> None:
    c = Cluster(1)
    c.create_topic("ext", 0.0, partitions=1, ext=True)
    c.create_topic("plain", 0.0, partitions=1)
    node = c.nodes[0]
    s = client(node)
    s.send(b"SUB ext c 0\n", 0.0)
    assert s.read() == [
        (1, b"E_SUB_EXTEND_NEED this topic is extended and should identify as extend support.")
    ]
    f = client(node, extend_support=True)
    f.send(b"SUB plain c 0\n", 0.0)
    assert f.read() == [
        (
            1,
            b"E_SUB_EXTEND_FORBIDDON this topic is not extended and should not identify as extend support.",
        )
    ]
    e = client(node, layout=MessageLayout(binary_id=True, ext_header=True), extend_support=True)
    e.subscribe("ext", "c", 0.0, rdy=5)
    header = b'{"##trace_id":"12345","k":"v"}'
    p = Client(node, 0.0)
    p.send(b"PUB_EXT ext 0\n" + body(struct.pack(">H", len(header)) + header + b"hi"), 0.1)
    p.send(b"PUB ext 0\n" + body(b"plain"), 0.1)
    ((_, receipt), (_, ok)) = p.read()
    assert parse_trace_receipt(receipt).trace_id == 12345 and ok == b"OK"
    msgs = e.messages()
    assert [(m.ext_version, m.ext_data, m.body, m.trace_id) for m in msgs] == [
        (4, header, b"hi", 12345),
        (0, None, b"plain", 0),
    ]
    p.send(b"PUB_EXT plain 0\n" + body(struct.pack(">H", 2) + b"{}x"), 0.2)
    assert p.read() == [(1, b"E_EXT_NOT_SUPPORT ext content not supported in topic plain")]


def test_partitioned_lookup_api() -> None:
    c = cluster()
    lk = c.lookupd

    def get(target: str, headers: list[tuple[str, str]] = V1) -> tuple[int, object]:
        resp = lk.handle("GET", target, headers)
        return resp.status, json.loads(resp.body) if resp.body else None

    status, data = get("/lookup?topic=orders&access=w&metainfo=true")
    assert (status, data) == (
        500,  # as the real nsqlookupd answers it
        {"message": "Topic has no channel, should init at least one for the new topic"},
    )
    c.create_channel("orders", "c", 0.0)
    status, data = get("/lookup?topic=orders&access=w&metainfo=true")
    assert status == 200 and isinstance(data, dict)
    assert list(data) == ["channels", "meta", "partitions", "producers"]
    assert data["meta"] == {
        "disable_channel_auto_create": False,
        "extend_support": False,
        "multi_part": False,
        "ordered": False,
        "partition_num": 2,
        "replica": 2,
    }
    assert {k: v["tcp_port"] for k, v in data["partitions"].items()} == {"0": 4150, "1": 4250}
    assert data["partitions"]["1"]["distributed_id"] == "127.0.0.1:4270:4250:2"
    status, data = get("/lookup?topic=orders&partition=1")
    assert isinstance(data, dict) and list(data["partitions"]) == ["1"] and "meta" not in data
    assert get("/lookup?topic=nope") == (200, {"channels": [], "partitions": {}, "producers": []})
    assert get("/lookup?topic=nope&access=w") == (404, {"message": "Key not found"})
    assert get("/lookup?topic=orders&access=x") == (400, {"message": "INVALID_ACCESS_MODE"})
    status, wrapped = get("/lookup?topic=orders", [])
    assert status == 200 and isinstance(wrapped, dict)
    assert (wrapped["status_code"], wrapped["status_txt"]) == (200, "OK")
    assert get("/lookup?topic=orders&access=x", []) == (
        500,
        {"status_code": 500, "status_txt": "INVALID_ACCESS_MODE", "data": None},
    )
    status, listed = get("/listlookup")
    assert isinstance(listed, dict)
    assert listed["lookupdleader"] == listed["lookupdnodes"][0]
    assert listed["lookupdleader"]["HttpPort"] == "4161"
    assert get("/topics")[1] == {"topics": ["orders"]}


def test_topics_created_over_the_lookupd_http_api() -> None:
    c = Cluster(2, lookupds=2)
    leader, follower = c.lookupds
    resp = follower.handle("POST", "/topic/create?topic=web&partition_num=2&replicator=1", V1)
    assert (resp.status, resp.body) == (400, b'{"message":"E_FAILED_ON_NOT_LEADER"}')
    resp = leader.handle("POST", "/topic/create?topic=web&partition_num=0&replicator=1", V1)
    assert json.loads(resp.body) == {"message": "INVALID_ARG_TOPIC_PARTITION_NUM"}
    resp = leader.handle(
        "POST", "/topic/create?topic=web&partition_num=2&replicator=2&orderedmulti=true", V1
    )
    assert resp.status == 200
    assert (
        leader.handle("POST", "/topic/create?topic=web&partition_num=2&replicator=2", V1).status
        == 400
    )
    assert leader.handle("POST", "/channel/create?topic=web&channel=c", V1, now=1.0).status == 200
    meta = c.meta["web"]
    assert (meta.partition_num, meta.replica, meta.ordered, meta.multi_part) == (2, 2, True, True)
    assert c.topic("web", 1).channels.keys() == {"c"}
    data = json.loads(follower.handle("GET", "/lookup?topic=web&access=w&metainfo=true", V1).body)
    assert data["meta"]["ordered"] is True and set(data["partitions"]) == {"0", "1"}


def test_too_many_client_connections_are_refused_without_a_code() -> None:
    node = Nsqd(NsqdOptions(partitioned=True, max_conn_for_client=1))
    Client(node, 0.0)
    second = Client(node, 0.0)
    assert second.read() == [(1, b"too much client connections")]
    assert second.conn.closed


def test_sub_advanced_start_positions() -> None:
    c = cluster()
    node = c.nodes[0]
    p = Client(node, 0.0)
    for i in range(4):
        p.send(b"PUB orders 0\n" + body(b"m%d" % i), 0.0)
    skip = client(node, layout=ORDERED_LAYOUT)
    skip.send(b"SUB_ADVANCED orders skip 0 special:-1\nRDY 5\n", 0.1)
    assert skip.read() == [(0, b"OK")]  # the 5-token form: partition ignored, backlog skipped
    rewind = client(node, layout=ORDERED_LAYOUT)
    rewind.send(b"SUB_ADVANCED orders old 0 virtual_queue:64\nRDY 5\n", 0.1)
    assert [(m.body, m.queue_offset) for m in rewind.messages()] == [(b"m2", 64), (b"m3", 96)]
    bad = client(node)
    bad.send(b"SUB_ADVANCED orders x 0 later:1\n", 0.2)
    assert bad.read() == [(1, b"E_INVALID invalid consume offset:later:1")]
    standalone = Nsqd(NsqdOptions(partitioned=True))
    standalone.create_partition("t", 0, 0.0)
    s = client(standalone)
    s.send(b"SUB_ADVANCED t c 0 timestamp:0\n", 0.0)
    assert s.read() == [(1, b"E_INVALID Not supported while coordinator disabled")]


def test_partitioned_identify_rules() -> None:
    node = Nsqd(NsqdOptions(partitioned=True))
    c = Client(node, 0.0)
    c.send(b"IDENTIFY\n" + body(json.dumps({"desired_tag": "x" * 101}).encode()), 0.0)
    assert c.read() == [(1, b"E_BAD_BODY IDENTIFY invalid tag len 101, exceed limit 100")]
    ok = Client(node, 0.0)
    raw = {"feature_negotiation": True, "output_buffer_timeout": 5, "output_buffer_size": 1 << 20}
    ok.send(b"IDENTIFY\n" + body(json.dumps(raw).encode()), 0.0)
    ((_, data),) = ok.read()
    obj = json.loads(data)
    assert (obj["output_buffer_timeout"], obj["output_buffer_size"]) == (10, 65536)


def test_http_publish_on_a_partition_and_stats() -> None:
    c = cluster()
    c.create_channel("orders", "c", 0.0)
    node = c.nodes[1]  # leads partition 1
    assert node.handle("POST", "/pub?topic=orders&partition=1", [], b"x").status == 200
    assert node.handle("POST", "/pub?topic=orders", [], b"y").status == 200  # default partition
    assert node.handle("POST", "/pub?topic=orders&partition=0", [], b"z").status == 404
    assert c.topic("orders", 1).message_count == 2
    stats = json.loads(node.handle("GET", "/stats?format=json").body)
    (topic,) = stats["topics"]
    assert (topic["topic_name"], topic["topic_partition"], topic["message_count"]) == (
        "orders",
        "1",
        2,
    )


def test_direct_publish_on_a_partition() -> None:
    c = cluster()
    msg_id = c.nodes[1].publish("orders", b"x", 0.0, partition=1)
    # partition 1's ids start at 1 << 50 (plus 2), as the cluster's commit log numbers them
    assert msg_id == ((1 << 50) + 2).to_bytes(8, "big") + b"\x00" * 8
    assert c.topic("orders", 1).message_count == 1
    with pytest.raises(KeyError):
        c.nodes[1].publish("orders", b"x", 0.0, partition=0)  # a replica, not the leader


def test_identify_reports_the_write_buffer_of_100_bytes_when_none_was_asked() -> None:
    c = Client(Nsqd(NsqdOptions(partitioned=True)), 0.0)
    c.send(b"IDENTIFY\n" + body(b'{"feature_negotiation":true}'), 0.0)
    ((_, data),) = c.read()
    assert json.loads(data)["output_buffer_size"] == 100
    c = Client(Nsqd(NsqdOptions(partitioned=True)), 0.0)
    c.send(b"IDENTIFY\n" + body(b'{"feature_negotiation":true,"output_buffer_size":512}'), 0.0)
    ((_, data),) = c.read()
    assert json.loads(data)["output_buffer_size"] == 512


def test_a_new_topic_refuses_writes_until_enabled() -> None:
    c = cluster(writable=False)
    c.create_channel("orders", "c", 0.0)
    p = client(c.nodes[0])
    p.send(b"PUB orders 0\n" + body(b"early") + b"PUB orders 0\n" + body(b"early"), 0.0)
    # non-fatal, after the body was read: the connection stays in step
    # the real cluster answers a new topic with E_FAILED_ON_NOT_LEADER until its check ran
    assert p.read() == [(1, b"E_FAILED_ON_NOT_LEADER "), (1, b"E_FAILED_ON_NOT_LEADER ")]
    assert c.topic("orders", 0).message_count == 0
    c.enable_writes("orders")
    p.send(b"PUB orders 0\n" + body(b"later"), 0.1)
    assert p.read() == [(0, b"OK")]
    assert [m.body for m in c.topic("orders", 0).log] == [b"later"]


def test_the_first_ordered_subscription_over_a_backlog_delivers_its_head_twice() -> None:
    # the real server resets the channel's reader when it turns ordered ("read a message not
    # in ordered") and sends the first message again: same id, same attempts
    c = cluster(ordered=True)
    c.create_channel("orders", "c", 0.0)
    leader = c.leader("orders", 0)
    assert leader is not None
    leader.publish("orders", b"first", 0.0, partition=0)
    leader.publish("orders", b"second", 0.0, partition=0)
    s = client(leader, layout=ORDERED_LAYOUT)
    s.send(b"SUB_ORDERED orders c 0\nRDY 5\n", 0.1)
    assert s.read()[0] == (0, b"OK")
    messages = s.messages(s.frames)
    assert [(m.body, m.attempts) for m in messages] == [(b"first", 1), (b"first", 1)]
    assert messages[0].id == messages[1].id
    s.fin(messages[0].id, 0.2)
    s.fin(messages[1].id, 0.2)
    out = s.read()
    assert [kind for kind, data in out if data.startswith(b"E_FIN_FAILED")] == [1]
    assert [m.body for m in s.messages(out)] == [b"second"]  # once
