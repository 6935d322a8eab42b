"""The consumer's intake: what the application gets of each read of a connection.

The connection tells a run of messages of a read as one :class:`MessagesReceived`.  They go
into its in-flight book and out as events, one :class:`MessageReceived` each, or
(``message_batches``) one :class:`MessagesReceived`, in the order nsqd sent them; the RDY
planner is told once per run.  Some deliveries are set aside instead: requeued at once while
the consumer requeues (nsqd sent them before it read our CLS), given up past
``max_attempts`` (a :class:`MessageGivenUp`, in its place among the others), or dropped as
an ordered connection's repeats.  The intake keeps the counts of what came in and what was
set aside.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from ._config import ConsumerConfig
from ._connection import Connection
from ._events import ConnId, MessageGivenUp, MessageReceived, MessagesReceived
from ._in_flight import InFlight
from ._message import Message
from ._outputs import Output
from ._rdy import ConnRdy, RdyPlanner
from ._state import CAN_ANSWER

__all__ = ["Intake"]

#: max_attempts 0 (no limit) as a bound
_NO_LIMIT = 1 << 62

#: an ordered connection's judgement of a delivery (held copy, delivery): a repeat or not
RepeatCheck = Callable[[Message | None, Message], bool]


class Intake:
    """Takes in the runs of messages of each read (see the module), for one consumer."""

    __slots__ = (
        "_batches",
        "_finish_given_up",
        "_max_attempts",
        "_outputs",
        "_rdy",
        "given_up",
        "received",
        "repeats_dropped",
        "requeued",
    )

    def __init__(
        self, config: ConsumerConfig, rdy: RdyPlanner, outputs: deque[Output], batches: bool
    ) -> None:
        self._max_attempts = config.max_attempts
        self._finish_given_up = config.finish_given_up
        self._rdy = rdy
        self._outputs = outputs
        self._batches = batches
        #: messages nsqd delivered (set aside or not)
        self.received = 0
        #: requeued at once, having come after our CLS
        self.requeued = 0
        #: given up past max_attempts
        self.given_up = 0
        #: an ordered connection's repeats of a held message, not passed on
        self.repeats_dropped = 0

    def take(
        self,
        event: MessagesReceived,
        conn: Connection,
        book: InFlight,
        planned: ConnRdy | None,
        repeat: RepeatCheck | None,
        requeueing: bool,
        now: float,
    ) -> None:
        """Take in the messages of ``event`` (a run of a read of ``conn``, whose book is
        ``book``, RDY record ``planned`` and repeat check, on an ordered connection,
        ``repeat``)."""
        conn_id = event.conn_id
        messages = event.messages
        out = self._outputs
        rdy = self._rdy
        max_attempts = self._max_attempts
        batches = self._batches
        held = book.held
        self.received += len(messages)
        # (batches) None while every message went to the application: the event goes on
        # as it is; once one is set aside, those the application gets are gathered here
        kept: list[Message] | None = None
        passed = 0  # what the application gets, not yet told to the RDY planner
        rest = messages
        if batches and repeat is None and not requeueing:
            # the common case first: a new delivery under max_attempts goes into the book
            # and on to the application; the first other one ends it, and the loop below
            # goes on from there
            limit = max_attempts or _NO_LIMIT
            for message in messages:
                msg_id = message.id
                if message.attempts > limit or msg_id in held:
                    break
                held[msg_id] = message  # the book's deliver, inline (per message)
            else:
                if messages:
                    self._pass_on(conn_id, messages, len(messages), planned, now)
                return
            passed = next(i for i, m in enumerate(messages) if m is message)
            rest = messages[passed:]
        for message in rest:
            if requeueing:
                # sent by nsqd before it read our CLS: back at once, or nsqd would hold it
                # for this connection until msg_timeout
                if conn.state in CAN_ANSWER:
                    conn.requeue(message.id, 0.0)
                    self.requeued += 1
            elif max_attempts and message.attempts > max_attempts:
                if planned is not None:
                    rdy.message_received(planned, now, False)
                self.given_up += 1
                finish = self._finish_given_up
                if finish:
                    conn.finish(message.id)
                else:
                    book.hold(message)
                if passed:  # the messages before it come first
                    self._pass_on(
                        conn_id, messages[:passed] if kept is None else kept, passed, planned, now
                    )
                    passed = 0
                kept = []
                out.append(MessageGivenUp(conn_id, message, finish))
                continue
            else:
                copy = held.get(message.id)
                if repeat is None or not repeat(copy, message):
                    if copy is None:
                        held[message.id] = message  # the book's deliver, inline (per message)
                    else:
                        # delivered again while a copy is held (msg_timeout passed, or the
                        # partitioned server repeated an ordered message): the newest counts
                        book.deliver(message)
                    if not batches:
                        out.append(MessageReceived(conn_id, message))
                    elif kept is not None:
                        kept.append(message)
                    passed += 1
                    continue
                self.repeats_dropped += 1
            # set aside (requeued, or an ordered connection's repeat): no event
            if planned is not None:
                rdy.message_received(planned, now, False)
            if kept is None:
                kept = messages[:passed]
        if passed:
            self._pass_on(conn_id, messages if kept is None else kept, passed, planned, now)

    def _pass_on(
        self,
        conn_id: ConnId,
        batch: list[Message],
        passed: int,
        planned: ConnRdy | None,
        now: float,
    ) -> None:
        """``passed`` messages went to the application (with batches: ``batch``, as one
        event): the RDY planner is told once."""
        if self._batches:
            self._outputs.append(MessagesReceived(conn_id, batch))
        if planned is not None:
            self._rdy.message_received(planned, now, True, passed)
