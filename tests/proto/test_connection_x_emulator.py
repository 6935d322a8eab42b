"""The project's client core wired to the emulator in memory (no sockets)."""

from __future__ import annotations

import pytest

from nsq_emulator import Nsqd, NsqdConnection
from nsq_proto import (
    Connection,
    ConnectionConfig,
    HeartbeatReceived,
    MessageReceived,
    Ready,
    Send,
    Subscribed,
)


def pump(client: Connection, server: NsqdConnection, now: float) -> list[object]:
    """Move bytes both ways until both sides are quiet; return the client's events."""
    events: list[object] = []
    for _ in range(50):
        moved = False
        for out in client.outputs():
            if isinstance(out, Send):
                server.receive_data(out.data, now)
                moved = True
            else:
                events.append(out)
        data = server.data_to_send()
        if data:
            client.receive_data(data, now)
            moved = True
        if not moved:
            return events
    raise AssertionError("the two sides never went quiet")


@pytest.mark.parametrize("compression", ["none", "snappy", "deflate"])
def test_consume_through_the_client_core(compression: str) -> None:
    nsqd = Nsqd()
    server = nsqd.accept(0.0)
    config = ConnectionConfig(
        heartbeat_interval=1.0,
        snappy=compression == "snappy",
        deflate=compression == "deflate",
    )
    client = Connection(config)
    client.connection_made(0.0)
    events = pump(client, server, 0.0)
    ready = [e for e in events if isinstance(e, Ready)]
    assert ready and ready[0].features.snappy == (compression == "snappy")
    client.subscribe("t", "c")
    client.rdy(2)
    assert any(isinstance(e, Subscribed) for e in pump(client, server, 0.1))
    for body in (b"one", b"two", b"three"):
        nsqd.publish("t", body, 0.2)
    got = [e.message for e in pump(client, server, 0.2) if isinstance(e, MessageReceived)]
    assert [m.body for m in got] == [b"one", b"two"]
    client.finish(got[0].id)
    got += [e.message for e in pump(client, server, 0.3) if isinstance(e, MessageReceived)]
    assert [m.body for m in got] == [b"one", b"two", b"three"]
    nsqd.handle_timer(1.0)
    assert any(isinstance(e, HeartbeatReceived) for e in pump(client, server, 1.0))
    assert server.ready_count == 2 and server.in_flight_count == 2
