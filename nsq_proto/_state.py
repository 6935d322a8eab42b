"""The states of one nsqd connection, every move between them, and which commands each allows.

All of the connection's state logic is in this file, as in h11's ``_state.py``; it does not
know about bytes.  It holds:

* the states (:class:`ConnectionState`) and what moves a connection (:class:`Trigger`);
* one table of transitions, :data:`TRANSITIONS` (``(state, trigger) -> new state``), and the
  one function that applies it, :func:`next_state`, which raises
  :class:`~nsq_proto.LocalProtocolError` naming the state and the trigger for a move the table
  does not have;
* the named sets of states the rest of the core tests against (:data:`HANDSHAKE_STATES`,
  :data:`OPEN`, :data:`CAN_RDY`, :data:`ACTIVE`, :data:`CAN_RECEIVE_MESSAGES`,
  :data:`CAN_ANSWER`, :data:`CLOSING_STATES`), each defined here only;
* the commands allowed in each state (:data:`ALLOWED`, checked by :func:`check_command`).

:class:`~nsq_proto.Connection` (``_connection.py``) decides *when* a trigger happens (a frame
arrives, a command is sent, the transport changes) and changes its state only through
:func:`next_state`; where a trigger leads is decided here.
"""

from __future__ import annotations

from enum import Enum
from typing import Final

from ._errors import LocalProtocolError

__all__ = [
    "ACTIVE",
    "ALLOWED",
    "CAN_ANSWER",
    "CAN_RDY",
    "CAN_RECEIVE_MESSAGES",
    "CLOSING_STATES",
    "Command",
    "ConnectionState",
    "HANDSHAKE_STATES",
    "OPEN",
    "TRANSITIONS",
    "Trigger",
    "check_command",
    "next_state",
]


class ConnectionState(Enum):
    """Where one nsqd connection stands: the handshake's steps (IDENTIFY, TLS, compression,
    AUTH), ready, subscribed, closing, closed.  Its moves are :data:`TRANSITIONS`; the value
    is the name (``ConnectionStats.state`` and ``ProducerConnectionInfo.state`` hold it)."""

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


class Trigger(Enum):
    """What moves a connection from one state to the next."""

    # members are singletons: identity hashing is exact and much cheaper than Enum's
    __hash__ = object.__hash__

    #: the transport is up; magic and IDENTIFY are sent (``connection_made``)
    CONNECTED = "connected"
    #: the IDENTIFY response switched TLS on: StartTLS is emitted
    TLS_ASKED = "TLS asked"
    #: the adapter finished the TLS handshake (``tls_established``)
    TLS_ESTABLISHED = "TLS established"
    #: the negotiated compression is switched on; its ``OK`` comes compressed
    COMPRESSION_ON = "compression switched on"
    #: nsqd requires AUTH: AUTH is sent
    AUTH_SENT = "AUTH sent"
    #: the last handshake answer arrived: SUB and publishing may start
    HANDSHAKE_DONE = "handshake done"
    #: SUB (or SUB_ORDERED) is sent
    SUB_SENT = "SUB sent"
    #: nsqd answered the SUB with ``OK``
    SUB_ANSWERED = "SUB answered"
    #: CLS is sent
    CLS_SENT = "CLS sent"
    #: nsqd answered the CLS with ``CLOSE_WAIT``
    CLOSE_WAIT_RECEIVED = "CLOSE_WAIT received"
    #: the connection is over: closed by either side, lost, failed or timed out
    ENDED = "ended"


_S = ConnectionState
_T = Trigger

#: every move a connection makes: ``(state, trigger) -> new state``; any other pair is a bug
TRANSITIONS: Final[dict[tuple[ConnectionState, Trigger], ConnectionState]] = {
    (_S.INIT, _T.CONNECTED): _S.IDENTIFYING,
    # the IDENTIFY response: TLS first, then compression, then AUTH, each only when negotiated
    (_S.IDENTIFYING, _T.TLS_ASKED): _S.TLS_HANDSHAKE,
    (_S.TLS_HANDSHAKE, _T.TLS_ESTABLISHED): _S.TLS_RESPONSE,
    (_S.IDENTIFYING, _T.COMPRESSION_ON): _S.COMPRESSION_RESPONSE,
    (_S.TLS_RESPONSE, _T.COMPRESSION_ON): _S.COMPRESSION_RESPONSE,
    (_S.IDENTIFYING, _T.AUTH_SENT): _S.AUTHENTICATING,
    (_S.TLS_RESPONSE, _T.AUTH_SENT): _S.AUTHENTICATING,
    (_S.COMPRESSION_RESPONSE, _T.AUTH_SENT): _S.AUTHENTICATING,
    (_S.IDENTIFYING, _T.HANDSHAKE_DONE): _S.READY,
    (_S.TLS_RESPONSE, _T.HANDSHAKE_DONE): _S.READY,
    (_S.COMPRESSION_RESPONSE, _T.HANDSHAKE_DONE): _S.READY,
    (_S.AUTHENTICATING, _T.HANDSHAKE_DONE): _S.READY,
    (_S.READY, _T.SUB_SENT): _S.SUBSCRIBING,
    (_S.SUBSCRIBING, _T.SUB_ANSWERED): _S.SUBSCRIBED,
    # CLS sent before the SUB's OK arrived: the connection stays closing
    (_S.CLOSING, _T.SUB_ANSWERED): _S.CLOSING,
    (_S.SUBSCRIBING, _T.CLS_SENT): _S.CLOSING,
    (_S.SUBSCRIBED, _T.CLS_SENT): _S.CLOSING,
    (_S.CLOSING, _T.CLOSE_WAIT_RECEIVED): _S.CLOSE_WAIT,
    # any state but CLOSED can end; CLOSED is terminal
    **{(state, _T.ENDED): _S.CLOSED for state in ConnectionState if state is not _S.CLOSED},
}


def next_state(state: ConnectionState, trigger: Trigger) -> ConnectionState:
    """Where ``trigger`` moves a connection in ``state``, by :data:`TRANSITIONS`."""
    new = TRANSITIONS.get((state, trigger))
    if new is None:
        raise LocalProtocolError(f"no transition from state {state.value} on {trigger.value!r}")
    return new


# the named sets of states: the rest of the core tests a state against these, never its own

#: IDENTIFY sent, the handshake not over: frames are read one at a time (TLS or compression
#: may change the meaning of the bytes after one)
HANDSHAKE_STATES: Final = frozenset(
    {_S.IDENTIFYING, _S.TLS_HANDSHAKE, _S.TLS_RESPONSE, _S.COMPRESSION_RESPONSE, _S.AUTHENTICATING}
)
#: handshake done and not closed: publishing commands and NOP may be sent
OPEN: Final = frozenset({_S.READY, _S.SUBSCRIBING, _S.SUBSCRIBED, _S.CLOSING, _S.CLOSE_WAIT})
#: SUB sent, CLS not yet: RDY may be sent (and CLS)
CAN_RDY: Final = frozenset({_S.SUBSCRIBING, _S.SUBSCRIBED})
#: handshake done, CLS not sent: the connections that count for the RDY share when the
#: consumer plans RDY (go-nsq: every connected, non-closing connection)
ACTIVE: Final = frozenset({_S.READY, _S.SUBSCRIBING, _S.SUBSCRIBED})
#: CLS sent: waiting for ``CLOSE_WAIT``, or got it
CLOSING_STATES: Final = frozenset({_S.CLOSING, _S.CLOSE_WAIT})
#: SUB sent and not closed: nsqd may deliver messages (after CLS too, those it took before)
CAN_RECEIVE_MESSAGES: Final = frozenset({_S.SUBSCRIBING, _S.SUBSCRIBED, _S.CLOSING, _S.CLOSE_WAIT})
#: nsqd takes FIN/REQ/TOUCH for the messages it delivered: for as long as it may deliver them
CAN_ANSWER: Final = CAN_RECEIVE_MESSAGES


class Command(Enum):
    # members are singletons: identity hashing is exact and much cheaper than Enum's
    __hash__ = object.__hash__

    SUB = "SUB"
    PUB = "PUB"
    RDY = "RDY"
    ANSWER = "FIN/REQ/TOUCH"
    CLS = "CLS"
    NOP = "NOP"


#: which states accept which command (the server's own rules, plus "wait for the handshake")
ALLOWED: Final[dict[Command, frozenset[ConnectionState]]] = {
    Command.SUB: frozenset({_S.READY}),
    Command.PUB: OPEN,
    Command.RDY: CAN_RDY,
    Command.ANSWER: CAN_ANSWER,
    Command.CLS: CAN_RDY,
    Command.NOP: OPEN,
}


def check_command(state: ConnectionState, command: Command) -> None:
    if state not in ALLOWED[command]:
        raise LocalProtocolError(f"cannot send {command.value} in state {state.value}")
