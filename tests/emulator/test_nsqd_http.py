"""nsqd's HTTP API: the plain ``handle`` API and the sans-IO connection (nsqlookupd's is in
``test_lookupd.py``)."""

from __future__ import annotations

import json

from nsq_emulator import Nsqd, NsqdOptions
from tests.support.emulator_client import Client

V1 = [("Accept", "application/vnd.nsq; version=1.0")]


def test_pub_and_mpub_over_http() -> None:
    nsqd = Nsqd()
    resp = nsqd.handle("POST", "/pub?topic=t", [], b"hello", now=1.0)
    assert (resp.status, resp.body) == (200, b"OK")
    assert resp.headers == [
        ("X-Nsq-Content-Type", "nsq; version=1.0"),
        ("Date", "Tue, 14 Nov 2023 22:13:21 GMT"),
        ("Content-Length", "2"),
        ("Content-Type", "text/plain; charset=utf-8"),
    ]
    assert nsqd.handle("POST", "/mpub?topic=t", [], b"a\n\nb\nc", now=1.0).body == b"OK"
    binary = b"\x00\x00\x00\x02" + b"\x00\x00\x00\x01x" + b"\x00\x00\x00\x02yz"
    assert nsqd.handle("POST", "/mpub?topic=t&binary=true", [], binary, now=1.0).status == 200
    assert nsqd.topic_stats("t").message_count == 6
    c = Client(nsqd, 2.0, identify={"feature_negotiation": True})
    c.subscribe("t", "c", 2.0, rdy=10)
    assert [m.body for m in c.messages()] == [b"hello", b"a", b"b", b"c", b"x", b"yz"]


def test_http_errors() -> None:
    nsqd = Nsqd(NsqdOptions(max_msg_size=4))
    cases = [
        ("POST", "/pub?topic=bad!topic", b"x", 400, "INVALID_TOPIC"),
        ("POST", "/pub", b"x", 400, "MISSING_ARG_TOPIC"),
        ("POST", "/pub?topic=t", b"", 400, "MSG_EMPTY"),
        ("POST", "/pub?topic=t", b"12345", 413, "MSG_TOO_BIG"),
        ("POST", "/pub?topic=t&defer=abc", b"x", 400, "INVALID_DEFER"),
        ("POST", "/pub?topic=t;x", b"x", 400, "INVALID_REQUEST"),
        ("GET", "/nope", b"", 404, "NOT_FOUND"),
        ("GET", "/pub?topic=t", b"", 405, "METHOD_NOT_ALLOWED"),
        ("POST", "/channel/create?topic=missing&channel=c", b"", 404, "TOPIC_NOT_FOUND"),
        ("POST", "/channel/create?topic=t", b"", 400, "MISSING_ARG_CHANNEL"),
    ]
    for method, target, body, status, message in cases:
        resp = nsqd.handle(method, target, [("Content-Length", str(len(body)))], body)
        assert (resp.status, json.loads(resp.body)) == (status, {"message": message}), target
        assert resp.header("Content-Type") == "application/json; charset=utf-8"
    assert nsqd.handle("GET", "/pub").header("Allow") == "OPTIONS, POST"


def test_defer_over_http() -> None:
    nsqd = Nsqd(NsqdOptions(queue_scan_refresh_interval=0.0))
    assert nsqd.handle("POST", "/pub?topic=t&defer=1500", [], b"x", now=0.0).status == 200
    c = Client(nsqd, 0.0, identify={"feature_negotiation": True})
    c.subscribe("t", "c", 0.0, rdy=1)
    nsqd.handle_timer(1.499)
    assert c.messages() == []
    nsqd.handle_timer(1.5)
    assert [m.body for m in c.messages()] == [b"x"]


def test_stats_reports_channel_and_client_counts() -> None:
    nsqd = Nsqd(NsqdOptions(wall_clock_offset=1000.0), now=5.0)
    for body in (b"a", b"bb", b"ccc"):
        nsqd.publish("t", body, 5.0)
    c = Client(nsqd, 6.0, identify={"feature_negotiation": True, "client_id": "me"})
    c.subscribe("t", "c", 6.0, rdy=2)
    resp = nsqd.handle("GET", "/stats?format=json", now=7.0)
    stats = json.loads(resp.body)
    assert stats["start_time"] == 1005
    (topic,) = stats["topics"]
    assert (topic["topic_name"], topic["message_count"], topic["message_bytes"]) == ("t", 3, 6)
    (channel,) = topic["channels"]
    assert (channel["depth"], channel["in_flight_count"], channel["client_count"]) == (1, 2, 1)
    (client,) = channel["clients"]
    assert (client["client_id"], client["ready_count"], client["in_flight_count"]) == ("me", 2, 2)
    assert (client["state"], client["connect_ts"]) == (3, 1006)
    assert stats["producers"] is None
    assert nsqd.stats()["topics"][0]["channels"][0]["depth"] == 1
    filtered = json.loads(nsqd.handle("GET", "/stats?format=json&topic=none").body)
    assert filtered["topics"] is None
    text = nsqd.handle("GET", "/stats").body.decode()
    assert "[t              ] depth: 0" in text and "inflt: 2" in text


def test_info_ping_and_channel_admin() -> None:
    nsqd = Nsqd(NsqdOptions(broadcast_address="10.0.0.1", tcp_port=5000))
    assert nsqd.handle("GET", "/ping").body == b"OK"
    info = json.loads(nsqd.handle("GET", "/info").body)
    assert (info["version"], info["broadcast_address"], info["tcp_port"]) == (
        "1.3.0",
        "10.0.0.1",
        5000,
    )
    assert info["max_heartbeat_interval"] == 60_000_000_000
    assert nsqd.handle("POST", "/topic/create?topic=t").status == 200
    assert nsqd.handle("POST", "/channel/create?topic=t&channel=c").body == b""
    nsqd.publish("t", b"x", 0.0)
    assert nsqd.channel_stats("t", "c").depth == 1
    assert nsqd.handle("POST", "/channel/empty?topic=t&channel=c").status == 200
    assert nsqd.channel_stats("t", "c").depth == 0
    assert nsqd.handle("POST", "/channel/delete?topic=t&channel=c").status == 200
    assert nsqd.channel_names("t") == []
    assert nsqd.handle("POST", "/topic/delete?topic=t").status == 200
    assert nsqd.topic_names() == []


def test_tls_required_refuses_plain_http() -> None:
    nsqd = Nsqd(NsqdOptions(tls=True, tls_required=True, https_port=4443))
    resp = nsqd.handle("POST", "/pub?topic=t", [], b"x")
    assert (resp.status, resp.body) == (403, b'{"message": "TLS_REQUIRED", "https_port": 4443}')
    assert nsqd.handle("POST", "/pub?topic=t", [], b"x", tls=True).status == 200


def test_http_connection_keep_alive_and_bad_request() -> None:
    nsqd = Nsqd()
    http = nsqd.http_connection(0.0)
    http.receive_data(b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\na", 0.0)
    first = http.data_to_send()
    assert first.startswith(b"HTTP/1.1 200 OK\r\n") and first.endswith(b"\r\n\r\nOK")
    assert b"Connection" not in first and not http.closed
    http.receive_data(b"GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 0.1)
    second = http.data_to_send()
    assert second.endswith(b"Connection: close\r\n\r\nOK") and http.closed
    assert nsqd.topic_stats("t").message_count == 1
    bad = nsqd.http_connection(0.0)
    bad.receive_data(b"NOT HTTP AT ALL\r\n\r\n", 0.0)
    assert bad.data_to_send().startswith(b"HTTP/1.1 400 Bad Request\r\n") and bad.closed


def test_http_dates_without_a_clock() -> None:
    import datetime

    from nsq_emulator._util import http_date

    for t in (0, 951782400, 1_700_000_001, 4_102_444_799, 1_795_302_002):
        expected = datetime.datetime.fromtimestamp(t, datetime.UTC).strftime(
            "%a, %d %b %Y %H:%M:%S GMT"
        )
        assert http_date(t) == expected
