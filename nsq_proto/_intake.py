"""The consumer's intake: what the application gets of each read of a connection.

A read's messages go into the connection's in-flight book and out as events, one
:class:`MessageReceived` each, or (``message_batches``) one :class:`MessagesReceived` per run
of messages, in the order nsqd sent them; the RDY planner is told once per run.  Some
deliveries are set aside instead: requeued at once while the consumer requeues (nsqd sent
them before it read our CLS), given up past ``max_attempts`` (a :class:`MessageGivenUp`, in
its place among the others), or dropped as an ordered connection's repeats.  The intake keeps
the counts of what came in and what was set aside.
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

#: an ordered connection's judgement of a delivery (held copy, delivery): a repeat or not
RepeatCheck = Callable[[Message | None, Message], bool]


class Intake:
    """Takes in the runs of messages of each read (see the module), for one consumer."""

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
        items: list[Output],
        start: int,
        conn_id: ConnId,
        conn: Connection,
        book: InFlight,
        planned: ConnRdy | None,
        repeat: RepeatCheck | None,
        requeueing: bool,
        now: float,
    ) -> int:
        """Take in the run of :class:`MessageReceived` of ``items`` from ``start`` on (the
        read of ``conn``, whose book is ``book``, RDY record ``planned`` and repeat check, on
        an ordered connection, ``repeat``); where the run ends."""
        out = self._outputs
        rdy = self._rdy
        max_attempts = self._max_attempts
        batches = self._batches
        held = book.held
        batch: list[Message] = []  # (batches) what the application gets
        passed = 0  # what the application gets, not yet told to the RDY planner
        i = start
        n = len(items)
        while i < n:
            item = items[i]
            if type(item) is not MessageReceived:
                break
            i += 1
            message = item.message
            self.received += 1
            if requeueing:
                # sent by nsqd before it read our CLS: back at once, or nsqd would hold it
                # for this connection until msg_timeout
                if conn.state in CAN_ANSWER:
                    conn.requeue(message.id, 0.0)
                    self.requeued += 1
                if planned is not None:
                    rdy.message_received(planned, now, False)
                continue
            if max_attempts and message.attempts > max_attempts:
                if planned is not None:
                    rdy.message_received(planned, now, False)
                self.given_up += 1
                finish = self._finish_given_up
                if finish:
                    conn.finish(message.id)
                else:
                    book.hold(message)
                if passed:  # the messages before it come first
                    self._pass_on(conn_id, batch, passed, planned, now)
                    batch, passed = [], 0
                out.append(MessageGivenUp(conn_id, message, finish))
                continue
            copy = held.get(message.id)
            if repeat is not None and repeat(copy, message):
                self.repeats_dropped += 1
                if planned is not None:
                    rdy.message_received(planned, now, False)
                continue
            if copy is None:
                held[message.id] = message  # the book's deliver, inline (per message)
            else:
                # delivered again while a copy is held (msg_timeout passed, or the
                # partitioned server repeated an ordered message): the newest counts
                book.deliver(message)
            if batches:
                batch.append(message)
            else:
                out.append(item)
            passed += 1
        if passed:
            self._pass_on(conn_id, batch, passed, planned, now)
        return i

    def _pass_on(
        self,
        conn_id: ConnId,
        batch: list[Message],
        passed: int,
        planned: ConnRdy | None,
        now: float,
    ) -> None:
        """``passed`` messages went to the application (``batch``: as one event, with
        batches): the RDY planner is told once."""
        if batch:
            self._outputs.append(MessagesReceived(conn_id, batch))
        if planned is not None:
            self._rdy.messages_received(planned, now, passed)
