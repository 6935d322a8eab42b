"""``_core.py``: the connection table alone (real connections, a recording drain, no core);
the reconnect scheduler both cores share, and the base core's ``__init__``."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from nsq_proto import (
    Close,
    ConfigError,
    ConnectionClosed,
    ConnectionConfig,
    ConnectionState,
    Consumer,
    Output,
    Producer,
    Ready,
    RemoteProtocolError,
    Send,
)
from nsq_proto import Connection as Conn
from nsq_proto._core import ConnectionTable, ReconnectScheduler, reconnect_delay

from .helpers import identify_response


@dataclass
class Rec:
    conn: Conn


class Table:
    """A table whose drain records (connection id, outputs taken) in order."""

    def __init__(self) -> None:
        self.drained: list[tuple[int, list[Output]]] = []
        self.table: ConnectionTable[Rec] = ConnectionTable(self.drain)

    def drain(self, rec: Rec, now: float) -> None:
        self.drained.append((rec.conn.conn_id, rec.conn.outputs()))

    def add(self, **config: float) -> Rec:
        conn_id = self.table.new_id()
        rec = Rec(Conn(ConnectionConfig(**config), conn_id))  # type: ignore[arg-type]
        self.table.add(conn_id, rec)
        return rec

    def take(self) -> list[tuple[int, list[Output]]]:
        drained, self.drained = self.drained, []
        return drained


def test_ids_start_at_1_and_are_never_given_twice() -> None:
    t = Table()
    a, b = t.add(), t.add()
    assert (a.conn.conn_id, b.conn.conn_id) == (1, 2)
    t.table.remove(2)
    t.table.remove(2)  # gone already: nothing
    assert t.add().conn.conn_id == 3
    assert list(t.table.by_id) == [1, 3] and len(t.table) == 2


def test_each_transport_call_goes_to_its_connection_which_is_drained_after_it() -> None:
    t = Table()
    a, b = t.add(), t.add()
    assert t.table.connection_made(2, 0.0) is b
    ((conn_id, out),) = t.take()
    assert conn_id == 2 and isinstance(out[0], Send) and out[0].data.startswith(b"  V2")
    assert a.conn.state is ConnectionState.INIT
    assert t.table.receive_data(2, identify_response(), 0.1) is b
    ((conn_id, out),) = t.take()
    assert conn_id == 2 and any(isinstance(o, Ready) for o in out)
    assert t.table.connection_lost(2, 0.2, None) is b
    ((conn_id, out),) = t.take()
    assert any(isinstance(o, ConnectionClosed) for o in out)


def test_calls_naming_an_id_the_table_does_not_hold_are_ignored() -> None:
    t = Table()
    t.add()
    assert t.table.connection_made(7, 0.0) is None
    assert t.table.tls_established(7, 0.0) is None
    assert t.table.receive_data(7, b"x", 0.0) is None
    assert t.table.connection_lost(7, 0.0, OSError()) is None
    assert t.take() == []


def test_bytes_that_break_the_protocol_close_that_connection_without_raising() -> None:
    t = Table()
    rec = t.add()
    t.table.connection_made(1, 0.0)
    t.take()
    assert t.table.receive_data(1, b"\x00\x00\x00\x06\x00\x00\x00\x09junk", 0.1) is rec
    ((_, out),) = t.take()
    assert any(isinstance(o, Close) for o in out)
    (closed,) = [o for o in out if isinstance(o, ConnectionClosed)]
    assert isinstance(closed.error, RemoteProtocolError)


def test_the_next_deadline_is_the_earliest_of_the_connections() -> None:
    t = Table()
    assert t.table.next_deadline() is None
    t.add(handshake_timeout=5.0)
    t.add(handshake_timeout=2.0)
    t.add()
    t.table.connection_made(1, 0.0)
    t.table.connection_made(2, 1.0)
    assert t.table.next_deadline() == 3.0
    t.take()


def test_a_timer_fires_only_the_connections_due_each_drained_after_its_own() -> None:
    t = Table()
    t.add(handshake_timeout=5.0)
    t.add(handshake_timeout=2.0)
    t.table.connection_made(1, 0.0)
    t.table.connection_made(2, 0.0)
    t.take()
    t.table.handle_timer(1.9)
    assert t.take() == []
    t.table.handle_timer(2.0)
    ((conn_id, out),) = t.take()
    assert conn_id == 2 and any(isinstance(o, ConnectionClosed) for o in out)
    t.table.remove(2)
    assert t.table.next_deadline() == 5.0


def test_drain_all_drains_every_connection_in_id_order_even_as_the_drain_removes_them() -> None:
    removed: list[int] = []
    table: ConnectionTable[Rec]

    def drain(rec: Rec, now: float) -> None:
        removed.append(rec.conn.conn_id)
        table.remove(rec.conn.conn_id)

    table = ConnectionTable(drain)
    for _ in range(3):
        conn_id = table.new_id()
        table.add(conn_id, Rec(Conn(ConnectionConfig(), conn_id)))
    table.drain_all(0.0)
    assert removed == [1, 2, 3] and len(table) == 0


def test_reconnect_scheduler_doubles_up_to_the_cap_per_target() -> None:
    scheduler = ReconnectScheduler(random.Random(0), base=1.0, cap=5.0, jitter=0.0)
    assert [scheduler.delay("a") for _ in range(4)] == [1.0, 2.0, 4.0, 5.0]
    assert scheduler.delay("b") == 1.0
    scheduler.connected("a")
    assert scheduler.delay("a") == 1.0
    assert reconnect_delay(2, 1.0, 5.0, 0.5, 1.0) == 1.0


def test_both_cores_check_their_addresses_and_have_a_reconnect_scheduler() -> None:
    consumer = Consumer("t", "c", nsqd_tcp_addresses=["n:4150"])
    producer = Producer(nsqd_tcp_addresses=[("n", 4150)])
    for core in (consumer, producer):
        assert isinstance(core._reconnects, ReconnectScheduler)
        assert core._nsqd == [("n", 4150)]
    for make in (
        lambda: Consumer("t", "c"),
        lambda: Producer(),
        lambda: Producer(nsqd_tcp_addresses=["nohost"]),
        lambda: Consumer("t", "c", lookupd_http_addresses=["l:0"]),
    ):
        with pytest.raises(ConfigError):
            make()
