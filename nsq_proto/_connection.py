"""One client connection to nsqd, as a pure state machine.

Three things drive it, each taking ``now`` (seconds on the caller's monotonic clock):

* transport events: :meth:`Connection.connection_made`, :meth:`receive_data`,
  :meth:`tls_established`, :meth:`connection_lost`;
* commands from the application or a consumer/producer core: :meth:`subscribe`, :meth:`ready`,
  :meth:`finish`, :meth:`requeue`, :meth:`touch`, :meth:`publish` and friends, :meth:`close`;
* the timer: :meth:`handle_timer` once :meth:`next_deadline` has passed.

Everything it wants done comes out of one ordered queue, :meth:`next_output`: :class:`Send`,
:class:`StartTLS` and :class:`Close` actions for the adapter, and events for the application.

Its :attr:`~Connection.state` changes only through :meth:`Connection._move`, which looks the
move up in the one table of transitions in ``_state.py``.
"""

from __future__ import annotations

import struct
import types
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from enum import Enum
from typing import Final

try:  # the machine-int type the compiled build reads headers into (an int in Python)
    from mypy_extensions import i64
except ImportError:  # pure Python without mypy's extensions
    i64 = int  # type: ignore[misc]

from . import commands as cmd
from ._compress import Codec, make_codec
from ._config import ConnectionConfig
from ._errors import (
    AuthRequired,
    ConnectionClosedError,
    HandshakeTimeout,
    LocalProtocolError,
    NSQError,
    ReadTimeout,
    RemoteProtocolError,
    ServerError,
)
from ._events import (
    CloseWaitReceived,
    ConnectionClosed,
    ConnId,
    ErrorReceived,
    HeartbeatReceived,
    MessageReceived,
    MessagesReceived,
    PublishFailed,
    PublishSucceeded,
    Ready,
    Subscribed,
)
from ._features import (
    DEFAULT_MAX_RDY_COUNT,
    AuthResult,
    NegotiatedFeatures,
    parse_auth_response,
    parse_identify_response,
    parse_trace_receipt,
)
from ._frames import CLOSE_WAIT, HEARTBEAT, HTTP_ANSWER, OK, FrameDecoder
from ._message import (
    MESSAGE_HEADER_SIZE,
    STANDARD_LAYOUT,
    Message,
    MessageLayout,
    builds_by_fields,
    decode_message,
    standard_message,
)
from ._outputs import Close, Output, Send, StartTLS
from ._state import (
    CAN_ANSWER,
    CAN_RECEIVE_MESSAGES,
    HANDSHAKE_STATES,
    Command,
    ConnectionState,
    Trigger,
    check_command,
    next_state,
)

__all__ = ["Connection", "NON_FATAL_ERRORS", "parse_error_frame"]

#: the only error codes after which nsqd keeps the connection open (client guide, TCP spec)
NON_FATAL_ERRORS: Final = frozenset({"E_FIN_FAILED", "E_REQ_FAILED", "E_TOUCH_FAILED"})
#: what the partitioned server answers a publish with and keeps the connection open (spec 5.1):
#: the requests pipelined behind the refused one are read and answered as usual
PARTITIONED_PUBLISH_ERRORS: Final = frozenset(
    {
        "E_FAILED_ON_NOT_LEADER",
        "E_FAILED_ON_NOT_WRITABLE",
        "E_PUB_FAILED",
        "E_MPUB_FAILED",
        "E_EXT_NOT_SUPPORT",
        "E_INVALID_JSON_HEADER",
        "INVALID_TRACE_ID",
    }
)

#: the text of a RemoteProtocolError raised for data no check of ours refused
UNREADABLE: Final = "unreadable data from nsqd"
#: a frame's ``size:i32 | frame_type:i32``, and the same with a message's
#: ``timestamp:i64 | attempts:u16`` after it
_FRAME_HEADER: Final = struct.Struct(">ii")
_MESSAGE_FRAME_HEADER: Final = struct.Struct(">iiqH")
_MESSAGE: Final = 2
_ERROR: Final = 1


def _compiled() -> bool:
    """Whether this module runs compiled (mypyc): its functions are then not Python's."""
    return not isinstance(_compiled, types.FunctionType)


#: compiled, the frame loop reads a message's header byte by byte (machine ints: no tuple
#: and no int objects); in Python one ``struct`` unpack is cheaper than eighteen indexings
_BYTEWISE_HEADERS: Final = _compiled()


class _Awaiting(Enum):
    """What a command sent waits for: the kinds of the requests answered in FIFO order."""

    # members are singletons: identity hashing is exact and much cheaper than Enum's
    __hash__ = object.__hash__

    #: SUB: OK
    SUB = "SUB"
    #: PUB, MPUB, DPUB, PUB_EXT: OK
    PUB = "PUB"
    #: PUB_TRACE, MPUB_TRACE: a trace receipt
    TRACE = "TRACE"
    #: CLS: CLOSE_WAIT
    CLS = "CLS"
    #: MPUB_EXT: OK; the server stops reading the batch at a refused message, leaving the
    #: rest unread
    MPUB_EXT = "MPUB_EXT"


_PUBLISHES: Final = (_Awaiting.PUB, _Awaiting.TRACE, _Awaiting.MPUB_EXT)


def parse_error_frame(data: bytes) -> tuple[str, str]:
    """Split the data of an error frame into its code and description."""
    text = data.decode("utf-8", "replace")
    code, _, rest = text.partition(" ")
    return code, rest


def check_features(cfg: ConnectionConfig, features: NegotiatedFeatures) -> None:
    """Refuse what nsqd enabled without being asked (its IDENTIFY response)."""
    if features.tls_v1 and not cfg.tls_v1:
        raise RemoteProtocolError("nsqd enabled TLS, which was not asked for")
    if features.snappy and not cfg.snappy:
        raise RemoteProtocolError("nsqd enabled snappy, which was not asked for")
    if features.deflate and not cfg.deflate:
        raise RemoteProtocolError("nsqd enabled deflate, which was not asked for")
    if features.snappy and features.deflate:
        raise RemoteProtocolError("nsqd enabled both snappy and deflate")


def _ms(seconds: float) -> int:
    if seconds < 0:
        raise LocalProtocolError(f"a delay cannot be negative: {seconds!r}")
    return round(seconds * 1000)


class Connection:
    """The client side of one nsqd TCP connection: each message it delivers is a
    :class:`MessageReceived` (with ``message_batches``, the messages that follow one another
    in a read are one :class:`MessagesReceived`), of ``message_class`` (a subclass of
    :class:`Message`, built with its arguments) when one is given."""

    def __init__(
        self,
        config: ConnectionConfig | None = None,
        conn_id: ConnId = 0,
        *,
        address: tuple[str, int] | None = None,
        message_batches: bool = False,
        message_class: type[Message] = Message,
    ) -> None:
        self.config = config if config is not None else ConnectionConfig()
        self.conn_id = conn_id
        self._batches = message_batches
        self._message_class = message_class
        #: a subclass built by :func:`standard_message` (it keeps Message's constructor)
        self._message_by_fields = message_class is not Message and builds_by_fields(message_class)
        #: (message_batches) the list of the read's latest MessagesReceived, while it grows
        self._run: list[Message] | None = None
        #: the nsqd it connects to, named in errors (None: unknown)
        self.address = address
        #: changed only by :meth:`_move`, through the table of ``_state.py``
        self.state = ConnectionState.INIT
        self.features: NegotiatedFeatures | None = None
        self.auth: AuthResult | None = None
        self.layout: MessageLayout = STANDARD_LAYOUT
        self._decoder = FrameDecoder(self.config.max_frame_size)
        self._codec: Codec | None = None
        self._outputs: deque[Output] = deque()
        self._wbuf = bytearray()
        #: (what it waits for, its publish id: 0 for SUB and CLS), in the order sent
        self._pending: deque[tuple[_Awaiting, int]] = deque()
        #: the id of the next publish (its own numbering: see :meth:`publish`)
        self._next_publish_id = 1
        self._read_deadline: float | None = None
        self._handshake_deadline: float | None = None
        self._switched: bytes | None = None

    # ------------------------------------------------------------------ outputs

    def next_output(self) -> Output | None:
        """The next action or event, in order; None when there is nothing left."""
        if not self._outputs:
            self._flush()
            if not self._outputs:
                return None
        return self._outputs.popleft()

    def outputs(self) -> list[Output]:
        """Drain every queued action and event."""
        self._flush()
        out = list(self._outputs)
        self._outputs.clear()
        return out

    def _send(self, data: bytes) -> None:
        self._wbuf += data

    def _flush(self) -> None:
        if self._wbuf:
            data = bytes(self._wbuf)
            self._wbuf.clear()
            if self._codec is not None:
                data = self._codec.compress(data)
            self._outputs.append(Send(self.conn_id, data))

    def _emit(self, item: Output) -> None:
        if self._wbuf:
            self._flush()
        self._outputs.append(item)

    # ------------------------------------------------------------------ state

    def _move(self, trigger: Trigger) -> None:
        """The only place the state changes: where ``trigger`` leads, by ``_state.py``'s table
        (a move the table does not have raises LocalProtocolError)."""
        self.state = next_state(self.state, trigger)

    # ------------------------------------------------------------------ timers

    def next_deadline(self) -> float | None:
        """When :meth:`handle_timer` must next be called (None: no timer)."""
        read = self._read_deadline
        handshake = self._handshake_deadline
        if handshake is None or (read is not None and read < handshake):
            return read
        return handshake

    def handle_timer(self, now: float) -> None:
        """Fire what is due at ``now``; calling early does nothing."""
        handshake = self._handshake_deadline
        if handshake is not None and now >= handshake and self.state is not ConnectionState.CLOSED:
            limit = self.config.handshake_timeout
            self._end_on_error(
                HandshakeTimeout(
                    f"nsqd did not complete the handshake within {limit} s "
                    f"(stuck in {self.state.value})"
                ),
                "handshake timeout",
                abort=True,
            )
            return
        deadline = self._read_deadline
        if deadline is not None and now >= deadline and self.state is not ConnectionState.CLOSED:
            timeout = self.config.effective_read_timeout
            self._end_on_error(
                ReadTimeout(f"nothing received from nsqd for {timeout} s"),
                "read timeout",
                abort=True,
            )

    def _touch_read_deadline(self, now: float) -> None:
        rt = self.config.effective_read_timeout
        self._read_deadline = None if rt is None else now + rt

    # ------------------------------------------------------------------ transport events

    def connection_made(self, now: float) -> None:
        """The TCP connection is up: queue the magic and IDENTIFY."""
        if self.state is not ConnectionState.INIT:
            raise LocalProtocolError(f"connection_made in state {self.state.value}")
        self._send(cmd.MAGIC_V2 + cmd.identify(self.config.identify_body()))
        self._move(Trigger.CONNECTED)
        self._touch_read_deadline(now)
        self._handshake_deadline = now + self.config.handshake_timeout

    def tls_established(self, now: float) -> None:
        """The adapter finished the TLS handshake asked for by :class:`StartTLS`."""
        if self.state is not ConnectionState.TLS_HANDSHAKE:
            raise LocalProtocolError(f"tls_established in state {self.state.value}")
        self._move(Trigger.TLS_ESTABLISHED)
        self._touch_read_deadline(now)

    def connection_lost(self, now: float, error: BaseException | None = None) -> None:
        """The transport closed (EOF or error)."""
        if self.state is ConnectionState.CLOSED:
            return
        if error is None and self.state is ConnectionState.CLOSE_WAIT and not self._pending:
            self._end("closed by nsqd after CLOSE_WAIT", None, send_close=False)
            return
        if self.state is ConnectionState.INIT:  # the transport never came up: not "lost"
            reason = "could not connect" if error is None else str(error)
        else:
            reason = "connection lost" if error is None else f"connection lost: {error}"
        exc = ConnectionClosedError(reason)
        if error is not None:
            exc.__cause__ = error
        self._end(reason, exc, send_close=False)

    def receive_data(self, data: bytes, now: float) -> None:
        """Bytes read from the transport (after TLS, before decompression)."""
        state = self.state
        if state is ConnectionState.CLOSED:
            return
        if state is ConnectionState.INIT or state is ConnectionState.TLS_HANDSHAKE:
            raise LocalProtocolError(f"receive_data in state {state.value}")
        rt = self.config.effective_read_timeout
        self._read_deadline = None if rt is None else now + rt
        try:
            if self._codec is not None:
                data = self._codec.decompress(data)
            self._process(data)
        except RemoteProtocolError as exc:
            error = self._named(exc)
            self._end_on_error(error, f"protocol error: {error}")
            if error is exc:
                raise
            raise error from None
        except NSQError:
            raise
        except Exception as exc:
            # a parser that missed a check must still fail this connection only, typed
            error = RemoteProtocolError(f"{UNREADABLE}: {type(exc).__name__}: {exc}")
            self._end_on_error(error, f"protocol error: {error}")
            raise error from exc

    def _named(self, error: RemoteProtocolError) -> RemoteProtocolError:
        """``error``, or for a peer that answered with HTTP, the same naming this nsqd."""
        if str(error) != HTTP_ANSWER:
            return error
        address = self.address
        who = "nsqd" if address is None else f"{address[0]}:{address[1]}"
        named = RemoteProtocolError(f"{who} {HTTP_ANSWER}")
        named.permanent = True
        return named

    # ------------------------------------------------------------------ frame handling

    def _process(self, data: bytes) -> None:
        while self.state in HANDSHAKE_STATES:
            # one frame at a time: the bytes after a response may change meaning
            # (TLS records, compressed data)
            frames = self._decoder.feed(data, limit=1)
            data = b""
            if not frames:
                return
            self._handshake_frame(*frames[0])
            if self.state is ConnectionState.TLS_HANDSHAKE or self.state is ConnectionState.CLOSED:
                return
            switched = self._switched
            if switched is not None:
                self._switched = None
                data = switched
        # the frames are read straight out of the bytes (a message's fields are sliced from
        # them: no copy of each frame first); the decoder keeps what is incomplete
        decoder = self._decoder
        head, data, pos = decoder.resume(data)
        self._run = None  # (message_batches) a new read: a new event for its messages
        if head and _read_frames(self, head, 0) < 0:
            return
        end = _read_frames(self, data, pos)
        if end >= 0:
            decoder.keep(data, end)

    def _handshake_frame(self, frame_type: int, payload: bytes) -> None:
        if frame_type == _ERROR:
            self._error_frame(payload)
            return
        if frame_type == _MESSAGE:
            raise RemoteProtocolError(f"message frame during the handshake ({self.state.value})")
        if payload == HEARTBEAT:
            self._heartbeat()
            return
        state = self.state
        if state is ConnectionState.IDENTIFYING:
            features = parse_identify_response(payload)
            check_features(self.config, features)
            self.features = features
            if features.tls_v1:
                self._move(Trigger.TLS_ASKED)
                self._emit(StartTLS(self.conn_id, self._decoder.take_buffered()))
                return
            self._start_compression()
        elif state is ConnectionState.TLS_RESPONSE:
            if payload != OK:
                raise RemoteProtocolError(
                    f"expected OK after the TLS handshake, got {payload[:40]!r}"
                )
            self._start_compression()
        elif state is ConnectionState.COMPRESSION_RESPONSE:
            if payload != OK:
                raise RemoteProtocolError(
                    f"expected OK after switching on compression, got {payload[:40]!r}"
                )
            self._after_upgrades()
        elif state is ConnectionState.AUTHENTICATING:
            self.auth = parse_auth_response(payload)
            self._ready()

    def _start_compression(self) -> None:
        features = self.features
        assert features is not None
        level = features.deflate_level if 1 <= features.deflate_level <= 9 else 6
        codec = make_codec(features.snappy, features.deflate, level)
        if codec is None:
            self._after_upgrades()
            return
        self._flush()  # bytes queued so far were meant to go out uncompressed
        self._codec = codec
        self._move(Trigger.COMPRESSION_ON)
        # bytes already read after the switch point are compressed: decode them before going on
        rest = self._decoder.take_buffered()
        self._switched = codec.decompress(rest) if rest else None

    def _after_upgrades(self) -> None:
        features = self.features
        assert features is not None
        if features.auth_required:
            secret = self.config.auth_secret
            if not secret:
                self._end_on_error(
                    AuthRequired("nsqd requires AUTH and no auth secret is configured"),
                    "auth required",
                )
                return
            self._send(cmd.auth(secret))
            self._move(Trigger.AUTH_SENT)
            return
        self._ready()

    def _ready(self) -> None:
        self._move(Trigger.HANDSHAKE_DONE)
        self._handshake_deadline = None
        features = self.features
        assert features is not None
        if features.partitioned:
            self.layout = MessageLayout(binary_id=True)
        self._emit(Ready(self.conn_id, features, self.auth))

    def _heartbeat(self) -> None:
        self._send(cmd.NOP)
        self._emit(HeartbeatReceived(self.conn_id))

    def _response(self, payload: bytes) -> None:
        if payload == HEARTBEAT:
            self._heartbeat()
            return
        if not self._pending:
            raise RemoteProtocolError(f"unexpected response frame {payload[:40]!r}")
        kind, request_id = self._pending.popleft()
        if kind is _Awaiting.PUB or kind is _Awaiting.MPUB_EXT:
            if payload != OK:
                raise RemoteProtocolError(f"expected OK to a publish, got {payload[:40]!r}")
            self._emit(PublishSucceeded(self.conn_id, request_id))
        elif kind is _Awaiting.TRACE:
            self._emit(PublishSucceeded(self.conn_id, request_id, parse_trace_receipt(payload)))
        elif kind is _Awaiting.SUB:
            if payload != OK:
                raise RemoteProtocolError(f"expected OK to SUB, got {payload[:40]!r}")
            self._move(Trigger.SUB_ANSWERED)  # SUBSCRIBED; stays CLOSING if CLS went first
            self._emit(Subscribed(self.conn_id))
        else:  # _Awaiting.CLS
            if payload != CLOSE_WAIT:
                raise RemoteProtocolError(f"expected CLOSE_WAIT to CLS, got {payload[:40]!r}")
            self._move(Trigger.CLOSE_WAIT_RECEIVED)
            self._emit(CloseWaitReceived(self.conn_id))

    def _error_frame(self, payload: bytes) -> None:
        code, text = parse_error_frame(payload)
        if code in NON_FATAL_ERRORS:
            self._emit(ErrorReceived(self.conn_id, code, text, False))
            return
        pending = self._pending
        if (
            code in PARTITIONED_PUBLISH_ERRORS
            and pending
            and pending[0][0] in _PUBLISHES
            and self.features is not None
            and self.features.partitioned
        ):
            # refused alone: the connection and the requests behind this one go on
            kind, request_id = pending.popleft()
            self._emit(ErrorReceived(self.conn_id, code, text, False))
            self._emit(PublishFailed(self.conn_id, request_id, ServerError(code, text, False)))
            if kind is _Awaiting.MPUB_EXT:
                self._end_on_error(
                    RemoteProtocolError(
                        f"nsqd left the rest of a refused MPUB_EXT unread ({code})"
                    ),
                    f"MPUB_EXT refused with {code}",
                )
            return
        self._emit(ErrorReceived(self.conn_id, code, text, True))
        self._end_on_error(ServerError(code, text, True), f"nsqd error {code}")

    # ------------------------------------------------------------------ closing

    def _end_on_error(self, error: NSQError, reason: str, *, abort: bool = False) -> None:
        """End the connection because of ``error`` (Close, then ConnectionClosed); ``abort``:
        the peer is judged dead, its transport is closed at once."""
        if self.state is ConnectionState.CLOSED:
            return
        self._end(reason, error, send_close=True, abort=abort)

    def _end(
        self, reason: str, error: NSQError | None, *, send_close: bool, abort: bool = False
    ) -> None:
        """The connection is over: pending publishes fail, ``Close`` (when ``send_close``;
        with ``abort``) and ``ConnectionClosed`` are emitted."""
        after_close_wait = self.state is ConnectionState.CLOSE_WAIT and error is None
        connected = self.state is not ConnectionState.INIT
        self._move(Trigger.ENDED)
        self._read_deadline = None
        self._handshake_deadline = None
        self._wbuf.clear()  # nothing more goes out on a finished connection
        first = True
        while self._pending:
            kind, request_id = self._pending.popleft()
            if kind in _PUBLISHES:
                if first and isinstance(error, ServerError):
                    failure: NSQError = error
                else:
                    failure = ConnectionClosedError(
                        f"connection closed before the answer: {reason}"
                    )
                self._emit(PublishFailed(self.conn_id, request_id, failure))
            first = False
        if send_close:
            self._emit(Close(self.conn_id, reason, abort))
        self._emit(ConnectionClosed(self.conn_id, reason, error, after_close_wait, connected))

    def close(self, reason: str = "closed by the application") -> None:
        """Close now, without CLS.  Pending publishes fail with ConnectionClosedError."""
        if self.state is ConnectionState.CLOSED:
            return
        self._flush()  # commands already issued (FIN, ...) still go out before the close
        self._end(reason, None, send_close=True)

    # ------------------------------------------------------------------ commands

    def subscribe(
        self,
        topic: str,
        channel: str,
        partition: int | None = None,
        *,
        ordered: bool = False,
    ) -> None:
        """SUB (or SUB_ORDERED on the partitioned server)."""
        check_command(self.state, Command.SUB)
        features = self.features
        partitioned = features is not None and features.partitioned
        if ordered:
            if not partitioned:
                raise LocalProtocolError("ordered subscriptions need the partitioned server")
            data = cmd.sub_ordered(topic, channel, partition)
        else:
            data = cmd.sub(topic, channel, partition)
        if partitioned:
            self.layout = MessageLayout(
                binary_id=True,
                ext_header=self.config.extend_support,
                queue_position=ordered,
            )
        self._send(data)
        self._pending.append((_Awaiting.SUB, 0))
        self._move(Trigger.SUB_SENT)

    def rdy(self, count: int) -> None:
        """Send RDY: nsqd may have ``count`` messages in flight on this connection."""
        check_command(self.state, Command.RDY)
        features = self.features
        max_rdy = features.max_rdy_count if features is not None else DEFAULT_MAX_RDY_COUNT
        if count > max_rdy:
            raise LocalProtocolError(f"RDY {count} is above nsqd's max_rdy_count {max_rdy}")
        self._send(cmd.rdy(count))

    def finish(self, msg_id: bytes) -> None:
        check_command(self.state, Command.ANSWER)
        self._send(cmd.fin(msg_id))

    def finish_delivered(self, msg_id: bytes) -> None:
        """FIN of an id this connection delivered, which the caller's book still held (so a
        valid id): :meth:`finish` without the id's check, for the consumer's per-message path.
        The state is checked as :meth:`finish` checks it."""
        if self.state not in CAN_ANSWER:
            check_command(self.state, Command.ANSWER)
        wbuf = self._wbuf  # three appends: no temporary bytes
        wbuf += b"FIN "
        wbuf += msg_id
        wbuf += b"\n"

    def finish_many_delivered(self, msg_ids: Sequence[bytes]) -> None:
        """FIN each of ``msg_ids``, ids this connection delivered that the caller's book still
        held (so valid ids): :meth:`finish_many` without the ids' check."""
        if self.state not in CAN_ANSWER:
            check_command(self.state, Command.ANSWER)
        if msg_ids:
            wbuf = self._wbuf
            wbuf += b"FIN "
            wbuf += b"\nFIN ".join(msg_ids)
            wbuf += b"\n"

    def finish_many(self, msg_ids: Sequence[bytes]) -> None:
        """FIN each of ``msg_ids`` (one buffer append for all)."""
        check_command(self.state, Command.ANSWER)
        self._send(cmd.fin_many(msg_ids))

    def requeue(self, msg_id: bytes, delay: float = 0.0) -> None:
        """REQ with a delay in seconds (0: requeue at once)."""
        check_command(self.state, Command.ANSWER)
        self._send(cmd.req(msg_id, _ms(delay)))

    def touch(self, msg_id: bytes) -> None:
        check_command(self.state, Command.ANSWER)
        self._send(cmd.touch(msg_id))

    def touch_many(self, msg_ids: Sequence[bytes]) -> None:
        """TOUCH each of ``msg_ids`` (one buffer append for all)."""
        check_command(self.state, Command.ANSWER)
        self._send(cmd.touch_many(msg_ids))

    def nop(self) -> None:
        check_command(self.state, Command.NOP)
        self._send(cmd.NOP)

    def start_close(self) -> None:
        """Send CLS: nsqd stops sending messages and answers CLOSE_WAIT."""
        check_command(self.state, Command.CLS)
        self._send(cmd.CLS)
        self._pending.append((_Awaiting.CLS, 0))
        self._move(Trigger.CLS_SENT)

    def _publish(self, data: bytes, kind: _Awaiting = _Awaiting.PUB) -> int:
        check_command(self.state, Command.PUB)
        rid = self._next_publish_id
        self._next_publish_id = rid + 1
        self._send(data)
        self._pending.append((kind, rid))
        return rid

    def publish(self, topic: str, body: bytes, partition: int | None = None) -> int:
        """PUB; returns the connection's publish id (numbered from 1 on each connection), which
        the PublishSucceeded/PublishFailed event carries as its ``request_id``."""
        return self._publish(cmd.pub(topic, body, partition))

    def publish_many(
        self, topic: str, bodies: Iterable[bytes], partition: int | None = None
    ) -> int:
        return self._publish(cmd.mpub(topic, bodies, partition))

    def publish_deferred(self, topic: str, body: bytes, delay: float) -> int:
        """DPUB with a delay in seconds (standard nsqd only)."""
        features = self.features
        if features is not None and features.partitioned:
            raise LocalProtocolError("the partitioned server has no DPUB")
        return self._publish(cmd.dpub(topic, _ms(delay), body))

    def publish_traced(
        self, topic: str, body: bytes, trace_id: int, partition: int | None = None
    ) -> int:
        """PUB_TRACE (partitioned server); PublishSucceeded carries the TraceReceipt."""
        return self._publish(cmd.pub_trace(topic, trace_id, body, partition), _Awaiting.TRACE)

    def publish_many_traced(
        self, topic: str, items: Iterable[tuple[int, bytes]], partition: int | None = None
    ) -> int:
        return self._publish(cmd.mpub_trace(topic, items, partition), _Awaiting.TRACE)

    def publish_encoded(self, data: bytes, *, traced: bool = False) -> int:
        """Send publish-command bytes built with :mod:`nsq_proto.commands` (PUB, MPUB, DPUB or,
        with ``traced``, PUB_TRACE/MPUB_TRACE whose answer is a TraceReceipt)."""
        if traced:
            return self._publish(data, _Awaiting.TRACE)
        kind = _Awaiting.MPUB_EXT if data.startswith(b"MPUB_EXT ") else _Awaiting.PUB
        return self._publish(data, kind)

    @property
    def pending_requests(self) -> int:
        """Requests sent and not yet answered (SUB, publishes, CLS)."""
        return len(self._pending)


def _standard_run(
    buf: bytes,
    pos: int,
    batch: list[Message],
    max_size: int,
    native: bool,
    by_fields: bool,
    new: Callable[[type[Message]], Message],
    cls: type[Message],
) -> int:
    """The frame loop's common case: the whole standard messages of ``buf`` from ``pos`` on,
    each built (as the connection's ``cls``: ``native`` when it is :class:`Message`,
    ``by_fields`` when :func:`standard_message` may build it, with ``new`` its ``__new__``)
    and added to ``batch``, this read's run; where the first other frame starts (one of
    another type, over ``max_size``, or cut by the read).

    Compiled (:data:`_BYTEWISE_HEADERS`), each header is read byte by byte into machine ints,
    and a message with a negative timestamp is left to the frame loop's unpack; in Python,
    one unpack a header."""
    n: i64 = len(buf)
    smallest: i64 = 4 + MESSAGE_HEADER_SIZE
    size: i64
    end: i64
    timestamp: i64
    attempts: i64
    if _BYTEWISE_HEADERS:
        p: i64 = pos
        # (a frame's size is an i32: a larger limit, however large, is the same as this one)
        top: i64 = max_size if max_size < 0x7FFFFFFF else 0x7FFFFFFF
        while n - p >= 18:
            size = (
                (i64(buf[p]) << 24)
                | (i64(buf[p + 1]) << 16)
                | (i64(buf[p + 2]) << 8)
                | i64(buf[p + 3])
            )
            end = p + 4 + size
            if not (
                end <= n
                and smallest <= size <= top
                and buf[p + 7] == _MESSAGE
                and buf[p + 4] == 0
                and buf[p + 5] == 0
                and buf[p + 6] == 0
                and buf[p + 8] < 0x80
            ):
                break
            timestamp = (
                (i64(buf[p + 8]) << 56)
                | (i64(buf[p + 9]) << 48)
                | (i64(buf[p + 10]) << 40)
                | (i64(buf[p + 11]) << 32)
                | (i64(buf[p + 12]) << 24)
                | (i64(buf[p + 13]) << 16)
                | (i64(buf[p + 14]) << 8)
                | i64(buf[p + 15])
            )
            attempts = (i64(buf[p + 16]) << 8) | i64(buf[p + 17])
            if native:
                batch.append(Message(buf[p + 18 : p + 34], timestamp, attempts, buf[p + 34 : end]))
            elif by_fields:
                batch.append(
                    standard_message(
                        new, cls, buf[p + 18 : p + 34], timestamp, attempts, buf[p + 34 : end]
                    )
                )
            else:
                batch.append(cls(buf[p + 18 : p + 34], timestamp, attempts, buf[p + 34 : end]))
            p = end
        return p
    unpack = _MESSAGE_FRAME_HEADER.unpack_from
    message_type = _MESSAGE
    frame_type: int
    while n - pos >= 18:
        # a message frame's timestamp and attempts come with its header: one unpack
        size, frame_type, timestamp, attempts = unpack(buf, pos)
        end = pos + 4 + size
        if frame_type != message_type or end > n or size < smallest or size > max_size:
            break
        if native or by_fields:  # standard_message, inline: no call per message
            message = new(cls)
            message.id = buf[pos + 18 : pos + 34]
            message.timestamp = timestamp
            message.attempts = attempts
            message.body = buf[pos + 34 : end]
            message.trace_id = message.internal_id = message.ext_version = None
            message.ext_data = None
            message.queue_offset = message.raw_size = None
            batch.append(message)
        else:
            batch.append(cls(buf[pos + 18 : pos + 34], timestamp, attempts, buf[pos + 34 : end]))
        pos = end
    return pos


def _read_frames(conn: Connection, buf: bytes, pos: int) -> int:
    """The frame loop of ``conn``'s reads after its handshake: handle the whole frames of
    ``buf`` from ``pos`` on; where the first incomplete one starts (-1 once the connection
    closed)."""
    decoder = conn._decoder
    conn_id = conn.conn_id
    layout = conn.layout
    standard = layout is STANDARD_LAYOUT
    unpack_message_header = _MESSAGE_FRAME_HEADER.unpack_from
    unpack_frame_header = _FRAME_HEADER.unpack_from
    max_size = conn.config.max_frame_size
    outputs = conn._outputs
    receiving = conn.state in CAN_RECEIVE_MESSAGES
    batches = conn._batches
    batch = conn._run  # (batches) this read's messages since its last other frame
    cls = conn._message_class
    native = cls is Message  # then built directly (compiled: no call through an object)
    by_fields = conn._message_by_fields
    new = cls.__new__  # (by_fields) looked up once a read
    n = len(buf)
    size: int  # declared: the compiled build then compares machine ints, not objects
    frame_type: int
    timestamp: int
    attempts: int
    end: int
    # the common frame (a whole standard message, joining this read's run) goes in runs
    # (_standard_run); the loop takes every other frame, and one cut by the read
    fast = receiving and standard
    if fast and batch is not None:
        pos = _standard_run(buf, pos, batch, max_size, native, by_fields, new, cls)
    while True:
        if n - pos >= 18:
            # a message frame's timestamp and attempts come with its header: one unpack
            size, frame_type, timestamp, attempts = unpack_message_header(buf, pos)
        elif n - pos >= 8:
            size, frame_type = unpack_frame_header(buf, pos)
            timestamp = attempts = 0
        else:
            conn._run = batch
            return pos
        if size < 4 or size > max_size or frame_type < 0 or frame_type > 2:
            decoder.reject(size, frame_type)
        end = pos + 4 + size
        if end > n:
            conn._run = batch
            return pos
        if frame_type == _MESSAGE:
            if not receiving:
                raise RemoteProtocolError(
                    f"message frame in state {conn.state.value} (not subscribed)"
                )
            if not standard or size < 4 + MESSAGE_HEADER_SIZE:
                message = decode_message(buf[pos + 8 : end], layout, cls)
            elif native:  # decode_message's standard case, inline (once per message)
                message = Message(
                    buf[pos + 18 : pos + 34], timestamp, attempts, buf[pos + 34 : end]
                )
            elif by_fields:
                message = standard_message(
                    new, cls, buf[pos + 18 : pos + 34], timestamp, attempts, buf[pos + 34 : end]
                )
            else:
                message = cls(buf[pos + 18 : pos + 34], timestamp, attempts, buf[pos + 34 : end])
            if batch is not None:
                batch.append(message)
            else:
                if conn._wbuf:
                    conn._flush()
                if batches:
                    batch = [message]
                    outputs.append(MessagesReceived(conn_id, batch))
                else:
                    outputs.append(MessageReceived(conn_id, message))
        elif frame_type == _ERROR:
            batch = None
            conn._error_frame(buf[pos + 8 : end])
            if conn.state is ConnectionState.CLOSED:
                return -1
            receiving = conn.state in CAN_RECEIVE_MESSAGES
            fast = receiving and standard
        else:
            batch = None
            conn._response(buf[pos + 8 : end])
            receiving = conn.state in CAN_RECEIVE_MESSAGES
            fast = receiving and standard
        pos = end
        if fast and batch is not None:  # the run this frame started (or went on to)
            pos = _standard_run(buf, pos, batch, max_size, native, by_fields, new, cls)
