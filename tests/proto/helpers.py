"""Builders for server frames and a ready-made connection, shared by the core's tests."""

from __future__ import annotations

import json
from typing import Any

from nsq_emulator.frames import encode_message_data
from nsq_proto import Connection, ConnectionConfig, ConnectionState, Event, Output, Send
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
