"""The server side of one TCP connection to the emulated nsqd, without its commands and its
public API (see :class:`~._protocol.NsqdConnection`).

The connection is written the way nsqd's ``IOLoop`` is: one generator reads the magic, then
a line, then whatever body the command needs, exactly as many bytes as nsqd would read, in
the same order and with the same checks.  The generator yields what it waits for; the
driver (``NsqdConnection.receive_data``) feeds it once enough bytes have arrived.  So a
body size that lies, a command split over many reads, or several commands in one read all
behave as they do against nsqd.

Each command is a generator method found in a handler table (command name -> method) that
the concrete connection builds from its command groups (:mod:`._identify`,
:mod:`._consumer_commands`, :mod:`._producer_commands`).

Output goes through a model of nsqd's buffered writer (Go's ``bufio.Writer`` with the
client's output buffer size) and, after the upgrade, through the snappy or deflate codec, so
compressed chunk boundaries are where nsqd puts them.  Response and error frames are flushed
at once; message frames are flushed when the client stops being ready or at the end of the
current call (the output buffer timeout is modelled as zero).

The connection knows its nsqd only through the :class:`~._node.Node` protocol.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator
from typing import Any, ClassVar, Self

from nsq_proto.wire import HEARTBEAT, FrameType

from ._node import Node
from ._options import AuthRequest, AuthState
from ._store import Channel, StoredMessage
from ._util import go_quote
from ._wire import (
    AWAIT_TLS,
    LINE,
    MAGIC_V2,
    MAX_LINE,
    ClientError,
    ClientState,
    GoBufWriter,
    Proto,
    Read,
    Step,
    fatal,
    pack_frame_header,
    unpack_i32,
)

__all__ = ["ConnectionCore", "Handler"]

#: a command: its parameters in, a generator that reads its body and returns the response
Handler = Callable[[list[bytes]], Proto]


class ConnectionCore:
    """One client connection, in the server role: output, the input driver, timers, the IO
    loop and the checks every command shares (TLS policy, authorization).  The commands
    come from the subclasses' :meth:`_command_table`, the public API from
    ``NsqdConnection``."""

    #: frames are written with binary (partitioned) or hex ids
    partitioned: bool = False

    _node: Node[Self]

    def __init__(self, node: Node[Self], client_id: int, now: float, remote_address: str) -> None:
        self._node = node
        opts = node.options
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
        self._handlers = self._command_table()
        self._rbuf = bytearray()
        self._trailing = bytearray()
        self._in_codec: Any = None
        self._started = False
        self._gen: Proto | None = self._io_loop()
        self._pending: Step = next(self._gen)
        # output
        self._codec: Any = None
        self._deflate_pending = bytearray()
        self._wire = bytearray()
        self._writer = GoBufWriter(opts.output_buffer_size, self._sink)
        self._ready_out = bytearray()
        self._held: deque[tuple[float, bytes]] = deque()
        self._stalled = False
        self._output_delay = node.output_delay
        # lifecycle
        self._closed = False
        self.close_reason = ""

    def __repr__(self) -> str:
        return f"<NsqdConnection #{self.id} {self.remote_address} state={self.state.name}>"

    def _command_table(self) -> dict[bytes, Handler]:
        """Command name -> handler (the subclasses list their commands)."""
        return {}

    # -- state the parts share -----------------------------------------------------------------

    def _ready_for_messages(self) -> bool:
        """nsqd's ``IsReadyForMessages``: subscribed, channel not paused, in flight < RDY."""
        ch = self.channel
        if ch is None or ch.paused or self._closed:
            return False
        return self.ready_count > 0 and self.in_flight_count < self.ready_count

    @property
    def output_held(self) -> bool:
        """Some output waits for its delay (or for a resume after a stall)."""
        return bool(self._held)

    # -- called by the node -----------------------------------------------------------------

    def next_deadline(self) -> float | None:
        """When :meth:`fire` has work: a read, TLS or heartbeat deadline, or held output."""
        best: float | None = None
        if not self._closed:
            for t in (self._read_deadline, self._tls_deadline):
                if t is not None and (best is None or t < best):
                    best = t
            hb = self._hb_next
            if hb is not None and self._pending is not AWAIT_TLS and (best is None or hb < best):
                best = hb
        if self._held and not self._stalled:
            t = self._held[0][0]
            if best is None or t < best:
                best = t
        return best

    def fire(self, t: float) -> None:
        """Run what is due at ``t``: one deadline, then release held output."""
        self._now = t
        if not self._closed:
            if self._tls_deadline is not None and self._tls_deadline <= t:
                self.shutdown("TLS handshake timeout")
            elif self._read_deadline is not None and self._read_deadline <= t:
                self._eof("read timeout")
            elif (
                self._hb_next is not None and self._hb_next <= t and self._pending is not AWAIT_TLS
            ):
                interval = self._pump_heartbeat
                while self._hb_next <= t:
                    self._hb_next += interval
                self._send_frame(FrameType.RESPONSE, HEARTBEAT)
        self._release(t)

    def shutdown(self: Self, reason: str) -> None:
        """Close the connection from the server side (what was written is still sent)."""
        if self._closed:
            return
        self.flush()
        self._closed = True
        self.close_reason = reason
        self._node.output_ready(self)
        if self._gen is not None:
            self._gen.close()
            self._gen = None
        self._read_deadline = None
        self._hb_next = None
        self._tls_deadline = None
        self._node.connection_closed(self, self._now)

    def abort(self, reason: str) -> None:
        """Close the connection when the process dies: pending output is lost."""
        self._ready_out.clear()
        self._held.clear()
        self.shutdown(reason)
        self._ready_out.clear()

    # -- output -----------------------------------------------------------------------------

    def _sink(self, data: bytes) -> None:
        codec = self._codec
        if codec is None:
            self._wire += data
        elif self.deflate:
            self._deflate_pending += data
        else:
            self._wire += codec.compress(data)

    def flush(self: Self) -> None:
        """Flush the writer (and the deflate stream): the bytes become sendable, or held."""
        self._writer.flush()
        if self._deflate_pending:
            self._wire += self._codec.compress(bytes(self._deflate_pending))
            self._deflate_pending.clear()
        self._node.output_flushed(self)
        if self._wire:
            data = bytes(self._wire)
            self._wire.clear()
            if self._stalled or self._output_delay > 0 or self._held:
                self._held.append((self._now + self._output_delay, data))
            else:
                self._ready_out += data
                self._node.output_ready(self)

    def _release(self: Self, now: float) -> None:
        held = self._held
        while held and not self._stalled and held[0][0] <= now:
            self._ready_out += held.popleft()[1]
            self._node.output_ready(self)

    def _send_frame(self: Self, frame_type: int, data: bytes) -> None:
        w = self._writer
        w.write(pack_frame_header(len(data) + 4))
        w.write(pack_frame_header(frame_type))
        w.write(data)
        if frame_type != FrameType.MESSAGE:
            self.flush()
        else:
            self._node.output_buffered(self)

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
            self.shutdown(self.close_reason or "closed by server")

    def _advance(self) -> None:
        while self._gen is not None and not self._closed:
            req = self._pending
            if not isinstance(req, Read):
                return
            buf = self._rbuf
            if req.n == LINE:
                idx = buf.find(b"\n", 0, MAX_LINE)
                if idx < 0:
                    if len(buf) >= MAX_LINE:
                        self.shutdown("command line too long")
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
        if isinstance(req, Read) and req.error is not None and self._started:
            self._send_error(req.error)
        self.shutdown(reason)

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
        magic = yield Read(4, None)
        if magic != MAGIC_V2:
            self._send_frame(FrameType.ERROR, b"E_BAD_PROTOCOL")
            self.close_reason = "bad protocol magic"
            return
        if not (yield from self._accept_client()):
            return
        self._started = True
        self._pump_heartbeat = self.heartbeat_interval
        self._hb_next = self._now + self.heartbeat_interval
        node = self._node
        while True:
            hb = self.heartbeat_interval
            self._read_deadline = self._now + hb * self._read_timeout_intervals if hb > 0 else None
            line = yield Read(LINE, None)
            params = yield from self._read_params(line)
            try:
                injected = node.take_injected(params[0])
                if injected is not None:
                    yield from self._skip_body(params)
                    raise injected
                response = yield from self._exec(params)
            except ClientError as err:
                self._send_error(err)
                if err.fatal:
                    self.close_reason = err.data.decode("utf-8", "replace")
                    return
                node.pump(self._now)
                continue
            if response is not None:
                self._send_frame(FrameType.RESPONSE, response)
            node.pump(self._now)

    def _accept_client(self) -> Generator[Step, Any, bool]:
        """Hook run after the magic (the partitioned server may refuse the client here)."""
        return True
        yield  # pragma: no cover

    def _read_params(self, line: bytes) -> Generator[Step, Any, list[bytes]]:
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
                yield Read(size, None)

    _BODY_COMMANDS: ClassVar[frozenset[bytes]] = frozenset(
        {b"IDENTIFY", b"AUTH", b"PUB", b"MPUB", b"DPUB"}
    )

    #: commands allowed before TLS when the server requires it
    _TLS_EXEMPT: ClassVar[frozenset[bytes]] = frozenset({b"IDENTIFY"})

    def _read_len(self, error: ClientError | None) -> Generator[Step, Any, int]:
        data = yield Read(4, error)
        value: int = unpack_i32(data)[0]
        return value

    def _exec(self, params: list[bytes]) -> Proto:
        cmd = params[0]
        if cmd not in self._TLS_EXEMPT:
            self._enforce_tls_policy(cmd)
        handler = self._handlers.get(cmd)
        if handler is None:
            raise self._invalid_command(params)
        return (yield from handler(params))

    def _invalid_command(self, params: list[bytes]) -> ClientError:
        return fatal("E_INVALID", b"invalid command " + params[0])

    def _enforce_tls_policy(self, cmd: bytes) -> None:
        if self._node.options.tls_required and not self.tls:
            raise fatal("E_INVALID", b"cannot " + cmd + b" in current state (TLS required)")

    # -- authorization ------------------------------------------------------------------------

    def has_authorizations(self) -> bool:
        """AUTH succeeded and granted at least one authorization."""
        return self.auth_state is not None and len(self.auth_state.authorizations) != 0

    def _query_auth(self) -> bool:
        authorizer = self._node.options.auth
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

    def _auth_text(self, text: str) -> str:
        return text

    def _check_auth(self, cmd: str, topic: bytes, channel: bytes) -> None:
        if not self._node.options.auth_enabled:
            return
        if not self.has_authorizations():
            raise fatal("E_AUTH_FIRST", f"AUTH required before {cmd}")
        if self._now >= self._auth_expires and not self._query_auth():
            raise fatal("E_AUTH_FAILED", "AUTH failed")
        state = self.auth_state
        assert state is not None
        t = topic.decode("utf-8", "surrogateescape")
        c = channel.decode("utf-8", "surrogateescape")
        if not any(a.allows(t, c) for a in state.authorizations):
            raise fatal(
                "E_UNAUTHORIZED",
                b"AUTH failed for "
                + cmd.encode()
                + b" on "
                + go_quote(topic)
                + b" "
                + go_quote(channel),
            )
