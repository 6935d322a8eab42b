"""The emulated nsqlookupd: registrations from the emulated nsqd, and its HTTP API."""

from __future__ import annotations

import json

from nsq_emulator import Lookupd, Nsqd, NsqdOptions
from tests.support.emulator_client import Client

V1 = [("Accept", "application/vnd.nsq; version=1.0")]


def _lookup(lookupd: Lookupd, target: str, now: float = 0.0) -> tuple[int, object]:
    resp = lookupd.handle("GET", target, V1, now=now)
    return resp.status, json.loads(resp.body)


def test_lookupd_follows_registrations() -> None:
    lookupd = Lookupd()
    a = Nsqd(NsqdOptions(tcp_port=4150, http_port=4151, hostname="a"))
    b = Nsqd(NsqdOptions(tcp_port=4250, http_port=4251, hostname="b"))
    lookupd.register(a, remote_address="127.0.0.1:1111")
    lookupd.register(b, remote_address="127.0.0.1:2222")
    assert _lookup(lookupd, "/lookup?topic=t") == (404, {"message": "TOPIC_NOT_FOUND"})
    assert _lookup(lookupd, "/lookup") == (400, {"message": "MISSING_ARG_TOPIC"})
    a.create_channel("t", "c1", 0.0)
    b.create_channel("t", "c2", 0.0)
    status, data = _lookup(lookupd, "/lookup?topic=t")
    assert status == 200
    assert isinstance(data, dict)
    assert data["channels"] == ["c1", "c2"]
    assert [p["tcp_port"] for p in data["producers"]] == [4150, 4250]
    assert data["producers"][0] == {
        "remote_address": "127.0.0.1:1111",
        "hostname": "a",
        "broadcast_address": "127.0.0.1",
        "tcp_port": 4150,
        "http_port": 4151,
        "version": "1.3.0",
    }
    assert _lookup(lookupd, "/topics") == (200, {"topics": ["t"]})
    assert _lookup(lookupd, "/channels?topic=t") == (200, {"channels": ["c1", "c2"]})
    status, nodes = _lookup(lookupd, "/nodes")
    assert isinstance(nodes, dict)
    assert [(n["hostname"], n["topics"], n["tombstones"]) for n in nodes["producers"]] == [
        ("a", ["t"], [False]),
        ("b", ["t"], [False]),
    ]
    # tombstone a producer for the tombstone lifetime
    assert (
        lookupd.handle("POST", "/topic/tombstone?topic=t&node=127.0.0.1:4151", now=10.0).status
        == 200
    )
    _, data = _lookup(lookupd, "/lookup?topic=t", 20.0)
    assert isinstance(data, dict)
    assert [p["hostname"] for p in data["producers"]] == ["b"]
    _, data = _lookup(lookupd, "/lookup?topic=t", 56.0)
    assert isinstance(data, dict)
    assert [p["hostname"] for p in data["producers"]] == ["a", "b"]
    # a stopped nsqd drops its producer entries; the registration stays
    b.stop(60.0)
    _, data = _lookup(lookupd, "/lookup?topic=t", 61.0)
    assert isinstance(data, dict)
    assert [p["hostname"] for p in data["producers"]] == ["a"]
    b.start(62.0)
    _, data = _lookup(lookupd, "/lookup?topic=t", 63.0)
    assert isinstance(data, dict)
    assert len(data["producers"]) == 2


def test_lookupd_ephemeral_channel_goes_with_its_last_consumer() -> None:
    lookupd = Lookupd()
    nsqd = Nsqd()
    lookupd.register(nsqd)
    c = Client(nsqd, 0.0, identify={"feature_negotiation": True})
    c.subscribe("t", "tmp#ephemeral", 0.0)
    assert _lookup(lookupd, "/channels?topic=t")[1] == {"channels": ["tmp#ephemeral"]}
    c.send(b"", 1.0)
    assert _lookup(lookupd, "/channels?topic=t")[1] == {"channels": []}


def test_lookupd_admin_and_plain_endpoints() -> None:
    lookupd = Lookupd()
    ping = lookupd.handle("GET", "/ping")
    assert (ping.body, ping.header("X-Nsq-Content-Type")) == (b"OK", None)
    assert _lookup(lookupd, "/info") == (200, {"version": "1.3.0"})
    assert lookupd.handle("POST", "/topic/create?topic=x").status == 200
    assert _lookup(lookupd, "/lookup?topic=x") == (200, {"channels": [], "producers": []})
    assert lookupd.handle("POST", "/channel/create?topic=x&channel=y").status == 200
    assert _lookup(lookupd, "/channels?topic=x")[1] == {"channels": ["y"]}
    resp = lookupd.handle("POST", "/channel/delete?topic=x&channel=zz")
    assert (resp.status, resp.body) == (404, b'{"message":"CHANNEL_NOT_FOUND"}')
    assert lookupd.handle("POST", "/topic/delete?topic=x").status == 200
    assert _lookup(lookupd, "/topics")[1] == {"topics": []}
    assert _lookup(lookupd, "/nope") == (404, {"message": "NOT_FOUND"})
    http = lookupd.http_connection(0.0)
    http.receive_data(b"GET /topics HTTP/1.1\r\nHost: x\r\n\r\n", 0.0)
    assert http.data_to_send().endswith(b'\r\n\r\n{"topics":[]}')
