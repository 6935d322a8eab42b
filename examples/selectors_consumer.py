"""Consume messages with the sans-IO consumer core on plain blocking sockets and ``selectors``.

    python examples/selectors_consumer.py 127.0.0.1:4150 clicks archive 3

Prints the body of each message on a line and FINishes it; after ``count`` messages it stops
gracefully (CLS, then the close once nsqd answered CLOSE_WAIT) and exits 0.  The core makes
every protocol decision (handshake, RDY, heartbeats, backoff, reconnects, the stop); this
program only moves bytes and time in and out of it.
"""

from __future__ import annotations

import argparse
import selectors
import socket
import sys
import time

from nsq_proto import Close, Connect, Consumer, MessageReceived, Send


def consume(address: str, topic: str, channel: str, count: int) -> None:
    core = Consumer(topic, channel, nsqd_tcp_addresses=[address])
    selector = selectors.DefaultSelector()
    sockets: dict[int, socket.socket] = {}
    received = 0

    def close(conn_id: int) -> None:
        sock = sockets.pop(conn_id, None)
        if sock is not None:
            selector.unregister(sock)
            sock.close()

    def lost(conn_id: int, error: OSError | None) -> None:
        close(conn_id)
        core.connection_lost(conn_id, time.monotonic(), error)

    def carry_out_outputs() -> None:
        nonlocal received
        while (out := core.next_output()) is not None:
            match out:
                case Connect(conn_id=conn_id, host=host, port=port, timeout=dial_timeout):
                    try:
                        sock = socket.create_connection((host, port), timeout=dial_timeout)
                    except OSError as exc:
                        core.connection_lost(conn_id, time.monotonic(), exc)  # retried later
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
                case MessageReceived(conn_id=conn_id, message=message) if received < count:
                    received += 1
                    print(message.body.decode("utf-8", "replace"), flush=True)
                    if received == count:
                        # CLS before the last FIN: the FIN frees no slot for one more message;
                        # the connection closes once nsqd said CLOSE_WAIT and nothing is held
                        core.stop(time.monotonic())
                    core.finish(conn_id, message.id, time.monotonic())
                case MessageReceived(conn_id=conn_id, message=message):
                    # sent by nsqd before it read the CLS: give it back at once
                    core.requeue(conn_id, message.id, time.monotonic(), delay=0.0, backoff=False)

    core.start(time.monotonic())  # a Connect output per nsqd
    while True:
        carry_out_outputs()
        if core.stopped:  # the Stopped event was among the outputs: every connection closed
            break
        deadline = core.next_deadline()  # a heartbeat missed, a reconnect, RDY to move, ...
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
    selector.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("nsqd_tcp_address", help="host:port of nsqd's TCP port")
    parser.add_argument("topic")
    parser.add_argument("channel")
    parser.add_argument("count", type=int, help="messages to consume before stopping")
    args = parser.parse_args()
    if args.count < 1:
        parser.error("count must be at least 1")
    consume(args.nsqd_tcp_address, args.topic, args.channel, args.count)
    return 0


if __name__ == "__main__":
    sys.exit(main())
