"""Publish messages with the sans-IO producer core on plain blocking sockets and ``selectors``.

    python examples/selectors_producer.py 127.0.0.1:4150 clicks one two three

The core makes every protocol decision (handshake, heartbeats, pipelining, matching answers
to requests, retries, timeouts); this program only moves bytes and time in and out of it.
It exits 0 once nsqd acknowledged every message, 1 if one failed.
"""

from __future__ import annotations

import argparse
import selectors
import socket
import sys
import time

from nsq_proto import (
    Close,
    Connect,
    Producer,
    ProducerConfig,
    PublishFailed,
    PublishSucceeded,
    Send,
)


def publish(address: str, topic: str, bodies: list[bytes], timeout: float) -> int:
    core = Producer(ProducerConfig(publish_timeout=timeout), nsqd_tcp_addresses=[address])
    selector = selectors.DefaultSelector()
    sockets: dict[int, socket.socket] = {}
    ids: dict[int, int] = {}  # request id -> the message's place on the command line
    waiting: set[int] = set()  # request ids not answered yet
    failed: list[int] = []

    def close(conn_id: int) -> None:
        sock = sockets.pop(conn_id, None)
        if sock is not None:
            selector.unregister(sock)
            sock.close()

    def lost(conn_id: int, error: OSError | None) -> None:
        close(conn_id)
        core.connection_lost(conn_id, time.monotonic(), error)

    def carry_out_outputs() -> None:
        while (out := core.next_output()) is not None:
            match out:
                case Connect(conn_id=conn_id, host=host, port=port, timeout=dial_timeout):
                    try:
                        sock = socket.create_connection((host, port), timeout=dial_timeout)
                    except OSError as exc:
                        core.connection_lost(conn_id, time.monotonic(), exc)
                        continue
                    sock.settimeout(None)
                    sockets[conn_id] = sock
                    selector.register(sock, selectors.EVENT_READ, conn_id)
                    core.connection_made(conn_id, time.monotonic())
                case Send(conn_id=conn_id, data=data) if conn_id in sockets:
                    try:
                        sockets[conn_id].sendall(data)
                    except OSError as exc:
                        lost(conn_id, exc)
                case Close(conn_id=conn_id):
                    close(conn_id)  # the core knows: no connection_lost call
                case PublishSucceeded(request_id=request_id):
                    waiting.discard(request_id)
                case PublishFailed(request_id=request_id, error=error):
                    print(f"message {ids[request_id]} failed: {error}", file=sys.stderr)
                    failed.append(request_id)
                    waiting.discard(request_id)

    core.start(time.monotonic())  # a Connect output per connection of the pool
    for n, body in enumerate(bodies, 1):
        ids[core.publish(topic, body, time.monotonic())] = n
    waiting.update(ids)
    while True:
        carry_out_outputs()
        if not waiting:
            break
        deadline = core.next_deadline()  # a heartbeat to miss, a publish to time out, ...
        wait = None if deadline is None else max(0.0, deadline - time.monotonic())
        for key, _ in selector.select(wait):
            sock = sockets.get(key.data)
            if sock is None:
                continue  # closed while handling another socket
            try:
                data = sock.recv(65536)
            except OSError as exc:
                lost(key.data, exc)
                continue
            if data:
                core.receive_data(key.data, data, time.monotonic())
            else:
                lost(key.data, None)  # nsqd closed the connection
        core.handle_timer(time.monotonic())  # early does nothing; late catches up
    core.close(time.monotonic())
    carry_out_outputs()
    for conn_id in list(sockets):
        close(conn_id)
    selector.close()
    if failed:
        return 1
    print(f"published {len(bodies)} messages to {topic!r}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("nsqd_tcp_address", help="host:port of nsqd's TCP port")
    parser.add_argument("topic")
    parser.add_argument("bodies", nargs="+", help="one message per argument")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds per message")
    args = parser.parse_args()
    bodies = [body.encode() for body in args.bodies]
    return publish(args.nsqd_tcp_address, args.topic, bodies, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
