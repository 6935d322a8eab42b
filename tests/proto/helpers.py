"""Builders for server frames and a ready-made connection, shared by the core's tests."""

from __future__ import annotations

import json
import random
from types import MappingProxyType
from typing import Any

from nsq_emulator.frames import encode_message_data
from nsq_proto import (
    Connect,
    Connection,
    ConnectionConfig,
    ConnectionState,
    Consumer,
    ConsumerConfig,
    Event,
    HttpRequest,
    LookupResult,
    Output,
    Peer,
    Producer,
    ProducerConfig,
    Send,
    TopicMeta,
)
from nsq_proto.wire import encode_frame

IDENTIFY_JSON: dict[str, Any] = {
    "max_rdy_count": 2500,
    "version": "1.3.0",
    "max_msg_timeout": 900000,
    "msg_timeout": 60000,
    "tls_v1": False,
    "deflate": False,
    "deflate_level": 6,
    "max_deflate_level": 6,
    "snappy": False,
    "sample_rate": 0,
    "auth_required": False,
    "output_buffer_size": 16384,
    "output_buffer_timeout": 250,
}


def response(data: bytes) -> bytes:
    return encode_frame(0, data)


def error(data: bytes) -> bytes:
    return encode_frame(1, data)


def identify_response(**changes: Any) -> bytes:
    body = dict(IDENTIFY_JSON)
    body.update(changes)
    return response(json.dumps(body, separators=(",", ":")).encode())


def message(msg_id: bytes, body: bytes, attempts: int = 1, timestamp: int = 1) -> bytes:
    return encode_frame(2, encode_message_data(msg_id, timestamp, attempts, body))


def mid(i: int) -> bytes:
    return f"{i:016x}".encode()


def sent(outputs: list[Output]) -> bytes:
    return b"".join(o.data for o in outputs if isinstance(o, Send))


def events(outputs: list[Output]) -> list[Event]:
    return [o for o in outputs if isinstance(o, Event)]


def state_of(conn: Connection) -> ConnectionState:
    """``conn.state``, read through a call: mypy carries an earlier ``assert conn.state is X``
    past the calls that change the state, and would take a later check for another state as
    one that can never hold."""
    return conn.state


def ready_connection(now: float = 0.0, **config: Any) -> Connection:
    conn = Connection(ConnectionConfig(**config))
    conn.connection_made(now)
    conn.receive_data(identify_response(), now)
    conn.outputs()
    return conn


def subscribed_connection(now: float = 0.0, **config: Any) -> Connection:
    conn = ready_connection(now, **config)
    conn.subscribe("t", "c")
    conn.receive_data(response(b"OK"), now)
    conn.outputs()
    return conn


def sent_on(outputs: list[Output], conn_id: int) -> bytes:
    return b"".join(o.data for o in outputs if isinstance(o, Send) and o.conn_id == conn_id)


def of_type(outputs: list[Output], kind: type[Any]) -> list[Any]:
    return [o for o in outputs if isinstance(o, kind)]


def consumer(n: int = 1, **config: Any) -> tuple[Consumer, list[int]]:
    """A consumer subscribed on ``n`` nsqd (RDY sent), its outputs drained."""
    core = Consumer(
        "t",
        "c",
        ConsumerConfig(**config),
        nsqd_tcp_addresses=[f"10.0.0.{i}:4150" for i in range(n)],
        rng=random.Random(7),
    )
    core.start(0.0)
    conns = [o.conn_id for o in core.outputs() if isinstance(o, Connect)]
    for c in conns:
        core.connection_made(c, 0.0)
        core.receive_data(c, identify_response(), 0.0)
        core.receive_data(c, response(b"OK"), 0.0)
    core.outputs()
    return core, conns


def producer(**config: Any) -> tuple[Producer, int]:
    """A producer with one ready connection to one nsqd, its outputs drained."""
    core = Producer(ProducerConfig(**config), nsqd_tcp_addresses=["n1:4150"], rng=random.Random(0))
    core.start(0.0)
    (connect,) = of_type(core.outputs(), Connect)
    core.connection_made(connect.conn_id, 0.0)
    core.receive_data(connect.conn_id, identify_response(), 0.0)
    core.outputs()
    return core, connect.conn_id


def http_response(body: bytes, status: bytes = b"200 OK") -> bytes:
    """An HTTP/1.1 answer of lookupd or nsqd carrying the JSON ``body``."""
    head = (
        f"HTTP/1.1 {status.decode()}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


def peer(host: str) -> str:
    return (
        f'{{"id":"{host}","remote_address":"{host}","hostname":"{host}",'
        f'"broadcast_address":"{host}","tcp_port":4150,"http_port":4151,'
        f'"version":"0.3.7-HA.1.13.0","distributed_id":""}}'
    )


PARTITIONED_LOOKUP = (
    '{"status_code":200,"status_txt":"OK","data":{"channels":[],"meta":{"partition_num":2,'
    '"replica":1,"extend_support":false,"ordered":false,"multi_part":false,'
    '"disable_channel_auto_create":false},"producers":[],"partitions":{'
    f'"0":{peer("n1")},"1":{peer("n2")}}}}}}}'
).encode()


def standard_lookup(*hosts: str) -> bytes:
    producers = ",".join(
        f'{{"remote_address":"{h}:1","hostname":"{h}","broadcast_address":"{h}",'
        f'"tcp_port":4150,"http_port":4151,"version":"1.3.0"}}'
        for h in hosts
    )
    return f'{{"channels":["c"],"producers":[{producers}]}}'.encode()


def requests_by_target(outputs: list[Output]) -> dict[tuple[str, str], HttpRequest]:
    """HttpRequest outputs by (host, the request line's path without the query)."""
    found = {}
    for o in of_type(outputs, HttpRequest):
        path = o.data.split(b" ", 2)[1].split(b"?")[0].decode()
        found[(o.host, path)] = o
    return found


def lookup_peer(host: str) -> Peer:
    """The Peer lookupd names for ``host`` (standard ports)."""
    return Peer(broadcast_address=host, tcp_port=4150, http_port=4151, hostname=host, version="")


def partitioned_result(*hosts: str, num: int | None = None, ordered: bool = False) -> LookupResult:
    """A parsed lookup of a partitioned topic: partition i led by ``hosts[i]``."""
    meta = TopicMeta(partition_num=len(hosts) if num is None else num, replica=1, ordered=ordered)
    parts = MappingProxyType({pid: lookup_peer(h) for pid, h in enumerate(hosts)})
    return LookupResult(partitions=parts, meta=meta)
