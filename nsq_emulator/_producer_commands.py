"""The producer side of a connection: PUB, MPUB and DPUB."""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any, TypeVar

from nsq_proto.wire import OK

from ._conn_core import ConnectionCore, Handler
from ._util import go_quote, parse_base10, to_int64
from ._wire import MS, Proto, Read, Step, fatal, valid_name

__all__ = ["ProducerCommands"]

T = TypeVar("T")


class ProducerCommands(ConnectionCore):
    """The producer commands of a connection."""

    def _producer_commands(self) -> dict[bytes, Handler]:
        return {b"PUB": self._pub, b"MPUB": self._mpub, b"DPUB": self._dpub}

    def _read_mpub_messages(
        self, convert: Callable[[int, bytes], T]
    ) -> Generator[Step, Any, list[T]]:
        """MPUB's message count and messages, each checked as read and passed to ``convert``
        (which may raise, leaving the rest of the batch unread as nsqd does)."""
        opts = self._node.options
        count = yield from self._read_len(fatal("E_BAD_BODY", "MPUB failed to read message count"))
        if count <= 0 or count > (opts.max_body_size - 4) // 5:
            raise fatal("E_BAD_BODY", f"MPUB invalid message count {count}")
        items: list[T] = []
        for i in range(count):
            msize = yield from self._read_len(
                fatal("E_BAD_MESSAGE", f"MPUB failed to read message({i}) body size")
            )
            if msize <= 0:
                raise fatal("E_BAD_MESSAGE", f"MPUB invalid message({i}) body size {msize}")
            if msize > opts.max_msg_size:
                raise fatal("E_BAD_MESSAGE", f"MPUB message too big {msize} > {opts.max_msg_size}")
            data = yield Read(msize, fatal("E_BAD_MESSAGE", "MPUB failed to read message body"))
            items.append(convert(i, data))
        return items

    def _published(self, topic: str, count: int) -> None:
        self.pub_counts[topic] = self.pub_counts.get(topic, 0) + count

    def _pub(self, params: list[bytes]) -> Proto:
        if len(params) < 2:
            raise fatal("E_INVALID", "PUB insufficient number of parameters")
        topic_name = params[1]
        if not valid_name(topic_name):
            raise fatal("E_BAD_TOPIC", b"PUB topic name " + go_quote(topic_name) + b" is not valid")
        body = yield from self._read_body("PUB")
        self._check_auth("PUB", topic_name, b"")
        name = topic_name.decode()
        node = self._node
        topic = node.get_topic(name, self._now)
        node.put(topic, node.new_message(topic, body, self._now), self._now)
        self._published(name, 1)
        return OK

    def _read_body(self, command: str) -> Generator[Step, Any, bytes]:
        """The size-prefixed body of a PUB or DPUB, checked as nsqd checks it."""
        max_size = self._node.options.max_msg_size
        size = yield from self._read_len(
            fatal("E_BAD_MESSAGE", f"{command} failed to read message body size")
        )
        if size <= 0:
            raise fatal("E_BAD_MESSAGE", f"{command} invalid message body size {size}")
        if size > max_size:
            raise fatal("E_BAD_MESSAGE", f"{command} message too big {size} > {max_size}")
        body: bytes = yield Read(
            size, fatal("E_BAD_MESSAGE", f"{command} failed to read message body")
        )
        return body

    def _mpub(self, params: list[bytes]) -> Proto:
        opts = self._node.options
        if len(params) < 2:
            raise fatal("E_INVALID", "MPUB insufficient number of parameters")
        topic_name = params[1]
        if not valid_name(topic_name):
            raise fatal(
                "E_BAD_TOPIC",
                b"E_BAD_TOPIC MPUB topic name " + go_quote(topic_name) + b" is not valid",
            )
        self._check_auth("MPUB", topic_name, b"")
        name = topic_name.decode()
        node = self._node
        topic = node.get_topic(name, self._now)
        size = yield from self._read_len(fatal("E_BAD_BODY", "MPUB failed to read body size"))
        if size <= 0:
            raise fatal("E_BAD_BODY", f"MPUB invalid body size {size}")
        if size > opts.max_body_size:
            raise fatal("E_BAD_BODY", f"MPUB body too big {size} > {opts.max_body_size}")
        bodies = yield from self._read_mpub_messages(lambda i, body: body)
        messages = [node.new_message(topic, body, self._now) for body in bodies]
        for msg in messages:
            node.put(topic, msg, self._now)
        self._published(name, len(messages))
        return OK

    def _dpub(self, params: list[bytes]) -> Proto:
        opts = self._node.options
        if len(params) < 3:
            raise fatal("E_INVALID", "DPUB insufficient number of parameters")
        topic_name = params[1]
        if not valid_name(topic_name):
            raise fatal(
                "E_BAD_TOPIC", b"DPUB topic name " + go_quote(topic_name) + b" is not valid"
            )
        parsed = parse_base10(params[2])
        if parsed is None:
            raise fatal("E_INVALID", b"DPUB could not parse timeout " + params[2])
        delay_ns = to_int64(to_int64(parsed) * MS)
        max_ms = round(opts.max_req_timeout * 1000)
        if delay_ns < 0 or delay_ns > max_ms * MS:
            raise fatal("E_INVALID", f"DPUB timeout {parsed} out of range 0-{max_ms}")
        body = yield from self._read_body("DPUB")
        self._check_auth("DPUB", topic_name, b"")
        name = topic_name.decode()
        node = self._node
        topic = node.get_topic(name, self._now)
        msg = node.new_message(topic, body, self._now)
        msg.deferred = delay_ns / 1e9
        node.put(topic, msg, self._now)
        self._published(name, 1)
        return OK
