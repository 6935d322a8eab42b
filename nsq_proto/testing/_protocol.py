"""The server side of one TCP connection to the emulated nsqd (protocol V2).

The connection is written the way nsqd's ``IOLoop`` is: one generator reads the magic, then
a line, then whatever body the command needs, exactly as many bytes as nsqd would read, in
the same order and with the same checks.  The generator yields what it waits for; the
driver (:meth:`NsqdConnection.receive_data`) feeds it once enough bytes have arrived.  So a
body size that lies, a command split over many reads, or several commands in one read all
behave as they do against nsqd.

Output goes through a model of nsqd's buffered writer (Go's ``bufio.Writer`` with the
client's output buffer size) and, after the upgrade, through the snappy or deflate codec, so
compressed chunk boundaries are where nsqd puts them.  Response and error frames are flushed
at once; message frames are flushed when the client stops being ready or at the end of the
current call (the output buffer timeout is modelled as zero).
"""

from __future__ import annotations

import json
import struct
import zlib
from collections import deque
from collections.abc import Callable, Generator
from dataclasses import dataclass
from enum import IntEnum
from typing import TYPE_CHECKING, Any, ClassVar, Final, TypeVar

from .._compress import DeflateCodec, SnappyCodec
from .._errors import NSQError
from .._frames import CLOSE_WAIT, HEARTBEAT, OK, FrameType
from .._message import encode_message_data
from .._names import is_valid_channel_name, is_valid_topic_name
from ._options import AuthRequest, AuthState
from ._store import Channel, StoredMessage
from ._util import go_json, go_quote, parse_base10, to_int64

if TYPE_CHECKING:
    from ._nsqd import Nsqd

__all__ = ["NsqdConnection", "ClientState", "ClientError"]

MAGIC_V2: Final = b"  V2"
#: nsqd's bufio reader size: a command line longer than this closes the connection
MAX_LINE: Final = 16 * 1024
_LINE: Final = -1

_pack_frame_header = struct.Struct(">i").pack
_unpack_i32 = struct.Struct(">i").unpack
_MS = 1_000_000  # ns per ms


class ClientState(IntEnum):
    """A client's state as nsqd's ``/stats`` reports it."""

    #: connected (magic read), not subscribed
    INIT = 0
    DISCONNECTED = 1
    CONNECTED = 2
    #: after SUB
    SUBSCRIBED = 3
    #: after CLS
    CLOSING = 4


class ClientError(Exception):
    """An error frame: ``code`` + ``" "`` + ``description``; fatal ones close the connection."""

    def __init__(self, code: bytes | str, description: bytes | str, *, fatal: bool = True) -> None:
        self.code = code.encode() if isinstance(code, str) else code
        self.description = description.encode() if isinstance(description, str) else description
        self.fatal = fatal
        super().__init__(self.data.decode("utf-8", "replace"))

    @property
    def data(self) -> bytes:
        return self.code + b" " + self.description


def _fatal(code: str, description: bytes | str) -> ClientError:
    return ClientError(code, description, fatal=True)


@dataclass(frozen=True, slots=True)
class _Read:
    """What the protocol generator waits for: ``n`` bytes (or a line) and the error nsqd
    reports if the connection ends (EOF or read timeout) before they arrive."""

    n: int
    error: ClientError | None = None


class _AwaitTLS:
    pass


_AWAIT_TLS: Final = _AwaitTLS()

_Step = _Read | _AwaitTLS
Proto = Generator[_Step, Any, Any]
T = TypeVar("T")


class _GoBufWriter:
    """Go's ``bufio.Writer`` in front of a sink: same flush points, same pass-through of
    large writes when the buffer is empty."""

    __slots__ = ("_buf", "_sink", "size")

    def __init__(self, size: int, sink: Any) -> None:
        self.size = max(1, size)
        self._buf = bytearray()
        self._sink = sink

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def write(self, p: bytes) -> None:
        buf = self._buf
        while len(p) > self.size - len(buf):
            if not buf:
                self._sink(p)
                return
            n = self.size - len(buf)
            buf += p[:n]
            p = p[n:]
            self.flush()
        buf += p

    def flush(self) -> None:
        if self._buf:
            data = bytes(self._buf)
            self._buf.clear()
            self._sink(data)


class _ServerDeflate:
    """Raw DEFLATE for the levels :class:`DeflateCodec` refuses (0, Go's -1 and -2)."""

    def __init__(self, level: int) -> None:
        if level == -2:
            self._c = zlib.compressobj(6, zlib.DEFLATED, -15, 8, zlib.Z_HUFFMAN_ONLY)
        else:
            self._c = zlib.compressobj(6 if level == -1 else level, zlib.DEFLATED, -15)
        self._d = zlib.decompressobj(-15)

    def compress(self, data: bytes) -> bytes:
        return self._c.compress(data) + self._c.flush(zlib.Z_SYNC_FLUSH)

    def decompress(self, data: bytes) -> bytes:
        return self._d.decompress(data)


@dataclass(slots=True)
class _Identify:
    """The IDENTIFY body as nsqd's struct decodes it (missing keys are zero values)."""

    client_id: str = ""
    hostname: str = ""
    heartbeat_interval: int = 0
    output_buffer_size: int = 0
    output_buffer_timeout: int = 0
    feature_negotiation: bool = False
    tls_v1: bool = False
    deflate: bool = False
    deflate_level: int = 0
    snappy: bool = False
    sample_rate: int = 0
    user_agent: str = ""
    msg_timeout: int = 0
    # partitioned server
    short_id: str = ""
    long_id: str = ""
    desired_tag: str = ""
    extend_support: bool = False
    ext_filter: Any = None


_I64 = (-(1 << 63), (1 << 63) - 1)
_I32 = (-(1 << 31), (1 << 31) - 1)
_IDENTIFY_FIELDS: dict[str, tuple[str, tuple[int, int] | None]] = {
    "client_id": ("str", None),
    "hostname": ("str", None),
    "heartbeat_interval": ("int", _I64),
    "output_buffer_size": ("int", _I64),
    "output_buffer_timeout": ("int", _I64),
    "feature_negotiation": ("bool", None),
    "tls_v1": ("bool", None),
    "deflate": ("bool", None),
    "deflate_level": ("int", _I64),
    "snappy": ("bool", None),
    "sample_rate": ("int", _I32),
    "user_agent": ("str", None),
    "msg_timeout": ("int", _I64),
}
_PARTITIONED_FIELDS: dict[str, tuple[str, tuple[int, int] | None]] = {
    **_IDENTIFY_FIELDS,
    "short_id": ("str", None),
    "long_id": ("str", None),
    "desired_tag": ("str", None),
    "extend_support": ("bool", None),
    "ext_filter": ("object", None),
}


class _IntLiteral(int):
    """An integer parsed from a JSON number written without fraction or exponent."""


class _Pairs(list[tuple[str, Any]]):
    """The key/value pairs of a JSON object, in order (duplicates kept)."""


def _reject_constant(name: str) -> Any:
    raise ValueError(f"invalid JSON constant {name}")


def _plain(value: Any) -> Any:
    """A decoded JSON value with objects as dicts (the last of duplicate keys wins, as Go's)."""
    if isinstance(value, _Pairs):
        return {k: _plain(v) for k, v in value}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def decode_identify(body: bytes, *, partitioned: bool = False) -> _Identify | None:
    """Decode like Go's ``json.Unmarshal`` into nsqd's identify struct: unknown keys are
    ignored, keys match case-insensitively, ``null`` leaves a field alone, and any type
    mismatch (a quoted number, a float for an int, an out-of-range int) is an error.
    Returns ``None`` on error."""
    fields = _PARTITIONED_FIELDS if partitioned else _IDENTIFY_FIELDS
    try:
        text = body.decode("utf-8", "replace")
        obj = json.loads(
            text,
            parse_int=_IntLiteral,
            parse_float=float,
            parse_constant=_reject_constant,
            object_pairs_hook=_Pairs,
        )
    except (ValueError, RecursionError):
        return None
    if obj is None:
        return _Identify()
    if not isinstance(obj, _Pairs):
        return None  # not an object: json: cannot unmarshal array/number/... into struct
    result = _Identify()
    ok = True
    lowered = {name.lower(): name for name in fields}
    for key, value in obj:
        name = key if key in fields else lowered.get(key.lower())
        if name is None or value is None:
            continue
        kind, bounds = fields[name]
        if kind == "str":
            if isinstance(value, str):
                setattr(result, name, value)
            else:
                ok = False
        elif kind == "bool":
            if isinstance(value, bool):
                setattr(result, name, value)
            else:
                ok = False
        elif kind == "int":
            if isinstance(value, _IntLiteral) and bounds and bounds[0] <= value <= bounds[1]:
                setattr(result, name, int(value))
            else:
                ok = False
        elif kind == "object":
            if isinstance(value, _Pairs):
                setattr(result, name, _plain(value))
            else:
                ok = False
    return result if ok else None


class NsqdConnection:
    """One client connection, in the server role.  Create with :meth:`Nsqd.accept`.

    Drive it with :meth:`receive_data` (``b""`` is EOF), read what to send with
    :meth:`data_to_send`, and close the socket once :attr:`closed` is true and everything
    has been sent.  When :attr:`tls_requested` becomes true, run the server side of a TLS
    handshake on the socket (first feeding it :meth:`take_trailing_data`), then call
    :meth:`tls_established`; from then on pass decrypted bytes in and encrypt what comes out.
    """

    #: frames are written with binary (partitioned) or hex ids
    partitioned: bool = False

    def __init__(self, nsqd: Nsqd, client_id: int, now: float, remote_address: str) -> None:
        self._nsqd = nsqd
        opts = nsqd.options
        self.id = client_id
        self.remote_address = remote_address
        self.connected_at = now
        self._now = now
        # identity and negotiated settings
        host = remote_address.rsplit(":", 1)[0]
        self.client_id = host
        self.hostname = host
        self.user_agent = ""
        self.heartbeat_interval = opts.heartbeat_interval
        self.msg_timeout = opts.msg_timeout
        self.sample_rate = 0
        self.output_buffer_size = opts.output_buffer_size
        self.output_buffer_timeout = opts.output_buffer_timeout
        self.tls = False
        self.snappy = False
        self.deflate = False
        self.deflate_level = 0
        self.desired_tag = ""
        self.extend_support = False
        #: partitioned server: the ``ext_filter`` of IDENTIFY, where it could be built
        self._ext_filter: Callable[[StoredMessage], bool] | None = None
        # consumer state
        self.state = ClientState.INIT
        self.ready_count = 0
        self.in_flight_count = 0
        self.message_count = 0
        self.finish_count = 0
        self.requeue_count = 0
        self.pub_counts: dict[str, int] = {}
        self.channel: Channel | None = None
        #: the subscription asked for the 12-byte queue position (SUB_ORDERED/SUB_ADVANCED)
        self.trace_enabled = False
        # the message pump's own copies (nsqd reads IDENTIFY into the pump only once)
        self._identified = False
        self._pump_msg_timeout = opts.msg_timeout
        self._pump_sample_rate = 0
        self._pump_heartbeat = opts.heartbeat_interval
        self._hb_next: float | None = None
        self._read_deadline: float | None = None
        self._tls_deadline: float | None = None
        # auth
        self.auth_state: AuthState | None = None
        self._auth_secret = ""
        self._auth_expires = 0.0
        self._tls_common_name = ""
        # input
        self._rbuf = bytearray()
        self._trailing = bytearray()
        self._in_codec: Any = None
        self._started = False
        self._gen: Proto | None = self._io_loop()
        self._pending: _Step = next(self._gen)
        # output
        self._codec: Any = None
        self._deflate_pending = bytearray()
        self._wire = bytearray()
        self._writer = _GoBufWriter(opts.output_buffer_size, self._sink)
        self._ready_out = bytearray()
        self._held: deque[tuple[float, bytes]] = deque()
        self._stalled = False
        self._output_delay = nsqd._default_output_delay
        # lifecycle
        self._closed = False
        self.close_reason = ""

    def __repr__(self) -> str:
        return f"<NsqdConnection #{self.id} {self.remote_address} state={self.state.name}>"

    # -- public: transport ------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """The server is done: close the socket once :meth:`data_to_send` is drained."""
        return self._closed and not self._held

    @property
    def tls_requested(self) -> bool:
        """True between the plain IDENTIFY response that negotiated TLS and
        :meth:`tls_established`: the adapter must run the server-side handshake now."""
        return self._pending is _AWAIT_TLS and not self._closed

    def receive_data(self, data: bytes, now: float) -> None:
        """Bytes read from the socket (plaintext below TLS, still compressed if the client
        compresses); ``b""`` means the peer closed its side."""
        nsqd = self._nsqd
        nsqd._begin(now)
        self._now = now
        try:
            if self._closed:
                return
            if not data:
                self._eof("EOF")
                return
            if self._pending is _AWAIT_TLS:
                self._trailing += data
                return
            if self._in_codec is not None:
                try:
                    data = self._in_codec.decompress(data)
                except (NSQError, zlib.error):
                    self._shutdown("corrupt compressed stream")
                    return
            self._rbuf += data
            self._advance()
        finally:
            nsqd._end(now)

    def data_to_send(self) -> bytes:
        """Everything queued for this client (already compressed), emptying the queue."""
        out = bytes(self._ready_out)
        self._ready_out.clear()
        return out

    def take_trailing_data(self) -> bytes:
        """Bytes that arrived after the IDENTIFY that started TLS: they belong to the TLS
        handshake, feed them to it before anything read later."""
        out = bytes(self._trailing)
        self._trailing.clear()
        return out

    def tls_established(self, now: float, *, common_name: str = "") -> None:
        """The server-side TLS handshake finished; nsqd now sends ``OK`` inside TLS."""
        if self._pending is not _AWAIT_TLS:
            raise RuntimeError("no TLS upgrade is pending on this connection")
        nsqd = self._nsqd
        nsqd._begin(now)
        self._now = now
        try:
            self.tls = True
            self._tls_common_name = common_name
            self._tls_deadline = None
            self._send(None)
            self._advance()
        finally:
            nsqd._end(now)

    def connection_lost(self, now: float) -> None:
        """The socket failed or was closed under us: same as EOF, without output."""
        nsqd = self._nsqd
        nsqd._begin(now)
        self._now = now
        try:
            if not self._closed:
                self._shutdown("connection lost")
            self._ready_out.clear()
            self._held.clear()
        finally:
            nsqd._end(now)

    # -- public: inspection -----------------------------------------------------------------

    @property
    def subscription(self) -> tuple[str, str] | None:
        """``(topic, channel)`` after SUB, else ``None``."""
        ch = self.channel
        return None if ch is None else (ch.topic.name, ch.name)

    @property
    def is_ready(self) -> bool:
        """nsqd's ``IsReadyForMessages``: subscribed, channel not paused, in flight < RDY."""
        ch = self.channel
        if ch is None or ch.paused or self._closed:
            return False
        return self.ready_count > 0 and self.in_flight_count < self.ready_count

    # -- public: fault injection ------------------------------------------------------------

    def drop(self, now: float) -> None:
        """Simulate a network failure: the connection is gone, queued output is lost."""
        self.connection_lost(now)
        self.close_reason = "dropped"

    def stall(self) -> None:
        """Hold every byte the server writes until :meth:`resume`."""
        self._stalled = True

    def resume(self, now: float) -> None:
        """Release output held by :meth:`stall` (delayed output keeps its own schedule)."""
        nsqd = self._nsqd
        nsqd._begin(now)
        self._now = now
        try:
            self._stalled = False
            self._release(now)
        finally:
            nsqd._end(now)

    def delay_output(self, seconds: float) -> None:
        """From now on, hold each write for ``seconds`` before it becomes sendable."""
        self._output_delay = max(0.0, seconds)

    # -- timers (called by Nsqd) ------------------------------------------------------------

    def _next_deadline(self) -> float | None:
        best: float | None = None
        if not self._closed:
            for t in (self._read_deadline, self._tls_deadline):
                if t is not None and (best is None or t < best):
                    best = t
            hb = self._hb_next
            if hb is not None and self._pending is not _AWAIT_TLS and (best is None or hb < best):
                best = hb
        if self._held and not self._stalled:
            t = self._held[0][0]
            if best is None or t < best:
                best = t
        return best

    def _fire(self, t: float) -> None:
        self._now = t
        if not self._closed:
            if self._tls_deadline is not None and self._tls_deadline <= t:
                self._shutdown("TLS handshake timeout")
            elif self._read_deadline is not None and self._read_deadline <= t:
                self._eof("read timeout")
            elif (
                self._hb_next is not None and self._hb_next <= t and self._pending is not _AWAIT_TLS
            ):
                interval = self._pump_heartbeat
                while self._hb_next <= t:
                    self._hb_next += interval
                self._send_frame(FrameType.RESPONSE, HEARTBEAT)
        self._release(t)

    # -- consumer bookkeeping (called by channels and the pump) -----------------------------

    def message_timed_out(self) -> None:
        self.in_flight_count -= 1
        self._nsqd._dirty_client(self)

    def _deliver(self, msg: StoredMessage, now: float) -> None:
        """The pump hands this client a message."""
        channel = self.channel
        assert channel is not None
        msg.attempts = (msg.attempts + 1) & 0xFFFF
        channel.start_in_flight(msg, self.id, now, self._pump_msg_timeout)
        self.in_flight_count += 1
        self.message_count += 1
        self._send_frame(FrameType.MESSAGE, self._message_data(msg))
        if not self.is_ready:
            self._flush()

    def _sampled_out(self, rng_value: int) -> bool:
        return self._pump_sample_rate > 0 and rng_value > self._pump_sample_rate

    def _message_data(self, msg: StoredMessage) -> bytes:
        return encode_message_data(msg.id, msg.timestamp, msg.attempts, msg.body)

    # -- output -----------------------------------------------------------------------------

    def _sink(self, data: bytes) -> None:
        codec = self._codec
        if codec is None:
            self._wire += data
        elif self.deflate:
            self._deflate_pending += data
        else:
            self._wire += codec.compress(data)

    def _flush(self) -> None:
        self._writer.flush()
        if self._deflate_pending:
            self._wire += self._codec.compress(bytes(self._deflate_pending))
            self._deflate_pending.clear()
        self._nsqd._unflushed.discard(self)
        if self._wire:
            data = bytes(self._wire)
            self._wire.clear()
            if self._stalled or self._output_delay > 0 or self._held:
                self._held.append((self._now + self._output_delay, data))
            else:
                self._ready_out += data
                self._nsqd._attention[self] = None

    def _release(self, now: float) -> None:
        held = self._held
        while held and not self._stalled and held[0][0] <= now:
            self._ready_out += held.popleft()[1]
            self._nsqd._attention[self] = None

    def _send_frame(self, frame_type: int, data: bytes) -> None:
        w = self._writer
        w.write(_pack_frame_header(len(data) + 4))
        w.write(_pack_frame_header(frame_type))
        w.write(data)
        if frame_type != FrameType.MESSAGE:
            self._flush()
        else:
            self._nsqd._unflushed.add(self)

    def _send_error(self, err: ClientError) -> None:
        self._send_frame(FrameType.ERROR, err.data)

    # -- input driver -----------------------------------------------------------------------

    def _send(self, value: Any) -> None:
        gen = self._gen
        assert gen is not None
        try:
            self._pending = gen.send(value)
        except StopIteration:
            self._gen = None
            self._shutdown(self.close_reason or "closed by server")

    def _advance(self) -> None:
        while self._gen is not None and not self._closed:
            req = self._pending
            if not isinstance(req, _Read):
                return
            buf = self._rbuf
            if req.n == _LINE:
                idx = buf.find(b"\n", 0, MAX_LINE)
                if idx < 0:
                    if len(buf) >= MAX_LINE:
                        self._shutdown("command line too long")
                    return
                data = bytes(buf[: idx + 1])
                del buf[: idx + 1]
            else:
                if len(buf) < req.n:
                    return
                data = bytes(buf[: req.n])
                del buf[: req.n]
            self._send(data)

    def _eof(self, reason: str) -> None:
        """The input ended (EOF or read deadline): silent close unless a body was awaited."""
        req = self._pending
        if isinstance(req, _Read) and req.error is not None and self._started:
            self._send_error(req.error)
        self._shutdown(reason)

    def _shutdown(self, reason: str) -> None:
        if self._closed:
            return
        self._flush()
        self._closed = True
        self.close_reason = reason
        self._nsqd._attention[self] = None
        if self._gen is not None:
            self._gen.close()
            self._gen = None
        self._read_deadline = None
        self._hb_next = None
        self._tls_deadline = None
        self._nsqd._connection_closed(self, self._now)

    def _upgrade_input(self, codec: Any) -> None:
        """Bytes already buffered after the upgrade point belong to the compressed stream."""
        self._in_codec = codec
        if self._rbuf:
            raw = bytes(self._rbuf)
            self._rbuf.clear()
            self._rbuf += codec.decompress(raw)

    # -- the IO loop --------------------------------------------------------------------------

    @property
    def _read_timeout_intervals(self) -> int:
        return 2

    def _io_loop(self) -> Proto:
        magic = yield _Read(4, None)
        if magic != MAGIC_V2:
            self._send_frame(FrameType.ERROR, b"E_BAD_PROTOCOL")
            self.close_reason = "bad protocol magic"
            return
        if not (yield from self._accept_client()):
            return
        self._started = True
        self._pump_heartbeat = self.heartbeat_interval
        self._hb_next = self._now + self.heartbeat_interval
        nsqd = self._nsqd
        while True:
            hb = self.heartbeat_interval
            self._read_deadline = self._now + hb * self._read_timeout_intervals if hb > 0 else None
            line = yield _Read(_LINE, None)
            params = yield from self._read_params(line)
            try:
                injected = nsqd._take_injected(params[0])
                if injected is not None:
                    yield from self._skip_body(params)
                    raise injected
                response = yield from self._exec(params)
            except ClientError as err:
                self._send_error(err)
                if err.fatal:
                    self.close_reason = err.data.decode("utf-8", "replace")
                    return
                nsqd._pump(self._now)
                continue
            if response is not None:
                self._send_frame(FrameType.RESPONSE, response)
            nsqd._pump(self._now)

    def _accept_client(self) -> Generator[_Step, Any, bool]:
        """Hook run after the magic (the partitioned server may refuse the client here)."""
        return True
        yield  # pragma: no cover

    def _read_params(self, line: bytes) -> Generator[_Step, Any, list[bytes]]:
        body = line[:-1]
        if body.endswith(b"\r"):
            body = body[:-1]
        return body.split(b" ")
        yield  # pragma: no cover

    def _skip_body(self, params: list[bytes]) -> Proto:
        """Consume the body of a command rejected by fault injection."""
        if params[0] in self._BODY_COMMANDS:
            size = yield from self._read_len(None)
            if size > 0:
                yield _Read(size, None)

    _BODY_COMMANDS: ClassVar[frozenset[bytes]] = frozenset(
        {b"IDENTIFY", b"AUTH", b"PUB", b"MPUB", b"DPUB"}
    )

    def _read_mpub_messages(
        self, convert: Callable[[int, bytes], T]
    ) -> Generator[_Step, Any, list[T]]:
        """MPUB's message count and messages, each checked as read and passed to ``convert``
        (which may raise, leaving the rest of the batch unread as nsqd does)."""
        opts = self._nsqd.options
        count = yield from self._read_len(_fatal("E_BAD_BODY", "MPUB failed to read message count"))
        if count <= 0 or count > (opts.max_body_size - 4) // 5:
            raise _fatal("E_BAD_BODY", f"MPUB invalid message count {count}")
        items: list[T] = []
        for i in range(count):
            msize = yield from self._read_len(
                _fatal("E_BAD_MESSAGE", f"MPUB failed to read message({i}) body size")
            )
            if msize <= 0:
                raise _fatal("E_BAD_MESSAGE", f"MPUB invalid message({i}) body size {msize}")
            if msize > opts.max_msg_size:
                raise _fatal("E_BAD_MESSAGE", f"MPUB message too big {msize} > {opts.max_msg_size}")
            data = yield _Read(msize, _fatal("E_BAD_MESSAGE", "MPUB failed to read message body"))
            items.append(convert(i, data))
        return items

    def _read_len(self, error: ClientError | None) -> Generator[_Step, Any, int]:
        data = yield _Read(4, error)
        value: int = _unpack_i32(data)[0]
        return value

    def _exec(self, params: list[bytes]) -> Proto:
        cmd = params[0]
        if cmd == b"IDENTIFY":
            return (yield from self._identify(params))
        self._enforce_tls_policy(cmd)
        handler = self._HANDLERS.get(cmd)
        if handler is None:
            raise self._invalid_command(params)
        return (yield from handler(self, params))

    def _invalid_command(self, params: list[bytes]) -> ClientError:
        return _fatal("E_INVALID", b"invalid command " + params[0])

    def _enforce_tls_policy(self, cmd: bytes) -> None:
        if self._nsqd.options.tls_required and not self.tls:
            raise _fatal("E_INVALID", b"cannot " + cmd + b" in current state (TLS required)")

    # -- IDENTIFY -----------------------------------------------------------------------------

    def _identify(self, params: list[bytes]) -> Proto:
        opts = self._nsqd.options
        if self.state != ClientState.INIT:
            raise _fatal("E_INVALID", "cannot IDENTIFY in current state")
        size = yield from self._read_len(_fatal("E_BAD_BODY", "IDENTIFY failed to read body size"))
        if size > opts.max_body_size:
            raise _fatal("E_BAD_BODY", f"IDENTIFY body too big {size} > {opts.max_body_size}")
        if size <= 0:
            raise _fatal("E_BAD_BODY", f"IDENTIFY invalid body size {size}")
        body = yield _Read(size, _fatal("E_BAD_BODY", "IDENTIFY failed to read body"))
        data = decode_identify(body, partitioned=self.partitioned)
        if data is None:
            raise _fatal("E_BAD_BODY", "IDENTIFY failed to decode JSON body")
        problem = self._apply_identify(data)
        if problem is not None:
            raise _fatal("E_BAD_BODY", "IDENTIFY " + problem)
        if not data.feature_negotiation:
            return OK
        tls = opts.tls and data.tls_v1
        deflate = opts.deflate and data.deflate
        level = self._deflate_level(deflate, data.deflate_level)
        snappy = opts.snappy and data.snappy
        if deflate and snappy:
            raise _fatal("E_IDENTIFY_FAILED", "cannot enable both deflate and snappy compression")
        self._send_frame(
            FrameType.RESPONSE, go_json(self._identify_response(tls, deflate, level, snappy))
        )
        if tls:
            self._trailing += self._rbuf
            self._rbuf.clear()
            self._tls_deadline = self._now + opts.tls_handshake_timeout
            yield _AWAIT_TLS
            self._send_frame(FrameType.RESPONSE, OK)
        if snappy:
            self._writer.flush()
            self._codec = SnappyCodec()
            self.snappy = True
            self._writer = _GoBufWriter(self.output_buffer_size, self._sink)
            self._upgrade_input(SnappyCodec())
            self._send_frame(FrameType.RESPONSE, OK)
        if deflate:
            codec = self._make_deflate(level)
            if isinstance(codec, ClientError):
                raise codec
            self._writer.flush()
            self._codec = codec
            self.deflate = True
            self.deflate_level = level
            self._writer = _GoBufWriter(self.output_buffer_size, self._sink)
            self._upgrade_input(self._make_deflate(level))
            self._send_frame(FrameType.RESPONSE, OK)
        return None

    def _deflate_level(self, deflate: bool, asked: int) -> int:
        level = 6
        if deflate and asked > 0:
            level = asked
        return min(level, self._nsqd.options.max_deflate_level)

    def _make_deflate(self, level: int) -> Any:
        if 1 <= level <= 9:
            return DeflateCodec(level)
        if -2 <= level <= 0:
            return _ServerDeflate(level)
        return _fatal(
            "E_IDENTIFY_FAILED",
            f"IDENTIFY failed flate: invalid compression level {level}: want value in range [-2, 9]",
        )

    def _identify_response(
        self, tls: bool, deflate: bool, level: int, snappy: bool
    ) -> dict[str, Any]:
        opts = self._nsqd.options
        return {
            "max_rdy_count": opts.max_rdy_count,
            "version": opts.server_version,
            "max_msg_timeout": round(opts.max_msg_timeout * 1000),
            "msg_timeout": round(self.msg_timeout * 1000),
            "tls_v1": tls,
            "deflate": deflate,
            "deflate_level": level,
            "max_deflate_level": opts.max_deflate_level,
            "snappy": snappy,
            "sample_rate": self.sample_rate,
            "auth_required": opts.auth_enabled,
            "output_buffer_size": self.output_buffer_size,
            "output_buffer_timeout": round(self.output_buffer_timeout * 1000),
        }

    def _apply_identify(self, data: _Identify) -> str | None:
        """nsqd's ``clientV2.Identify``: returns the error text, or None."""
        opts = self._nsqd.options
        self._apply_names(data)
        hb = data.heartbeat_interval
        if hb == -1:
            self.heartbeat_interval = 0.0
        elif hb == 0:
            pass
        elif 1000 <= hb <= int(opts.max_heartbeat_interval * 1000):
            self.heartbeat_interval = hb / 1000.0
        else:
            return f"heartbeat interval ({hb}) is invalid"
        problem = self._apply_output_buffer(data.output_buffer_size, data.output_buffer_timeout)
        if problem is not None:
            return problem
        if not 0 <= data.sample_rate <= 99:
            return f"sample rate ({data.sample_rate}) is invalid"
        self.sample_rate = data.sample_rate
        mt = data.msg_timeout
        if mt == 0:
            pass
        elif 1000 <= mt <= int(opts.max_msg_timeout * 1000):
            self.msg_timeout = mt / 1000.0
        else:
            return f"msg timeout ({mt}) is invalid"
        problem = self._apply_extensions(data)
        if problem is not None:
            return problem
        self._identify_event()
        return None

    def _apply_names(self, data: _Identify) -> None:
        self.client_id = data.client_id
        self.hostname = data.hostname
        self.user_agent = data.user_agent

    def _apply_extensions(self, data: _Identify) -> str | None:
        """IDENTIFY keys of the partitioned server (none on standard nsqd)."""
        return None

    def _apply_output_buffer(self, size: int, timeout: int) -> str | None:
        opts = self._nsqd.options
        if timeout == -1:
            self.output_buffer_timeout = 0.0
        elif timeout == 0:
            pass
        elif (
            int(opts.min_output_buffer_timeout * 1000)
            <= timeout
            <= int(opts.max_output_buffer_timeout * 1000)
        ):
            self.output_buffer_timeout = timeout / 1000.0
        else:
            return f"output buffer timeout ({timeout}) is invalid"
        if size == -1:
            self.output_buffer_size = 1
            self.output_buffer_timeout = 0.0
        elif size == 0:
            pass
        elif 64 <= size <= opts.max_output_buffer_size:
            self.output_buffer_size = size
        else:
            return f"output buffer size ({size}) is invalid"
        if size != 0:
            self._flush()
            self._writer = _GoBufWriter(self.output_buffer_size, self._sink)
        return None

    def _identify_event(self) -> None:
        """The message pump reads the first IDENTIFY only (heartbeat ticker, sampling,
        message timeout); later IDENTIFYs change the connection but not the pump."""
        if self._identified:
            return
        self._identified = True
        self._pump_heartbeat = self.heartbeat_interval
        self._hb_next = self._now + self.heartbeat_interval if self.heartbeat_interval > 0 else None
        if self.sample_rate > 0:
            self._pump_sample_rate = self.sample_rate
        self._pump_msg_timeout = self.msg_timeout

    # -- AUTH -----------------------------------------------------------------------------------

    def _has_authorizations(self) -> bool:
        return self.auth_state is not None and len(self.auth_state.authorizations) != 0

    def _query_auth(self) -> bool:
        authorizer = self._nsqd.options.auth
        assert authorizer is not None
        request = AuthRequest(
            secret=self._auth_secret,
            remote_ip=self.remote_address.rsplit(":", 1)[0],
            tls=self.tls,
            common_name=self._tls_common_name,
        )
        state = authorizer(request)
        if state is None or not state.valid():
            return False
        self.auth_state = state
        self._auth_expires = self._now + state.ttl
        return True

    def _auth(self, params: list[bytes]) -> Proto:
        opts = self._nsqd.options
        if self.state != ClientState.INIT:
            raise _fatal("E_INVALID", "cannot AUTH in current state")
        if len(params) != 1:
            raise _fatal("E_INVALID", "AUTH invalid number of parameters")
        size = yield from self._read_len(_fatal("E_BAD_BODY", "AUTH failed to read body size"))
        if size > opts.max_body_size:
            raise _fatal("E_BAD_BODY", f"AUTH body too big {size} > {opts.max_body_size}")
        if size <= 0:
            raise _fatal("E_BAD_BODY", f"AUTH invalid body size {size}")
        body = yield _Read(size, _fatal("E_BAD_BODY", "AUTH failed to read body"))
        if self._has_authorizations():
            raise _fatal("E_INVALID", self._auth_text("AUTH already set"))
        if not opts.auth_enabled:
            raise _fatal("E_AUTH_DISABLED", self._auth_text("AUTH disabled"))
        self._auth_secret = body.decode("utf-8", "surrogateescape")
        if not self._query_auth():
            raise _fatal("E_AUTH_FAILED", "AUTH failed")
        if not self._has_authorizations():
            raise _fatal("E_UNAUTHORIZED", self._auth_text("AUTH no authorizations found"))
        state = self.auth_state
        assert state is not None
        return go_json(
            {
                "identity": state.identity,
                "identity_url": state.identity_url,
                "permission_count": len(state.authorizations),
            }
        )

    def _auth_text(self, text: str) -> str:
        return text

    def _check_auth(self, cmd: str, topic: bytes, channel: bytes) -> None:
        if not self._nsqd.options.auth_enabled:
            return
        if not self._has_authorizations():
            raise _fatal("E_AUTH_FIRST", f"AUTH required before {cmd}")
        if self._now >= self._auth_expires and not self._query_auth():
            raise _fatal("E_AUTH_FAILED", "AUTH failed")
        state = self.auth_state
        assert state is not None
        t = topic.decode("utf-8", "surrogateescape")
        c = channel.decode("utf-8", "surrogateescape")
        if not any(a.allows(t, c) for a in state.authorizations):
            raise _fatal(
                "E_UNAUTHORIZED",
                b"AUTH failed for "
                + cmd.encode()
                + b" on "
                + go_quote(topic)
                + b" "
                + go_quote(channel),
            )

    # -- consumer commands ------------------------------------------------------------------

    def _sub(self, params: list[bytes]) -> Proto:
        if self.state != ClientState.INIT:
            raise _fatal("E_INVALID", "cannot SUB in current state")
        if self.heartbeat_interval <= 0:
            raise _fatal("E_INVALID", "cannot SUB with heartbeats disabled")
        if len(params) < 3:
            raise _fatal("E_INVALID", "SUB insufficient number of parameters")
        topic_name, channel_name = params[1], params[2]
        if not _valid_name(topic_name):
            raise _fatal(
                "E_BAD_TOPIC", b"SUB topic name " + go_quote(topic_name) + b" is not valid"
            )
        if not _valid_name(channel_name, channel=True):
            raise _fatal(
                "E_BAD_CHANNEL", b"SUB channel name " + go_quote(channel_name) + b" is not valid"
            )
        self._check_auth("SUB", topic_name, channel_name)
        nsqd = self._nsqd
        topic = nsqd._get_topic(topic_name.decode(), self._now)
        channel = nsqd._get_channel(topic, channel_name.decode(), self._now)
        limit = nsqd.options.max_channel_consumers
        if limit and len(channel.clients) >= limit:
            raise _fatal(
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
        self._nsqd._dirty_channel(channel)

    def _rdy(self, params: list[bytes]) -> Proto:
        if self.state == ClientState.CLOSING:
            return None
        if self.state != ClientState.SUBSCRIBED:
            raise _fatal("E_INVALID", "cannot RDY in current state")
        count = 1
        if len(params) > 1:
            parsed = parse_base10(params[1])
            if parsed is None:
                raise _fatal("E_INVALID", b"RDY could not parse count " + params[1])
            count = to_int64(parsed)
        limit = self._nsqd.options.max_rdy_count
        if count < 0 or count > limit:
            raise _fatal("E_INVALID", f"RDY count {count} out of range 0-{limit}")
        self._set_ready(count)
        return None
        yield  # pragma: no cover

    def _set_ready(self, count: int) -> None:
        self.ready_count = count
        self._nsqd._dirty_client(self)
        if not self.is_ready:
            self._flush()

    def _check_consume_state(self, cmd: str) -> Channel:
        if self.state not in (ClientState.SUBSCRIBED, ClientState.CLOSING):
            raise _fatal("E_INVALID", f"cannot {cmd} in current state")
        channel = self.channel
        assert channel is not None
        return channel

    def _message_id(self, raw: bytes) -> bytes:
        if len(raw) != 16:
            raise _fatal("E_INVALID", "invalid message ID")
        return raw

    def _fin(self, params: list[bytes]) -> Proto:
        channel = self._check_consume_state("FIN")
        if len(params) < 2:
            raise _fatal("E_INVALID", "FIN insufficient number of params")
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
        self._nsqd._dirty_client(self)
        return None
        yield  # pragma: no cover

    def _req(self, params: list[bytes]) -> Proto:
        channel = self._check_consume_state("REQ")
        if len(params) < 3:
            raise _fatal("E_INVALID", "REQ insufficient number of params")
        msg_id = self._message_id(params[1])
        parsed = parse_base10(params[2])
        if parsed is None:
            raise _fatal("E_INVALID", b"REQ could not parse timeout " + params[2])
        delay_ns = to_int64(to_int64(parsed) * _MS)
        max_ns = round(self._nsqd.options.max_req_timeout * 1e9)
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
        self._nsqd._dirty_client(self)
        self._nsqd._dirty_channel(channel)
        return None
        yield  # pragma: no cover

    def _touch(self, params: list[bytes]) -> Proto:
        channel = self._check_consume_state("TOUCH")
        if len(params) < 2:
            raise _fatal("E_INVALID", "TOUCH insufficient number of params")
        msg_id = self._message_id(params[1])
        problem = channel.touch(
            self.id, msg_id, self._now, self.msg_timeout, self._nsqd.options.max_msg_timeout
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
            raise _fatal("E_INVALID", "cannot CLS in current state")
        self._set_ready(0)
        self.state = ClientState.CLOSING
        return CLOSE_WAIT
        yield  # pragma: no cover

    def _nop(self, params: list[bytes]) -> Proto:
        return None
        yield  # pragma: no cover

    # -- producer commands ------------------------------------------------------------------

    def _published(self, topic: str, count: int) -> None:
        self.pub_counts[topic] = self.pub_counts.get(topic, 0) + count

    def _pub(self, params: list[bytes]) -> Proto:
        opts = self._nsqd.options
        if len(params) < 2:
            raise _fatal("E_INVALID", "PUB insufficient number of parameters")
        topic_name = params[1]
        if not _valid_name(topic_name):
            raise _fatal(
                "E_BAD_TOPIC", b"PUB topic name " + go_quote(topic_name) + b" is not valid"
            )
        size = yield from self._read_len(
            _fatal("E_BAD_MESSAGE", "PUB failed to read message body size")
        )
        if size <= 0:
            raise _fatal("E_BAD_MESSAGE", f"PUB invalid message body size {size}")
        if size > opts.max_msg_size:
            raise _fatal("E_BAD_MESSAGE", f"PUB message too big {size} > {opts.max_msg_size}")
        body = yield _Read(size, _fatal("E_BAD_MESSAGE", "PUB failed to read message body"))
        self._check_auth("PUB", topic_name, b"")
        name = topic_name.decode()
        nsqd = self._nsqd
        topic = nsqd._get_topic(name, self._now)
        nsqd._put(topic, nsqd._new_message(topic, body, self._now), self._now)
        self._published(name, 1)
        return OK

    def _mpub(self, params: list[bytes]) -> Proto:
        opts = self._nsqd.options
        if len(params) < 2:
            raise _fatal("E_INVALID", "MPUB insufficient number of parameters")
        topic_name = params[1]
        if not _valid_name(topic_name):
            raise _fatal(
                "E_BAD_TOPIC",
                b"E_BAD_TOPIC MPUB topic name " + go_quote(topic_name) + b" is not valid",
            )
        self._check_auth("MPUB", topic_name, b"")
        name = topic_name.decode()
        nsqd = self._nsqd
        topic = nsqd._get_topic(name, self._now)
        size = yield from self._read_len(_fatal("E_BAD_BODY", "MPUB failed to read body size"))
        if size <= 0:
            raise _fatal("E_BAD_BODY", f"MPUB invalid body size {size}")
        if size > opts.max_body_size:
            raise _fatal("E_BAD_BODY", f"MPUB body too big {size} > {opts.max_body_size}")
        bodies = yield from self._read_mpub_messages(lambda i, body: body)
        messages = [nsqd._new_message(topic, body, self._now) for body in bodies]
        for msg in messages:
            nsqd._put(topic, msg, self._now)
        self._published(name, len(messages))
        return OK

    def _dpub(self, params: list[bytes]) -> Proto:
        opts = self._nsqd.options
        if len(params) < 3:
            raise _fatal("E_INVALID", "DPUB insufficient number of parameters")
        topic_name = params[1]
        if not _valid_name(topic_name):
            raise _fatal(
                "E_BAD_TOPIC", b"DPUB topic name " + go_quote(topic_name) + b" is not valid"
            )
        parsed = parse_base10(params[2])
        if parsed is None:
            raise _fatal("E_INVALID", b"DPUB could not parse timeout " + params[2])
        delay_ns = to_int64(to_int64(parsed) * _MS)
        max_ms = round(opts.max_req_timeout * 1000)
        if delay_ns < 0 or delay_ns > max_ms * _MS:
            raise _fatal("E_INVALID", f"DPUB timeout {parsed} out of range 0-{max_ms}")
        size = yield from self._read_len(
            _fatal("E_BAD_MESSAGE", "DPUB failed to read message body size")
        )
        if size <= 0:
            raise _fatal("E_BAD_MESSAGE", f"DPUB invalid message body size {size}")
        if size > opts.max_msg_size:
            raise _fatal("E_BAD_MESSAGE", f"DPUB message too big {size} > {opts.max_msg_size}")
        body = yield _Read(size, _fatal("E_BAD_MESSAGE", "DPUB failed to read message body"))
        self._check_auth("DPUB", topic_name, b"")
        name = topic_name.decode()
        nsqd = self._nsqd
        topic = nsqd._get_topic(name, self._now)
        msg = nsqd._new_message(topic, body, self._now)
        msg.deferred = delay_ns / 1e9
        nsqd._put(topic, msg, self._now)
        self._published(name, 1)
        return OK

    _HANDLERS: ClassVar[dict[bytes, Any]] = {
        b"FIN": _fin,
        b"RDY": _rdy,
        b"REQ": _req,
        b"PUB": _pub,
        b"MPUB": _mpub,
        b"DPUB": _dpub,
        b"NOP": _nop,
        b"TOUCH": _touch,
        b"SUB": _sub,
        b"CLS": _cls,
        b"AUTH": _auth,
    }


def _valid_name(raw: bytes, *, channel: bool = False) -> bool:
    try:
        name = raw.decode("ascii")
    except UnicodeDecodeError:
        return False
    return is_valid_channel_name(name) if channel else is_valid_topic_name(name)
