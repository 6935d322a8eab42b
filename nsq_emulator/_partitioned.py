"""The server side of a connection to the partitioned nsqd (the partitioned NSQ extension).

Differences from the standard server, as the partitioned server implements them:

* topics are ``(name, partition)`` and are never created by PUB or SUB (fatal
  ``E_TOPIC_NOT_EXIST `` with its trailing space); a partition token is recognised only by
  the exact token count (3 for the PUB family, 4 for the SUB family);
* ``PUB_TRACE``/``MPUB_TRACE`` answer with the 30-byte traced response, ``PUB_EXT``/
  ``MPUB_EXT`` carry a JSON header, ``SUB_ORDERED``/``SUB_ADVANCED`` add the 12-byte queue
  position to message frames, ``INTERNAL_CREATE_TOPIC`` creates a partition (standalone);
  there is no ``DPUB``;
* message ids are binary: internal id (u64, +1 per message in a partition) and trace id;
  FIN/REQ/TOUCH are parsed by fixed offsets, not split on spaces;
* the read timeout is three heartbeat intervals, messages in flight to a client that goes
  away are requeued at once, and several error texts differ.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Generator
from typing import Any, ClassVar, Self

from nsq_proto import TraceReceipt
from nsq_proto.wire import OK, FrameType

from ._conn_core import Handler
from ._ext_filter import build_ext_filter
from ._identify import IdentifyData
from ._node import PartitionedNode
from ._protocol import NsqdConnection
from ._store import Channel, StoredMessage, Topic
from ._util import (
    GoValueError,
    go_atoi,
    go_bytes_list,
    go_quote,
    parse_base10,
    parse_start_position,
    to_int64,
)
from ._wire import MS, ClientError, ClientState, Proto, Read, Step, fatal, nonfatal, valid_name
from .frames import encode_message_data, encode_trace_receipt

__all__ = ["PartitionedConnection", "MAX_ATTEMPTS"]

#: the partitioned server caps the attempts field
MAX_ATTEMPTS = 4000
_DEFAULT_WRITE_BUFFER = 100
_CONSUMER_WRITE_BUFFER = 4 * 1024
_MAX_TAG_LEN = 100
_unpack_u16 = struct.Struct(">H").unpack_from
_unpack_u64 = struct.Struct(">Q").unpack_from

E_TOPIC_NOT_EXIST = "E_TOPIC_NOT_EXIST"
E_NOT_LEADER = "E_FAILED_ON_NOT_LEADER"
E_NOT_WRITABLE = "E_FAILED_ON_NOT_WRITABLE"


def parse_consume_offset(raw: bytes) -> tuple[str, int]:
    """``ConsumeOffset.FromBytes``: ``type:int64``; raises ClientError (fatal E_INVALID)."""
    try:
        return parse_start_position(raw)
    except ValueError as exc:
        raise fatal("E_INVALID", str(exc)) from None


class PartitionedConnection(NsqdConnection):
    """A client connection to the partitioned nsqd."""

    partitioned = True

    _node: PartitionedNode[Self]

    def __init__(
        self, node: PartitionedNode[Self], client_id: int, now: float, remote_address: str
    ) -> None:
        super().__init__(node, client_id, now, remote_address)
        self.client_id = remote_address
        self.hostname = remote_address
        self.output_buffer_size = 0
        self.output_buffer_timeout = min(0.05, node.options.max_output_buffer_timeout)
        self._writer.size = _DEFAULT_WRITE_BUFFER

    def _command_table(self) -> dict[bytes, Handler]:
        table = super()._command_table()
        del table[b"DPUB"]
        table.update(
            {
                b"PUB_TRACE": self._pub_trace,
                b"PUB_EXT": self._pub_ext,
                b"MPUB_TRACE": self._mpub_trace,
                b"MPUB_EXT": self._mpub_ext,
                b"SUB_ADVANCED": self._sub_advanced,
                b"SUB_ORDERED": self._sub_ordered,
                b"INTERNAL_CREATE_TOPIC": self._internal_create_topic,
            }
        )
        return table

    @property
    def _read_timeout_intervals(self) -> int:
        return 3

    # -- line reading and dispatch -------------------------------------------------------

    def _accept_client(self) -> Generator[Step, Any, bool]:
        limit = self._node.options.max_conn_for_client
        if limit and len(self._node.connections) > limit:
            self._send_frame(FrameType.ERROR, b"too much client connections")
            self.close_reason = "too much client connections"
            return False
        return True
        yield  # pragma: no cover

    def _read_params(self, line: bytes) -> Generator[Step, Any, list[bytes]]:
        """FIN/REQ/TOUCH are read by position: the binary id may hold ``\\n`` or spaces."""
        head3 = line[:3]
        if len(line) >= 3 and head3 in (b"FIN", b"REQ"):
            if len(line) < 21:
                need = 20 - len(line)
                if need > 0:
                    line += yield Read(need, None)
                line += yield Read(-1, None)
            params = [line[:3]]
            if len(line) >= 21:
                params.append(line[4:20])
                if head3 == b"REQ" and len(line) >= 22:
                    params.append(line[21:-1])
            return params
        if len(line) >= 5 and line[:5] == b"TOUCH":
            if len(line) < 23:
                line += yield Read(23 - len(line), None)
            params = [line[:5]]
            if len(line) >= 23:
                params.append(line[6:22])
            return params
        body = line[:-1]
        if body.endswith(b"\r"):
            body = body[:-1]
        return body.split(b" ")

    def _invalid_command(self, params: list[bytes]) -> ClientError:
        return fatal("E_INVALID", b"invalid command " + go_bytes_list(params))

    def _auth_text(self, text: str) -> str:
        return {
            "AUTH already set": "AUTH Already set",
            "AUTH disabled": "AUTH Disabled",
            "AUTH no authorizations found": "AUTH No authorizations found",
        }.get(text, text)

    _BODY_COMMANDS: ClassVar[frozenset[bytes]] = frozenset(
        {
            b"IDENTIFY",
            b"AUTH",
            b"PUB",
            b"MPUB",
            b"PUB_TRACE",
            b"MPUB_TRACE",
            b"PUB_EXT",
            b"MPUB_EXT",
        }
    )

    # -- IDENTIFY ---------------------------------------------------------------------------

    def _deflate_level(self, deflate: bool, asked: int) -> int:
        # the partitioned server computes 6 for a missing level, then overwrites it
        if not deflate:
            return 0
        return min(asked, self._node.options.max_deflate_level)

    def _identify_response(
        self, tls: bool, deflate: bool, level: int, snappy: bool
    ) -> dict[str, Any]:
        resp = super()._identify_response(tls, deflate, level, snappy)
        # the server reports the size it writes with: 100 bytes when the client set none
        resp["output_buffer_size"] = self.output_buffer_size or _DEFAULT_WRITE_BUFFER
        if self.desired_tag:
            resp["desired_tag"] = self.desired_tag
        return resp

    def _apply_names(self, data: IdentifyData) -> None:
        self.client_id = data.client_id or data.short_id
        self.hostname = data.hostname or data.long_id
        self.user_agent = data.user_agent

    def _apply_output_buffer(self, size: int, timeout: int) -> str | None:
        # the fork clamps large sizes and raises timeouts of 1-9 ms to 10 ms
        opts = self._node.options
        new_size = 0
        if size == -1:
            new_size = 1
        elif size == 0:
            pass
        elif 64 <= size <= opts.max_output_buffer_size:
            new_size = size
        elif size > opts.max_output_buffer_size:
            new_size = opts.max_output_buffer_size
        else:
            return f"output buffer size ({size}) is invalid"
        if new_size > 0:
            self.output_buffer_size = new_size
            self.flush()
            self._writer.size = new_size
        if 0 < timeout < 10:
            timeout = 10
        if timeout == -1:
            self.output_buffer_timeout = 0.0
        elif timeout == 0:
            pass
        elif 1 <= timeout <= int(opts.max_output_buffer_timeout * 1000):
            self.output_buffer_timeout = timeout / 1000.0
        else:
            return f"output buffer timeout ({timeout}) is invalid"
        return None

    def _apply_extensions(self, data: IdentifyData) -> str | None:
        tag = data.desired_tag
        if len(tag.encode()) > _MAX_TAG_LEN:
            return f"invalid tag len {len(tag.encode())}, exceed limit {_MAX_TAG_LEN}"
        if tag:
            self.desired_tag = tag
        if data.extend_support:
            self.extend_support = True
        self._ext_filter = build_ext_filter(data.ext_filter)
        return None

    # -- message frames ---------------------------------------------------------------------

    def _message_data(self, msg: StoredMessage) -> bytes:
        channel = self.channel
        ext = channel is not None and channel.topic.ext and self.extend_support
        return encode_message_data(
            msg.id,
            msg.timestamp,
            min(msg.attempts, MAX_ATTEMPTS),
            msg.body,
            ext_version=(msg.ext_version or 0) if ext else None,
            ext_data=msg.ext_data,
            queue_position=(msg.queue_offset, msg.raw_size) if self.trace_enabled else None,
        )

    def deliver(self, msg: StoredMessage, now: float) -> None:
        channel = self.channel
        if channel is not None:
            channel.owed.discard(msg.key)  # delivered again: that copy is what counts
        super().deliver(msg, now)
        if channel is not None and channel.ordered:
            if channel.repeat_next:
                # the same frame again (same id, same attempts), one message in flight: its
                # second FIN is answered with the non-fatal E_FIN_FAILED
                channel.repeat_next = False
                channel.owed.add(msg.key)
                self._send_frame(FrameType.MESSAGE, self._message_data(msg))
            self.flush()

    # -- topic lookup helpers ---------------------------------------------------------------

    def _partition_token(self, raw: bytes) -> int:
        try:
            return go_atoi(raw)
        except GoValueError as exc:
            raise fatal("E_BAD_PARTITION", f"topic partition is not valid: {exc}") from None

    def _prepare_pub(
        self, params: list[bytes], max_body: int, is_mpub: bool
    ) -> Generator[Step, Any, tuple[int, Topic, str, int]]:
        node = self._node
        if len(params) < 2:
            raise fatal("E_INVALID", "insufficient number of parameters")
        topic_name = params[1].decode("utf-8", "surrogateescape")
        partition = -1
        if len(params) == 3:
            partition = self._partition_token(params[2])
        orig = partition
        if partition == -1:
            partition = node.default_partition(topic_name)
        size = yield from self._read_len(fatal("E_BAD_BODY", "failed to read body size"))
        if size <= 0:
            raise fatal("E_BAD_BODY", f"invalid body size {size}")
        if size > max_body:
            if is_mpub:
                raise fatal("E_BAD_BODY", f"body too big {size} > {max_body}")
            raise fatal("E_BAD_MESSAGE", f"message too big {size} > {max_body}")
        topic = node.existing_partition(topic_name, partition)
        if topic is None:
            raise fatal(E_TOPIC_NOT_EXIST, "")
        if orig == -1 and topic.ordered:
            raise fatal(
                "E_BAD_PARTITION", f"topic partition is not valid for multi partition: {orig}"
            )
        self._check_auth("PUB", params[1], b"")
        return size, topic, topic_name, partition

    # -- publishing -------------------------------------------------------------------------

    def _pub_family(self, params: list[bytes], *, trace: bool, ext: bool) -> Proto:
        node = self._node
        opts = node.options
        size, topic, name, partition = yield from self._prepare_pub(
            params, opts.max_msg_size, False
        )
        if trace and size <= 8:
            raise fatal("E_BAD_BODY", f"invalid body size {size} with trace id enabled")
        if ext and size <= 2:
            raise fatal("E_BAD_BODY", f"invalid body size {size} with ext json header enabled")
        data = yield Read(size, fatal("E_BAD_MESSAGE", "failed to read message body"))
        trace_id = 0
        need_trace = False
        ext_version: int | None = None
        ext_data = b""
        body = data
        if trace:
            (trace_id,) = _unpack_u64(data)
            need_trace = True
            body = data[8:]
        elif ext:
            (json_len,) = _unpack_u16(data)
            if size <= 2 + json_len:
                raise fatal(
                    "E_BAD_BODY", f"invalid body size {size} in ext json header content length"
                )
            ext_data = data[2 : 2 + json_len]
            header = _parse_json_header(ext_data)
            trace_value = header.get("##trace_id")
            if trace_value is not None:
                trace_id = _trace_id(trace_value)
                need_trace = True
            ext_version = 4
            body = data[2 + json_len :]
            if not topic.ext:
                raise nonfatal("E_EXT_NOT_SUPPORT", f"ext content not supported in topic {name}")
        if not node.is_leader(name, partition):
            raise nonfatal(E_NOT_LEADER, "")
        if topic.write_disabled:
            raise nonfatal(E_NOT_LEADER, "")  # what the real one answers a new topic
        msg = node.new_partition_message(
            topic, body, self._now, trace_id=trace_id, ext_version=ext_version, ext_data=ext_data
        )
        node.put(topic, msg, self._now)
        self._published(name, 1)
        if need_trace:
            return encode_trace_receipt(
                TraceReceipt(msg.internal_id, trace_id, msg.queue_offset, msg.raw_size)
            )
        return OK

    def _pub(self, params: list[bytes]) -> Proto:
        return (yield from self._pub_family(params, trace=False, ext=False))

    def _pub_trace(self, params: list[bytes]) -> Proto:
        return (yield from self._pub_family(params, trace=True, ext=False))

    def _pub_ext(self, params: list[bytes]) -> Proto:
        return (yield from self._pub_family(params, trace=False, ext=True))

    def _mpub_family(self, params: list[bytes], *, trace: bool, ext: bool) -> Proto:
        node = self._node
        opts = node.options
        _, topic, name, partition = yield from self._prepare_pub(params, opts.max_body_size, True)

        def convert(i: int, data: bytes) -> tuple[bytes, int, int | None, bytes]:
            msize = len(data)
            trace_id = 0
            ext_version: int | None = None
            ext_data = b""
            body = data
            if trace:
                if msize <= 8:
                    raise fatal(
                        "E_BAD_MESSAGE", f"MPUB invalid message({i}) body size {msize} for tracing"
                    )
                (trace_id,) = _unpack_u64(data)
                body = data[8:]
            elif ext:
                (json_len,) = _unpack_u16(data) if msize >= 2 else (0,)
                if msize <= 2 + json_len:
                    raise fatal(
                        "E_BAD_BODY", f"invalid body size {msize} in ext json header content length"
                    )
                if json_len > 0:
                    if not topic.ext:
                        raise nonfatal(
                            "E_EXT_NOT_SUPPORT", f"ext content not supported in topic {name}"
                        )
                    ext_data = data[2 : 2 + json_len]
                    header = _parse_json_header(ext_data)
                    value = header.get("##trace_id")
                    if value is not None:
                        trace_id = _trace_id(value)
                    ext_version = 4
                body = data[2 + json_len :]
            return body, trace_id, ext_version, ext_data

        items = yield from self._read_mpub_messages(convert)
        if not node.is_leader(name, partition):
            raise nonfatal(E_NOT_LEADER, "")
        if topic.write_disabled:
            raise nonfatal(E_NOT_LEADER, "")  # what the real one answers a new topic
        first: StoredMessage | None = None
        total = 0
        for body, trace_id, ext_version, ext_data in items:
            msg = node.new_partition_message(
                topic,
                body,
                self._now,
                trace_id=trace_id,
                ext_version=ext_version,
                ext_data=ext_data,
            )
            node.put(topic, msg, self._now)
            first = first or msg
            total += msg.raw_size
        self._published(name, len(items))
        if not trace:
            return OK
        assert first is not None
        return encode_trace_receipt(TraceReceipt(first.internal_id, 0, first.queue_offset, total))

    def _mpub(self, params: list[bytes]) -> Proto:
        return (yield from self._mpub_family(params, trace=False, ext=False))

    def _mpub_trace(self, params: list[bytes]) -> Proto:
        return (yield from self._mpub_family(params, trace=True, ext=False))

    def _mpub_ext(self, params: list[bytes]) -> Proto:
        return (yield from self._mpub_family(params, trace=False, ext=True))

    def _internal_create_topic(self, params: list[bytes]) -> Proto:
        node = self._node
        if len(params) < 3:
            raise fatal("E_INVALID", "CREATE_TOPIC insufficient number of parameters")
        if not valid_name(params[1]):
            raise fatal("E_BAD_TOPIC", b"topic name " + go_quote(params[1]) + b" is not valid")
        partition = self._partition_token(params[2])
        self._check_auth("CREATE_TOPIC", params[1], b"")
        if partition < 0:
            raise fatal("E_BAD_PARTITION", "partition should not less than 0")
        ext = False
        if len(params) >= 4:
            value = params[3].decode("utf-8", "replace")
            table = {"1": True, "t": True, "T": True, "TRUE": True, "true": True, "True": True}
            table.update(
                {"0": False, "f": False, "F": False, "FALSE": False, "false": False, "False": False}
            )
            if value not in table:
                raise fatal(
                    "E_BAD_EXT",
                    f'topic ext is not valid: strconv.ParseBool: parsing "{value}": invalid syntax',
                )
            ext = table[value]
        if node.in_cluster:
            raise nonfatal(
                "E_CREATE_TOPIC_FAILED",
                "CREATE_TOPIC is not allowed here while cluster feature enabled.",
            )
        node.create_partition(params[1].decode(), partition, self._now, ext=ext)
        return OK
        yield  # pragma: no cover

    # -- subscribing ------------------------------------------------------------------------

    def _sub_family(
        self, params: list[bytes], *, trace: bool, ordered: bool, start: tuple[str, int] | None
    ) -> Proto:
        node = self._node
        if self.state != ClientState.INIT:
            raise fatal("E_INVALID", "cannot SUB in current state")
        if self.heartbeat_interval <= 0:
            raise fatal("E_INVALID", "cannot SUB with heartbeats disabled")
        if len(params) < 3:
            raise fatal("E_INVALID", "SUB insufficient number of parameters")
        if not valid_name(params[1]):
            raise fatal("E_BAD_TOPIC", b"SUB topic name " + go_quote(params[1]) + b" is not valid")
        if not valid_name(params[2], channel=True):
            raise fatal(
                "E_BAD_CHANNEL", b"SUB channel name " + go_quote(params[2]) + b" is not valid"
            )
        topic_name, channel_name = params[1].decode(), params[2].decode()
        partition = -1
        if len(params) == 4:
            partition = self._partition_token(params[3])
        self._check_auth("SUB", params[1], params[2])
        if partition == -1:
            partition = node.default_partition(topic_name)
        topic = node.existing_partition(topic_name, partition)
        if topic is None:
            raise fatal(E_TOPIC_NOT_EXIST, "")
        if topic.ordered and not ordered:
            raise fatal("E_SUB_ORDER_IS_MUST", "this topic is configured only allow ordered sub")
        if topic.ext:
            if not self.extend_support:
                raise fatal(
                    "E_SUB_EXTEND_NEED",
                    "this topic is extended and should identify as extend support.",
                )
        elif self.extend_support:
            raise fatal(
                "E_SUB_EXTEND_FORBIDDON",
                "this topic is not extended and should not identify as extend support.",
            )
        if not node.is_leader(topic_name, partition):
            raise fatal(E_NOT_LEADER, "")
        if topic.disable_channel_auto_create and channel_name not in topic.channels:
            raise fatal("E_SUB_CHANNEL_NOT_REGISTERED", "channel is not registered under topic.")
        channel = node.get_channel(topic, channel_name, self._now)
        if not topic.ext and self.desired_tag:
            self.desired_tag = ""
        limit = node.options.max_channel_consumers
        if limit and len(channel.clients) >= limit:
            raise fatal(E_NOT_WRITABLE, "")
        self._subscribe(channel)
        if ordered and self.sample_rate != 0:
            raise fatal("E_INVALID", "order consume is not allowed while sample rate is not 0")
        if ordered:
            if not channel.ordered and channel.queue:
                # the real server's reader, reset on the switch, reads the first message again
                channel.repeat_next = True
            channel.ordered = True
        if start is not None and len(channel.clients) <= 1:
            problem = node.set_channel_offset(channel, start)
            if problem is not None:
                raise fatal("E_INVALID", problem)
        self.trace_enabled = trace
        plain = not (self.tls or self.snappy or self.deflate)
        if not channel.ephemeral and self.output_buffer_size <= 0 and plain:
            # a consumer gets a bigger write buffer unless it chose one
            self.output_buffer_size = min(
                _CONSUMER_WRITE_BUFFER, node.options.max_output_buffer_size
            )
            self.flush()
            self._writer.size = self.output_buffer_size
        return OK
        yield  # pragma: no cover

    def _sub(self, params: list[bytes]) -> Proto:
        return (yield from self._sub_family(params, trace=False, ordered=False, start=None))

    def _sub_ordered(self, params: list[bytes]) -> Proto:
        return (yield from self._sub_family(params, trace=True, ordered=True, start=None))

    def _sub_advanced(self, params: list[bytes]) -> Proto:
        start = None
        if len(params) > 4 and params[4]:
            start = parse_consume_offset(params[4])
        return (yield from self._sub_family(params, trace=True, ordered=False, start=start))

    # -- FIN / REQ / TOUCH ------------------------------------------------------------------

    def _full_id(self, raw: bytes) -> bytes:
        if len(raw) != 16:
            raise fatal("E_INVALID", "Invalid Message ID")
        return raw

    def _channel_or_fail(self) -> Channel:
        channel = self.channel
        if channel is None:
            raise fatal("E_INVALID", "No channel")
        return channel

    def _fail_text(self, channel: Channel, key: bytes, problem: str) -> str:
        if problem == "ID not in flight":
            return "Message ID not in flight"
        entry = channel.in_flight.get(key)
        owner = entry.client_id if entry is not None else 0
        return f"client does not own message : {owner} vs {self.id}"

    def _fin(self, params: list[bytes]) -> Proto:
        if self.state not in (ClientState.SUBSCRIBED, ClientState.CLOSING):
            raise fatal("E_INVALID", "cannot FIN in current state")
        if len(params) < 2:
            raise fatal("E_INVALID", "FIN insufficient number of params")
        full = self._full_id(params[1])
        if to_int64(int.from_bytes(full[:8], "big")) <= 0:
            raise fatal("E_INVALID", "Invalid Message ID")
        channel = self._channel_or_fail()
        topic = channel.topic
        if not self._node.is_leader(topic.name, topic.partition):
            raise fatal(E_NOT_LEADER, "")
        key = full[:8]
        problem = channel.finish(self.id, key) if self.id in channel.clients else "ID not in flight"
        if problem is not None:
            if key in channel.owed:
                # the FIN of a repeated copy: refused, yet the ordered channel moves on
                channel.owed.discard(key)
                self._node.dirty_channel(channel)
            raise nonfatal(
                "E_FIN_FAILED",
                b"FIN "
                + go_bytes_list([full])[1:-1]
                + b" failed "
                + self._fail_text(channel, key, problem).encode(),
            )
        self.finish_count += 1
        self.in_flight_count -= 1
        self._dirty_own_channel()
        return None
        yield  # pragma: no cover

    def _req(self, params: list[bytes]) -> Proto:
        if self.state not in (ClientState.SUBSCRIBED, ClientState.CLOSING):
            raise fatal("E_INVALID", "cannot REQ in current state")
        if len(params) < 3:
            raise fatal("E_INVALID", "REQ insufficient number of params")
        full = self._full_id(params[1])
        parsed = parse_base10(params[2])
        if parsed is None:
            raise fatal(
                "E_INVALID", b"REQ could not parse timeout " + params[1] + b", " + params[2]
            )
        delay_ns = to_int64(to_int64(parsed) * MS)
        max_ns = round(self._node.options.max_req_timeout * 1e9)
        delay_ns = min(max(delay_ns, 0), max_ns)
        channel = self._channel_or_fail()
        if (channel.ordered or channel.topic.ordered) and delay_ns > 0:
            return None
        key = full[:8]
        problem = (
            channel.requeue(self.id, key, delay_ns / 1e9, self._now)
            if self.id in channel.clients
            else "ID not in flight"
        )
        if problem is not None:
            raise nonfatal(
                "E_REQ_FAILED",
                b"REQ "
                + go_bytes_list([full])[1:-1]
                + b" failed "
                + self._fail_text(channel, key, problem).encode(),
            )
        self.requeue_count += 1
        self.in_flight_count -= 1
        self._dirty_own_channel()
        self._node.dirty_channel(channel)
        return None
        yield  # pragma: no cover

    def _touch(self, params: list[bytes]) -> Proto:
        if self.state not in (ClientState.SUBSCRIBED, ClientState.CLOSING):
            raise fatal("E_INVALID", "cannot TOUCH in current state")
        if len(params) < 2:
            raise fatal("E_INVALID", "TOUCH insufficient number of params")
        full = self._full_id(params[1])
        channel = self._channel_or_fail()
        key = full[:8]
        problem = (
            channel.touch(
                self.id, key, self._now, self.msg_timeout, self._node.options.max_msg_timeout
            )
            if self.id in channel.clients
            else "ID not in flight"
        )
        if problem is not None:
            raise nonfatal(
                "E_TOUCH_FAILED",
                b"TOUCH "
                + go_bytes_list([full])[1:-1]
                + b" failed "
                + self._fail_text(channel, key, problem).encode(),
            )
        return None
        yield  # pragma: no cover


def _parse_json_header(data: bytes) -> dict[str, Any]:
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise nonfatal("E_INVALID_JSON_HEADER", f"fail to parse json header:{exc}") from None
    if not isinstance(obj, dict):
        raise nonfatal("E_INVALID_JSON_HEADER", "fail to parse json header:not a json object")
    return obj


def _trace_id(value: Any) -> int:
    if not isinstance(value, str):
        raise nonfatal("INVALID_TRACE_ID", "passin trace id should be string")
    if not value.isdigit() or not value.isascii() or int(value) >= 1 << 64:
        raise nonfatal("INVALID_TRACE_ID", "invalid trace id")
    return int(value)
