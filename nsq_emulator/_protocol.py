"""The server side of one TCP connection to the emulated nsqd (protocol V2).

:class:`NsqdConnection` is the API an adapter drives (bytes and time in, bytes out, faults),
assembled from its parts: the output, input driver, timers and IO loop of
:class:`~._conn_core.ConnectionCore`, and three groups of commands, each in its own module:
negotiation (IDENTIFY, AUTH), consumer commands and producer commands.  Its handler table
maps each command name to the method that runs it.
"""

from __future__ import annotations

import zlib

from nsq_proto import NSQError

from ._conn_core import Handler
from ._consumer_commands import ConsumerCommands
from ._identify import NegotiationCommands
from ._identify import decode_identify as decode_identify
from ._producer_commands import ProducerCommands
from ._wire import AWAIT_TLS
from ._wire import ClientError as ClientError
from ._wire import ClientState as ClientState

__all__ = ["NsqdConnection", "ClientState", "ClientError", "decode_identify"]


class NsqdConnection(NegotiationCommands, ConsumerCommands, ProducerCommands):
    """One client connection, in the server role.  Create with :meth:`Nsqd.accept`.

    Drive it with :meth:`receive_data` (``b""`` is EOF), read what to send with
    :meth:`data_to_send`, and close the socket once :attr:`closed` is true and everything
    has been sent.  When :attr:`tls_requested` becomes true, run the server side of a TLS
    handshake on the socket (first feeding it :meth:`take_trailing_data`), then call
    :meth:`tls_established`; from then on pass decrypted bytes in and encrypt what comes out.
    """

    # -- public: transport ------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """The server is done: close the socket once :meth:`data_to_send` is drained."""
        return self._closed and not self._held

    @property
    def tls_requested(self) -> bool:
        """True between the plain IDENTIFY response that negotiated TLS and
        :meth:`tls_established`: the adapter must run the server-side handshake now."""
        return self._pending is AWAIT_TLS and not self._closed

    def receive_data(self, data: bytes, now: float) -> None:
        """Bytes read from the socket (plaintext below TLS, still compressed if the client
        compresses); ``b""`` means the peer closed its side."""
        node = self._node
        node.begin_call(now)
        self._now = now
        try:
            if self._closed:
                return
            if not data:
                self._eof("EOF")
                return
            if self._pending is AWAIT_TLS:
                self._trailing += data
                return
            if self._in_codec is not None:
                try:
                    data = self._in_codec.decompress(data)
                except (NSQError, zlib.error):
                    self.shutdown("corrupt compressed stream")
                    return
            self._rbuf += data
            self._advance()
        finally:
            node.end_call(now)

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
        if self._pending is not AWAIT_TLS:
            raise RuntimeError("no TLS upgrade is pending on this connection")
        node = self._node
        node.begin_call(now)
        self._now = now
        try:
            self.tls = True
            self._tls_common_name = common_name
            self._tls_deadline = None
            self._send(None)
            self._advance()
        finally:
            node.end_call(now)

    def connection_lost(self, now: float) -> None:
        """The socket failed or was closed under us: same as EOF, without output."""
        node = self._node
        node.begin_call(now)
        self._now = now
        try:
            if not self._closed:
                self.shutdown("connection lost")
            self._ready_out.clear()
            self._held.clear()
        finally:
            node.end_call(now)

    # -- public: inspection -----------------------------------------------------------------

    @property
    def subscription(self) -> tuple[str, str] | None:
        """``(topic, channel)`` after SUB, else ``None``."""
        ch = self.channel
        return None if ch is None else (ch.topic.name, ch.name)

    @property
    def is_ready(self) -> bool:
        """nsqd's ``IsReadyForMessages``: subscribed, channel not paused, in flight < RDY."""
        return self._ready_for_messages()

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
        node = self._node
        node.begin_call(now)
        self._now = now
        try:
            self._stalled = False
            self._release(now)
        finally:
            node.end_call(now)

    def delay_output(self, seconds: float) -> None:
        """From now on, hold each write for ``seconds`` before it becomes sendable."""
        self._output_delay = max(0.0, seconds)

    # -- commands ---------------------------------------------------------------------------

    def _command_table(self) -> dict[bytes, Handler]:
        return {
            **self._negotiation_commands(),
            **self._consumer_commands(),
            **self._producer_commands(),
        }
