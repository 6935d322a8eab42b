"""The consumer side of a connection: SUB, RDY, FIN, REQ, TOUCH, CLS and NOP, and the
delivery of messages the node's pump hands to a subscribed client."""

from __future__ import annotations

import random

from nsq_proto.wire import CLOSE_WAIT, OK, FrameType

from ._conn_core import ConnectionCore, Handler
from ._store import Channel, StoredMessage
from ._util import go_quote, parse_base10, to_int64
from ._wire import MS, ClientError, ClientState, Proto, fatal, valid_name
from .frames import encode_message_data

__all__ = ["ConsumerCommands"]


class ConsumerCommands(ConnectionCore):
    """The consumer commands of a connection, and message delivery."""

    def _consumer_commands(self) -> dict[bytes, Handler]:
        return {
            b"SUB": self._sub,
            b"RDY": self._rdy,
            b"FIN": self._fin,
            b"REQ": self._req,
            b"TOUCH": self._touch,
            b"CLS": self._cls,
            b"NOP": self._nop,
        }

    # -- delivery (called by the node's pump and by channels) ---------------------------------

    def message_timed_out(self) -> None:
        """A message in flight to this client timed out (the channel requeued it)."""
        self.in_flight_count -= 1
        self._dirty_own_channel()

    def sampled_out(self, rng: random.Random) -> bool:
        """Whether sampling (IDENTIFY ``sample_rate``) skips the next message; draws from
        ``rng`` only when the client samples."""
        return self._pump_sample_rate > 0 and rng.randrange(100) > self._pump_sample_rate

    def filters_out(self, msg: StoredMessage, *, ext_topic: bool) -> bool:
        """Whether the client's ``ext_filter`` (partitioned server) rejects ``msg``."""
        matches = self._ext_filter
        return matches is not None and ext_topic and not matches(msg)

    def deliver(self, msg: StoredMessage, now: float) -> None:
        """The pump hands this client a message."""
        channel = self.channel
        assert channel is not None
        msg.attempts = (msg.attempts + 1) & 0xFFFF
        channel.start_in_flight(msg, self.id, now, self._pump_msg_timeout)
        self.in_flight_count += 1
        self.message_count += 1
        self._send_frame(FrameType.MESSAGE, self._message_data(msg))
        if not self._ready_for_messages():
            self.flush()

    def _message_data(self, msg: StoredMessage) -> bytes:
        return encode_message_data(msg.id, msg.timestamp, msg.attempts, msg.body)

    def _dirty_own_channel(self) -> None:
        """The node's pump may deliver on this client's channel again."""
        if self.channel is not None:
            self._node.dirty_channel(self.channel)

    # -- commands -----------------------------------------------------------------------------

    def _sub(self, params: list[bytes]) -> Proto:
        if self.state != ClientState.INIT:
            raise fatal("E_INVALID", "cannot SUB in current state")
        if self.heartbeat_interval <= 0:
            raise fatal("E_INVALID", "cannot SUB with heartbeats disabled")
        if len(params) < 3:
            raise fatal("E_INVALID", "SUB insufficient number of parameters")
        topic_name, channel_name = params[1], params[2]
        if not valid_name(topic_name):
            raise fatal("E_BAD_TOPIC", b"SUB topic name " + go_quote(topic_name) + b" is not valid")
        if not valid_name(channel_name, channel=True):
            raise fatal(
                "E_BAD_CHANNEL", b"SUB channel name " + go_quote(channel_name) + b" is not valid"
            )
        self._check_auth("SUB", topic_name, channel_name)
        node = self._node
        topic = node.get_topic(topic_name.decode(), self._now)
        channel = node.get_channel(topic, channel_name.decode(), self._now)
        limit = node.options.max_channel_consumers
        if limit and len(channel.clients) >= limit:
            raise fatal(
                "E_SUB_FAILED",
                f"SUB failed consumers for {topic.name}:{channel.name} exceeds limit of {limit}",
            )
        self._subscribe(channel)
        return OK
        yield  # pragma: no cover

    def _subscribe(self, channel: Channel) -> None:
        channel.clients[self.id] = self
        self.state = ClientState.SUBSCRIBED
        self.channel = channel
        self._node.dirty_channel(channel)

    def _rdy(self, params: list[bytes]) -> Proto:
        if self.state == ClientState.CLOSING:
            return None
        if self.state != ClientState.SUBSCRIBED:
            raise fatal("E_INVALID", "cannot RDY in current state")
        count = 1
        if len(params) > 1:
            parsed = parse_base10(params[1])
            if parsed is None:
                raise fatal("E_INVALID", b"RDY could not parse count " + params[1])
            count = to_int64(parsed)
        limit = self._node.options.max_rdy_count
        if count < 0 or count > limit:
            raise fatal("E_INVALID", f"RDY count {count} out of range 0-{limit}")
        self._set_ready(count)
        return None
        yield  # pragma: no cover

    def _set_ready(self, count: int) -> None:
        self.ready_count = count
        self._dirty_own_channel()
        if not self._ready_for_messages():
            self.flush()

    def _check_consume_state(self, cmd: str) -> Channel:
        if self.state not in (ClientState.SUBSCRIBED, ClientState.CLOSING):
            raise fatal("E_INVALID", f"cannot {cmd} in current state")
        channel = self.channel
        assert channel is not None
        return channel

    def _message_id(self, raw: bytes) -> bytes:
        if len(raw) != 16:
            raise fatal("E_INVALID", "invalid message ID")
        return raw

    def _fin(self, params: list[bytes]) -> Proto:
        channel = self._check_consume_state("FIN")
        if len(params) < 2:
            raise fatal("E_INVALID", "FIN insufficient number of params")
        msg_id = self._message_id(params[1])
        problem = channel.finish(self.id, msg_id)
        if problem is not None:
            raise ClientError(
                "E_FIN_FAILED",
                b"FIN " + msg_id + b" failed " + problem.encode(),
                fatal=False,
            )
        self.finish_count += 1
        self.in_flight_count -= 1
        self._dirty_own_channel()
        return None
        yield  # pragma: no cover

    def _req(self, params: list[bytes]) -> Proto:
        channel = self._check_consume_state("REQ")
        if len(params) < 3:
            raise fatal("E_INVALID", "REQ insufficient number of params")
        msg_id = self._message_id(params[1])
        parsed = parse_base10(params[2])
        if parsed is None:
            raise fatal("E_INVALID", b"REQ could not parse timeout " + params[2])
        delay_ns = to_int64(to_int64(parsed) * MS)
        max_ns = round(self._node.options.max_req_timeout * 1e9)
        delay_ns = min(max(delay_ns, 0), max_ns)
        problem = channel.requeue(self.id, msg_id, delay_ns / 1e9, self._now)
        if problem is not None:
            raise ClientError(
                "E_REQ_FAILED",
                b"REQ " + msg_id + b" failed " + problem.encode(),
                fatal=False,
            )
        self.requeue_count += 1
        self.in_flight_count -= 1
        self._dirty_own_channel()
        self._node.dirty_channel(channel)
        return None
        yield  # pragma: no cover

    def _touch(self, params: list[bytes]) -> Proto:
        channel = self._check_consume_state("TOUCH")
        if len(params) < 2:
            raise fatal("E_INVALID", "TOUCH insufficient number of params")
        msg_id = self._message_id(params[1])
        problem = channel.touch(
            self.id, msg_id, self._now, self.msg_timeout, self._node.options.max_msg_timeout
        )
        if problem is not None:
            raise ClientError(
                "E_TOUCH_FAILED",
                b"TOUCH " + msg_id + b" failed " + problem.encode(),
                fatal=False,
            )
        return None
        yield  # pragma: no cover

    def _cls(self, params: list[bytes]) -> Proto:
        if self.state != ClientState.SUBSCRIBED:
            raise fatal("E_INVALID", "cannot CLS in current state")
        self._set_ready(0)
        self.state = ClientState.CLOSING
        return CLOSE_WAIT
        yield  # pragma: no cover

    def _nop(self, params: list[bytes]) -> Proto:
        return None
        yield  # pragma: no cover
