"""The states of one nsqd connection and which commands each allows.

This file holds the states (:class:`ConnectionState`) and the table of the commands allowed
in each (:data:`ALLOWED`, checked by :func:`check_command`); it does not know about bytes.
The transitions themselves are made by :class:`~nsq_proto.Connection` (``_connection.py``),
as frames arrive and commands are sent.
"""

from __future__ import annotations

from enum import Enum
from typing import Final

from ._errors import LocalProtocolError

__all__ = ["ConnectionState", "Command", "check_command", "HANDSHAKE_STATES"]


class ConnectionState(Enum):
    # members are singletons: identity hashing is exact and much cheaper than Enum's
    __hash__ = object.__hash__

    #: created; the transport is not connected yet
    INIT = "INIT"
    #: magic and IDENTIFY sent, waiting for the IDENTIFY response
    IDENTIFYING = "IDENTIFYING"
    #: StartTLS emitted, waiting for the adapter's ``tls_established``
    TLS_HANDSHAKE = "TLS_HANDSHAKE"
    #: TLS is up, waiting for the ``OK`` nsqd sends inside it
    TLS_RESPONSE = "TLS_RESPONSE"
    #: compression switched on, waiting for the compressed ``OK``
    COMPRESSION_RESPONSE = "COMPRESSION_RESPONSE"
    #: AUTH sent, waiting for its JSON answer
    AUTHENTICATING = "AUTHENTICATING"
    #: handshake complete: SUB and publishing commands are allowed
    READY = "READY"
    #: SUB sent, waiting for ``OK`` (RDY/FIN/REQ/TOUCH already allowed, as go-nsq does)
    SUBSCRIBING = "SUBSCRIBING"
    #: subscribed: messages flow according to RDY
    SUBSCRIBED = "SUBSCRIBED"
    #: CLS sent, waiting for ``CLOSE_WAIT``
    CLOSING = "CLOSING"
    #: nsqd acknowledged CLS; in-flight messages may still be answered
    CLOSE_WAIT = "CLOSE_WAIT"
    #: finished (orderly or not); every command is refused
    CLOSED = "CLOSED"


HANDSHAKE_STATES: Final = frozenset(
    {
        ConnectionState.IDENTIFYING,
        ConnectionState.TLS_HANDSHAKE,
        ConnectionState.TLS_RESPONSE,
        ConnectionState.COMPRESSION_RESPONSE,
        ConnectionState.AUTHENTICATING,
    }
)


class Command(Enum):
    # members are singletons: identity hashing is exact and much cheaper than Enum's
    __hash__ = object.__hash__

    SUB = "SUB"
    PUB = "PUB"
    RDY = "RDY"
    ANSWER = "FIN/REQ/TOUCH"
    CLS = "CLS"
    NOP = "NOP"


_S = ConnectionState
_SUBSCRIBED_LIKE: Final = frozenset({_S.SUBSCRIBING, _S.SUBSCRIBED})
_OPEN: Final = frozenset({_S.READY, _S.SUBSCRIBING, _S.SUBSCRIBED, _S.CLOSING, _S.CLOSE_WAIT})

#: which states accept which command (the server's own rules, plus "wait for the handshake")
ALLOWED: dict[Command, frozenset[ConnectionState]] = {
    Command.SUB: frozenset({_S.READY}),
    Command.PUB: _OPEN,
    Command.RDY: _SUBSCRIBED_LIKE,
    Command.ANSWER: _SUBSCRIBED_LIKE | {_S.CLOSING, _S.CLOSE_WAIT},
    Command.CLS: _SUBSCRIBED_LIKE,
    Command.NOP: _OPEN,
}


def check_command(state: ConnectionState, command: Command) -> None:
    if state not in ALLOWED[command]:
        raise LocalProtocolError(f"cannot send {command.value} in state {state.value}")
