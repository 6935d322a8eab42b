"""Outputs: actions the adapter must carry out, in queue order."""

from __future__ import annotations

from dataclasses import dataclass

from ._events import ConnId, Event

__all__ = ["Action", "Send", "StartTLS", "Close", "Connect", "HttpRequest", "Output"]


class Action:
    """Base class of the I/O actions an adapter performs."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Send(Action):
    """Write ``data`` to the connection's transport."""

    conn_id: ConnId
    data: bytes


@dataclass(frozen=True, slots=True)
class StartTLS(Action):
    """Start the TLS handshake on this connection now, then call ``tls_established``.

    ``buffered`` holds bytes already received after the IDENTIFY response; they belong to the
    TLS layer and must be fed to it before anything read later.
    """

    conn_id: ConnId
    buffered: bytes = b""


@dataclass(frozen=True, slots=True)
class Close(Action):
    """Close the transport of this connection.

    ``abort`` is True when the peer is judged dead (nothing received within the read
    timeout, the handshake not done in time): close at once, dropping what was not sent
    (``SO_LINGER`` 0: a reset), without waiting for a write under way or for the peer."""

    conn_id: ConnId
    reason: str
    abort: bool = False


@dataclass(frozen=True, slots=True)
class Connect(Action):
    """Open a TCP connection (then call ``connection_made``, or ``connection_lost`` on failure).

    ``timeout`` is the dial timeout in seconds (the configuration's ``dial_timeout``).  The
    connection starts in plain TCP; when TLS was asked for and nsqd agrees, a
    :class:`StartTLS` output for the same ``conn_id`` follows, after IDENTIFY.
    """

    conn_id: ConnId
    host: str
    port: int
    timeout: float


@dataclass(frozen=True, slots=True)
class HttpRequest(Action):
    """Send ``data`` (a whole HTTP/1.1 request) to ``host:port`` and feed every byte read back
    to ``http_data(request_id, ...)`` (``b""`` at EOF), or call ``http_failed``.

    The request closes the connection after the response (``Connection: close``).
    """

    request_id: int
    host: str
    port: int
    data: bytes
    timeout: float


Output = Action | Event
