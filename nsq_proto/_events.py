"""Events: what the core tells the application happened."""

from __future__ import annotations

from dataclasses import dataclass

from ._errors import NSQError
from ._features import AuthResult, NegotiatedFeatures, TraceReceipt
from ._message import Message

__all__ = [
    "Event",
    "ConnId",
    "Ready",
    "Subscribed",
    "MessageReceived",
    "HeartbeatReceived",
    "PublishSucceeded",
    "PublishesSucceeded",
    "PublishFailed",
    "ErrorReceived",
    "CloseWaitReceived",
    "ConnectionClosed",
    "MessageGivenUp",
    "LookupFailed",
    "LookupSucceeded",
    "StartFromApplied",
    "StartFromFailed",
    "BackoffChanged",
    "Stopped",
]

ConnId = int


class Event:
    """Base class of every event.  Events are dataclasses with slots, frozen except
    :class:`MessageReceived` (on the hot path; treat it as read-only too)."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Ready(Event):
    """The handshake (IDENTIFY, TLS, compression, AUTH) is complete: commands may flow."""

    conn_id: ConnId
    features: NegotiatedFeatures
    auth: AuthResult | None = None


@dataclass(frozen=True, slots=True)
class Subscribed(Event):
    """nsqd answered ``OK`` to the SUB (or SUB_ORDERED) of this connection."""

    conn_id: ConnId


# hot path: not frozen (see Message), treat as read-only; its __init__ written out for mypyc
@dataclass(slots=True, init=False)
class MessageReceived(Event):
    """nsqd delivered ``message`` on this connection.

    It stays in flight until the application answers it (the consumer core's ``finish`` or
    ``requeue``; ``touch`` resets its timeout); nsqd delivers it again once its msg_timeout
    passes unanswered, or once the connection is lost.  The consumer core reports a message
    with more attempts than ``max_attempts`` as :class:`MessageGivenUp` instead.
    """

    conn_id: ConnId
    message: Message

    def __init__(self, conn_id: ConnId, message: Message) -> None:
        self.conn_id = conn_id
        self.message = message


# hot path: not frozen, treat as read-only
@dataclass(slots=True, init=False)
class MessagesReceived(Event):
    """nsqd delivered ``messages`` on this connection, in this order, in one read."""

    conn_id: ConnId
    messages: list[Message]

    def __init__(self, conn_id: ConnId, messages: list[Message]) -> None:
        self.conn_id = conn_id
        self.messages = messages


@dataclass(frozen=True, slots=True)
class HeartbeatReceived(Event):
    """nsqd sent ``_heartbeat_``; the core has already queued the ``NOP`` reply."""

    conn_id: ConnId


@dataclass(frozen=True, slots=True)
class PublishSucceeded(Event):
    """nsqd acknowledged the publish ``request_id``: the id ``publish*`` returned.

    From a :class:`~nsq_proto.Connection`, that is the connection's own publish id (each
    connection numbers its publishes from 1); the producer core re-emits the event with its
    own request id, the one :meth:`Producer.publish <nsq_proto.Producer.publish>` returned.
    ``conn_id`` is the connection that carried it (the last one, after retries).
    """

    conn_id: ConnId
    request_id: int
    #: the traced-publish receipt for PUB_TRACE/MPUB_TRACE (and PUB_EXT with a
    #: ``##trace_id``), else None
    receipt: TraceReceipt | None = None


# hot path (one per coalesced MPUB answered): not frozen, treat as read-only
@dataclass(slots=True, init=False)
class PublishesSucceeded(Event):
    """nsqd acknowledged one command that carried the publishes ``request_ids`` (the producer
    core's coalesced MPUB, with ``answer_batches``), in the order they were made: each
    succeeded, as a :class:`PublishSucceeded` of each would say (no receipt: a coalesced
    MPUB is never traced).  ``conn_id`` is the connection that carried it."""

    conn_id: ConnId
    request_ids: list[int]

    def __init__(self, conn_id: ConnId, request_ids: list[int]) -> None:
        self.conn_id = conn_id
        self.request_ids = request_ids


@dataclass(frozen=True, slots=True)
class PublishFailed(Event):
    """The publish ``request_id`` failed: ``error`` tells why (a ``ServerError`` nsqd
    answered, a ``ConnectionClosedError``, the producer core's ``PublishTimeout``, ...).
    ``request_id`` is the id ``publish*`` returned: a :class:`~nsq_proto.Connection`'s own
    publish id, or the producer core's request id (see :class:`PublishSucceeded`).

    A :class:`~nsq_proto.Connection` reports each failed request at once; the producer core
    reports it once: after its retries (``max_publish_attempts``, within ``publish_timeout``) are
    spent, at once for an error that retrying cannot heal, or when it is closed.  ``conn_id``
    is the connection it was last sent on (0 if it never was).
    """

    conn_id: ConnId
    request_id: int
    error: NSQError


@dataclass(frozen=True, slots=True)
class ErrorReceived(Event):
    """nsqd sent an error frame.  When ``fatal`` the connection is closed after it."""

    conn_id: ConnId
    code: str
    text: str
    fatal: bool


@dataclass(frozen=True, slots=True)
class CloseWaitReceived(Event):
    """nsqd acknowledged CLS: it sends no new messages; in-flight ones may still be answered."""

    conn_id: ConnId


@dataclass(frozen=True, slots=True)
class ConnectionClosed(Event):
    """The connection is finished.  ``error`` is None for an orderly close.

    ``after_close_wait``: nsqd had answered CLS with CLOSE_WAIT, so it processed every
    command sent before it (a FIN it refused was answered with an error frame first); an
    application that needs to know its answers reached nsqd reads it here.

    ``connected``: False when the transport never came up (connecting failed, or the
    connection was closed first); ``reason`` and ``error`` then say why it could not
    connect."""

    conn_id: ConnId
    reason: str
    error: NSQError | None = None
    after_close_wait: bool = False
    connected: bool = True


@dataclass(frozen=True, slots=True)
class MessageGivenUp(Event):
    """A message arrived with more attempts than ``max_attempts``.  It is not handed to the
    application; unless configured otherwise the core has already FINished it."""

    conn_id: ConnId
    message: Message
    finished: bool


@dataclass(frozen=True, slots=True)
class LookupFailed(Event):
    """One lookupd poll failed (unreachable, bad status, malformed JSON)."""

    address: tuple[str, int]
    error: NSQError


@dataclass(frozen=True, slots=True)
class StartFromApplied(Event):
    """``start_from``: the channel of ``partition`` was moved on its leader ``address``."""

    address: tuple[str, int]
    partition: int


@dataclass(frozen=True, slots=True)
class StartFromFailed(Event):
    """``start_from``: the leader of ``partition`` did not take the position; that partition
    is not consumed from until a later lookup sets it."""

    address: tuple[str, int]
    partition: int
    error: NSQError


@dataclass(frozen=True, slots=True)
class LookupSucceeded(Event):
    """One lookupd poll answered; ``producers`` are the ``host:port`` keys it listed.

    ``topic_found`` is False when lookupd does not know the topic yet (``TOPIC_NOT_FOUND``:
    no nsqd has had it); while no lookupd lists an nsqd for the topic, the consumer asks
    again soon (from ``lookupd_recheck_delay``, doubling up to ``lookupd_poll_interval``)."""

    address: tuple[str, int]
    producers: tuple[str, ...]
    topic_found: bool = True


@dataclass(frozen=True, slots=True)
class BackoffChanged(Event):
    """The consumer entered, continued or left backoff (``level`` 0: normal flow)."""

    level: int
    duration: float


@dataclass(frozen=True, slots=True)
class Stopped(Event):
    """A graceful stop finished: every connection is closed."""
