"""The message an application receives, and the inbox it waits in."""

from __future__ import annotations

import functools
import inspect
import json
from collections import deque
from collections.abc import Awaitable, Callable
from contextlib import suppress
from typing import TYPE_CHECKING, Any, Protocol, Self

from nsq_proto import LocalProtocolError
from nsq_proto import Message as CoreMessage

from ._backend import Backend, EventLike

if TYPE_CHECKING:
    from ._runner import CoreRunner


class _Answers(Protocol):
    """What a message needs of the consumer that delivered it (:class:`Consumer`): its
    answers go to the consumer's core, and out through its runner."""

    _runner: CoreRunner
    _inbox: _Inbox
    #: the origins whose messages were FINished since the runner's last pass (each keeps
    #: them in its ``answers``); the same list all along (emptied, never replaced: each
    #: origin holds it too)
    _answering: list[_Origin]

    def _finish(self, message: Message) -> bool: ...

    def _requeue(self, message: Message, delay: float | None, backoff: bool) -> bool: ...

    def _touch(self, message: Message) -> None: ...


__all__ = ["GiveUpHook", "Handler", "Message"]

#: answers given by an application task without waiting are sent together; every this many
#: messages taken without waiting, the consumer yields to the loop once anyway
CHECKPOINT_EVERY = 1024


class _Origin:
    """Where messages came from: one per connection, shared by its messages."""

    __slots__ = (
        "answering",
        "answers",
        "conn_id",
        "consumer",
        "items",
        "nsqd_address",
        "partition",
        "runner",
    )

    def __init__(
        self, consumer: _Answers, conn_id: int, nsqd_address: str, partition: int | None
    ) -> None:
        self.consumer = consumer
        self.conn_id = conn_id
        self.nsqd_address = nsqd_address
        self.partition = partition
        # what ``finish`` reads of the consumer, one hop nearer (none of them is replaced)
        self.items = consumer._inbox.items
        self.answering = consumer._answering
        #: its messages FINished since the runner's last pass (it is in ``answering`` while
        #: this is not empty)
        self.answers: list[Message] = []
        self.runner = consumer._runner


class Message(CoreMessage):
    """A delivered message with its answers.  Answer each message once: ``finish`` or
    ``requeue`` (``touch`` buys time first).

    It is the core's :class:`nsq_proto.Message` (``id``, ``body``, ``attempts``,
    ``timestamp``, ``trace_id`` and the rest are its fields: treat them as read-only), built
    by the connection that read it, with where it came from and whether it was answered.
    Two messages are equal only if they are the same object (nsqd may deliver the same id
    again)."""

    __slots__ = ("_origin", "_responded")

    _origin: _Origin
    _responded: bool

    @classmethod
    def _of(cls, origin: _Origin, message: CoreMessage) -> Self:
        """A copy of ``message`` (the core's, or another's) delivered through ``origin``."""
        self = cls(
            message.id,
            message.timestamp,
            message.attempts,
            message.body,
            message.trace_id,
            message.internal_id,
            message.ext_version,
            message.ext_data,
            message.queue_offset,
            message.raw_size,
        )
        self._origin = origin
        self._responded = False
        return self

    def __eq__(self, other: object) -> bool:
        return self is other

    __hash__ = object.__hash__

    @property
    def _consumer(self) -> _Answers:
        return self._origin.consumer

    @property
    def conn_id(self) -> int:
        """The consumer's id of the connection that delivered it."""
        return self._origin.conn_id

    @property
    def nsqd_address(self) -> str:
        """``host:port`` of the nsqd that delivered it."""
        return self._origin.nsqd_address

    @property
    def partition(self) -> int | None:
        """The partition it came from (partitioned server), else None."""
        return self._origin.partition

    @property
    def ext(self) -> dict[str, Any] | None:
        """The JSON extension header (partitioned server, extended topics), else None."""
        if self.ext_version != 4 or not self.ext_data:
            return None
        try:
            value = json.loads(self.ext_data)
        except ValueError:
            return None
        return value if isinstance(value, dict) else None

    @property
    def raw(self) -> CoreMessage:
        """The core's decoded message (:class:`nsq_proto.Message`): the message itself, since
        it is one (kept for code written when it was a separate object)."""
        return self

    @property
    def has_responded(self) -> bool:
        """Whether it was answered (FIN or REQ) already: it cannot be answered again."""
        return self._responded

    def _mark(self) -> None:
        if self._responded:
            raise LocalProtocolError("this message has already been answered")
        self._responded = True

    async def finish(self) -> None:
        """FIN: the message is done; nsqd forgets it."""
        if self._responded:  # _mark, inline (once per message; a subclass overrides both)
            raise LocalProtocolError("this message has already been answered")
        self._responded = True
        origin = self._origin
        if origin.items:
            # the consumer's _finish, its first case inline: more messages wait, so another
            # answer will share the write; the runner's next pass hands them over
            answers = origin.answers
            if not answers:
                origin.answering.append(origin)
            answers.append(self)
            runner = origin.runner
            if not runner._woken:
                runner.wake()
        elif origin.consumer._finish(self):
            await origin.runner.drain_here()

    async def requeue(self, delay: float | None = None, backoff: bool = True) -> None:
        """REQ; ``delay`` None grows with attempts; ``backoff`` counts it as a failure."""
        self._mark()
        consumer = self._origin.consumer
        if consumer._requeue(self, delay, backoff):
            await consumer._runner.drain_here()

    async def touch(self) -> None:
        """TOUCH: nsqd's timeout for it (``msg_timeout``) starts again."""
        if self._responded:
            raise LocalProtocolError("this message has already been answered")
        self._origin.consumer._touch(self)

    def __repr__(self) -> str:
        return f"<Message id={self.id!r} attempts={self.attempts} body={self.body[:40]!r}>"


Handler = Callable[[Message], Awaitable[object]]
GiveUpHook = Callable[[Message], object]


def is_async_callable(handler: object) -> bool:
    """An ``async def`` function, an object whose ``__call__`` is one, or a
    ``functools.partial`` of either."""
    target = handler
    while isinstance(target, functools.partial):
        target = target.func
    if inspect.iscoroutinefunction(target):
        return True
    # an object: its class's __call__ (the instance's attribute is a bound method wrapper)
    return inspect.iscoroutinefunction(getattr(type(target), "__call__", None))  # noqa: B004


def check_handler(handler: object) -> None:
    """Raise TypeError unless ``handler`` is an async function (:func:`is_async_callable`): a
    plain function would run its side effects, then fail each message on awaiting its result."""
    if not is_async_callable(handler):
        raise TypeError(
            f"run() takes an async handler (async def), not {handler!r}: call blocking code "
            "from one in a thread (anyio.to_thread.run_sync), or use nsq_anyio.blocking's "
            "Consumer"
        )


class _Inbox:
    """Messages waiting for the application (RDY bounds how many).

    Any number of tasks may wait in :meth:`get` at once (``run(concurrency=N)`` has N
    workers): each waits on its own event, ``put`` and ``put_many`` wake one of them per
    message and ``close`` wakes them all.
    """

    def __init__(self, backend: Backend, runner: CoreRunner | None = None) -> None:
        self._backend = backend
        #: whose ``new_event`` makes the waits' events (else the backend's ``event``)
        self._runner = runner
        self.items: deque[Message] = deque()
        self.waiters: deque[EventLike] = deque()
        self.closed = False
        self._taken = 0

    def put(self, item: Message) -> None:
        self.put_many([item])

    def put_many(self, items: list[Message]) -> None:
        """:meth:`put` each of ``items`` (what one read delivered), in order."""
        self.items.extend(items)
        waiters = self.waiters
        for _ in range(min(len(waiters), len(items))):
            waiters.popleft().set()

    def close(self) -> None:
        self.closed = True
        while self.waiters:
            self.waiters.popleft().set()

    def drain(self) -> list[Message]:
        items = list(self.items)
        self.items.clear()
        return items

    def take(self) -> Message | None:
        """The next message if one waits and no checkpoint is due, else None (then
        :meth:`wait_next`): a worker's way to the next message without a coroutine each."""
        self._taken += 1
        if self.items and self._taken % CHECKPOINT_EVERY:
            # no checkpoint: answers given meanwhile go out together when this task waits
            return self.items.popleft()
        return None

    async def get(self) -> Message | None:
        """The next message, or None once closed and empty."""
        message = self.take()
        return message if message is not None else await self.wait_next()

    async def wait_next(self) -> Message | None:
        """After :meth:`take` gave None: yield to the loop, then the next message (waiting for
        one), or None once closed and empty."""
        await self._backend.checkpoint()
        while not self.items:
            if self.closed:
                return None
            runner = self._runner
            event = runner.new_event() if runner is not None else self._backend.event()
            self.waiters.append(event)
            try:
                await event.wait()
            except BaseException:
                if event.is_set():
                    # woken for a message, then cancelled: hand the wake-up on
                    if self.items and self.waiters:
                        self.waiters.popleft().set()
                else:
                    with suppress(ValueError):
                        self.waiters.remove(event)
                raise
        return self.items.popleft()

    async def get_many(self, limit: int) -> list[Message]:
        """Wait for the next message, then take up to ``limit`` of those waiting (an empty
        list once closed and empty)."""
        first = await self.get()
        if first is None:
            return []
        items = self.items
        if len(items) < limit:
            out = [first, *items]
            items.clear()
            return out
        out = [first]
        popleft = items.popleft
        for _ in range(limit - 1):
            out.append(popleft())
        return out
