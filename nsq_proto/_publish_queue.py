"""The producer's publish queue: the requests, in call order, and the decisions of a dispatch.

:class:`PublishQueue` keeps the requests waiting for a connection, gives each its id and its
deadline, and decides, without doing it, where each goes (:meth:`PublishQueue.assign` returns
the steps; the producer carries them out): a request to write on a connection, single
publishes of one topic and route coalesced into one MPUB, a request to refuse, a pool to open.
It knows no connection: a :class:`Pool` answers which one has room.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections import deque
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Final, Protocol

from ._errors import LocalProtocolError, NSQError, ServerError
from ._events import ConnId
from ._partitioned import TOPOLOGY_CHANGED

if TYPE_CHECKING:
    from ._routes import Routes

__all__ = [
    "NO_DPUB",
    "Coalesced",
    "Kind",
    "OpenPool",
    "Pool",
    "PublishQueue",
    "Refuse",
    "Request",
    "Step",
]

NO_DPUB: Final = "the partitioned server has no DPUB (deferred publish): publish without a delay"
#: nsqd's refusal of a message over its ``--max-msg-size`` names the limit
_TOO_BIG: Final = re.compile(r"message too big \d+ > (\d+)$")
#: and of an MPUB over its ``--max-body-size``
_BODY_TOO_BIG: Final = re.compile(r"body too big \d+ > (\d+)$")
#: nsqd's defaults for the largest message (``--max-msg-size``) and MPUB body
#: (``--max-body-size``) it takes
DEFAULT_MAX_MSG_SIZE: Final = 1024 * 1024
DEFAULT_MAX_BODY_SIZE: Final = 5 * 1024 * 1024
#: go-nsq's pause before the n-th retry of a publish: 8 ms + 10 ms * 2^n
_RETRY_BASE: Final = 0.008
_RETRY_STEP: Final = 0.010


class Kind(Enum):
    """What a publish sends (the form on the wire also depends on its partition, trace ids
    and extension header)."""

    # members are singletons: identity hashing is exact and much cheaper than Enum's
    __hash__ = object.__hash__

    PUB = "PUB"
    MPUB = "MPUB"
    DPUB = "DPUB"


@dataclass(slots=True)
class Request:
    request_id: int
    topic: str
    kind: Kind
    bodies: list[bytes]
    partition: int | None
    sharding_key: bytes | None
    trace_ids: list[int] | None
    delay: float
    deadline: float
    #: the JSON extension header (PUB_EXT/MPUB_EXT), if any
    ext: bytes | None = None
    #: the header has the key ``##trace_id``: the server answers PUB_EXT with a receipt
    ext_traced: bool = False
    attempts: int = 0
    #: the connection it was last assigned to (0: never)
    conn_id: ConnId = 0
    #: the partition it was last assigned to (None: the server's choice)
    sent_partition: int | None = None
    #: not sent again before this time (the retry backoff)
    not_before: float = 0.0
    #: the ordered partition ``(topic, partition)`` it was sent to, while unanswered
    stream: tuple[str, int] | None = None
    #: (partition count, partition) its sharding key was mapped to
    hashed: tuple[int, int] | None = None
    #: never coalesced with others (a coalesced MPUB carrying it was refused for a body)
    alone: bool = False
    #: last sent over what nsqd was known to take, so alone on its connection (see
    #: assign): its acknowledgement says nsqd takes that much
    isolated: bool = False


class Pool(Protocol):
    """The connections a :class:`PublishQueue` assigns requests to, by id."""

    def pick(self, address: tuple[str, int] | None, alone: bool = False) -> ConnId | None:
        """The least loaded ready connection with room (to ``address``; None: any), counting
        what this dispatch assigned already, and none kept for a request alone; with
        ``alone``, an idle one only.  None when there is none."""
        ...

    def take(self, conn_id: ConnId, alone: bool = False) -> None:
        """One more request is assigned to ``conn_id`` in this dispatch; with ``alone``, the
        connection is kept for it (nothing else is assigned to it) until it is answered."""
        ...

    def partitioned(self, conn_id: ConnId) -> bool:
        """The connection is to the partitioned server."""
        ...


@dataclass(frozen=True, slots=True)
class Refuse:
    """Dispatch: fail ``request`` with ``error`` (it can go nowhere)."""

    request: Request
    error: NSQError


@dataclass(frozen=True, slots=True)
class Coalesced:
    """Dispatch: write ``requests`` (single publishes of one topic to one route, in call
    order) as one MPUB on ``requests[0].conn_id``, to ``requests[0].sent_partition``."""

    requests: list[Request]


@dataclass(frozen=True, slots=True)
class OpenPool:
    """Dispatch: open the pool's connections to ``address`` (a partition's leader)."""

    address: tuple[str, int]


#: what one dispatch decided, in order: a request (assigned: write it on ``request.conn_id``,
#: to ``request.sent_partition``), requests coalesced into one MPUB, a request to refuse, or
#: a pool to open
Step = Request | Coalesced | Refuse | OpenPool


def _coalescable(req: Request) -> bool:
    """A single publish that may share an MPUB: PUB or PUB_EXT, with no trace receipt to give
    back (MPUB_TRACE answers with the first message's alone) and not sent alone."""
    return req.kind is Kind.PUB and req.trace_ids is None and not req.ext_traced and not req.alone


def _mpub_size(req: Request) -> int:
    """What a single publish adds to an MPUB's body: its length prefix, its header, its body."""
    ext = req.ext
    return 4 + len(req.bodies[0]) + (0 if ext is None else 2 + len(ext))


def _largest(req: Request) -> int:
    """The size of the largest message of ``req`` as nsqd checks it (with its header)."""
    bodies = req.bodies
    largest = len(bodies[0]) if len(bodies) == 1 else max(len(body) for body in bodies)
    return largest if req.ext is None else largest + 2 + len(req.ext)


def _mpub_body_size(req: Request) -> int:
    """The body of ``req`` sent as an MPUB: the message count and each message."""
    extra = 4 if req.ext is None else 6 + len(req.ext)
    return 4 + sum(len(body) + extra for body in req.bodies)


def _limit_named(error: NSQError, code: str, pattern: re.Pattern[str]) -> int | None:
    """The size limit nsqd named in ``error``, a refusal ``code`` whose text ``pattern``
    reads (``... too big 1048577 > 1048576``); None for any other error."""
    if not isinstance(error, ServerError) or error.code != code:
        return None
    match = pattern.search(error.text)
    return None if match is None else int(match.group(1))


class PublishQueue:
    """The producer's requests, from ``publish`` to their answer: request ids and deadlines,
    the queue in call order, the retries and their backoff, and the ordered partitions with a
    request on the wire.

    :meth:`assign` decides where queued requests go and returns its decisions; the producer
    carries them out (encodes and writes, fails, opens connections), as httpcore's pool
    assigns requests to connections and leaves the I/O to its caller."""

    __slots__ = (
        "_last_deadline",
        "_max_attempts",
        "_max_bytes",
        "_max_messages",
        "_next_id",
        "body_limit",
        "full",
        "msg_limit",
        "requests",
        "streams",
        "waiting",
    )

    def __init__(
        self, *, max_attempts: int, max_messages: int = 1, max_bytes: int = 5 * 1024 * 1024
    ) -> None:
        self._max_attempts = max_attempts
        #: the bounds of a coalesced MPUB (1 message: no coalescing)
        self._max_messages = max_messages
        self._max_bytes = max_bytes
        #: queued requests, in call order (a retry goes back to its place)
        self.waiting: deque[Request] = deque()
        #: requests not yet answered, oldest first (so by deadline: see add)
        self.requests: dict[int, Request] = {}
        #: ordered partitions with a request on the wire: (topic, partition) -> request id
        self.streams: dict[tuple[str, int], int] = {}
        self._last_deadline = -math.inf
        self._next_id = 1
        #: the latest :meth:`assign` left a request for any connection waiting for room, and
        #: nothing but :meth:`add` changed the queue since: a request added now waits too
        self.full = False
        #: the largest message and MPUB body nsqd is known to take (nsqd's defaults, until
        #: it names its limits or takes more): a request over them goes alone (see assign)
        self.msg_limit = DEFAULT_MAX_MSG_SIZE
        self.body_limit = DEFAULT_MAX_BODY_SIZE

    def __len__(self) -> int:
        """Requests not yet answered (queued or sent)."""
        return len(self.requests)

    def add(
        self,
        topic: str,
        kind: Kind,
        bodies: list[bytes],
        deadline: float,
        *,
        partition: int | None = None,
        sharding_key: bytes | None = None,
        trace_ids: list[int] | None = None,
        delay: float = 0.0,
        ext: bytes | None = None,
        ext_traced: bool = False,
    ) -> Request:
        """A new request, queued; it expires at ``deadline``, or with the one before it."""
        rid = self._next_id
        self._next_id += 1
        # deadlines never decrease in the order requests are made (under a clock that goes
        # back, one waits for the one before it): the first request is the next to expire
        if deadline < self._last_deadline:
            deadline = self._last_deadline
        self._last_deadline = deadline
        req = Request(
            rid,
            topic,
            kind,
            bodies,
            partition,
            sharding_key,
            trace_ids,
            delay,
            deadline,
            ext,
            ext_traced,
        )
        self.requests[rid] = req
        self.waiting.append(req)
        return req

    def next_deadline(self) -> float | None:
        """When the oldest request expires (no scan of every request)."""
        if not self.requests:
            return None
        return next(iter(self.requests.values())).deadline

    def expired(self, now: float) -> list[Request]:
        """The requests whose deadline is past at ``now``, oldest first."""
        expired: list[Request] = []
        for req in self.requests.values():
            if req.deadline > now:
                break  # the rest expire later (see add)
            expired.append(req)
        return expired

    def answered(self, req: Request) -> None:
        """nsqd acknowledged ``req``."""
        self.full = False
        if req.stream is not None:
            self._release(req)
        if req.isolated:  # nsqd took it: it takes that much
            self.msg_limit = max(self.msg_limit, _largest(req))
            if req.kind is Kind.MPUB:
                self.body_limit = max(self.body_limit, _mpub_body_size(req))
        self.requests.pop(req.request_id, None)

    def refused(self, error: NSQError) -> None:
        """nsqd refused a request with ``error``: when that names its limit of a message's
        or an MPUB's size, requests over it go alone from now on."""
        limit = _limit_named(error, "E_BAD_MESSAGE", _TOO_BIG)
        if limit is not None:
            self.msg_limit = limit
        limit = _limit_named(error, "E_BAD_BODY", _BODY_TOO_BIG)
        if limit is not None:
            self.body_limit = limit

    def _ends_connection(self, req: Request) -> bool:
        """``req`` is over what nsqd is known to take: nsqd may refuse it with a fatal error
        and close the connection without reading it, and the reset that follows can lose
        the answers of the commands around it, which would then be sent again (and land
        twice).  So it goes alone: on an idle connection, with nothing behind it."""
        if _largest(req) > self.msg_limit:
            return True
        return req.kind is Kind.MPUB and _mpub_body_size(req) > self.body_limit

    def remove(self, req: Request) -> None:
        """``req`` fails: it is no longer waiting, sent or retried."""
        self.full = False
        self._release(req)
        self.requests.pop(req.request_id, None)
        with contextlib.suppress(ValueError):
            self.waiting.remove(req)

    def retry(self, req: Request, error: NSQError, now: float) -> float | None:
        """``req`` failed on its connection with ``error``: the time it may be sent again
        (queued again in call order, after go-nsq's backoff of 8 ms + 10 ms * 2^n), or None
        when it fails (nsqd refused it, its attempts are spent, or its deadline passed).  A
        loss of the connection is retried, and so are the partitioned server's errors that
        say the topology changed."""
        self._release(req)
        retryable = not isinstance(error, ServerError) or error.code in TOPOLOGY_CHANGED
        if not (retryable and req.attempts < self._max_attempts and req.deadline > now):
            return None
        req.not_before = now + _RETRY_BASE + _RETRY_STEP * (1 << req.attempts)
        self._requeue(req)
        return req.not_before

    def split(self, reqs: list[Request], error: ServerError) -> list[Request]:
        """A coalesced MPUB carrying ``reqs`` was refused for one of its bodies (``error``):
        returns those that fail with it, and queues the others again at once, the attempt not
        counted (a neighbour's body failed it).  When nsqd named its message size limit
        (``MPUB message too big 1048577 > 1048576``), the bodies over it fail and the others
        go again coalesced; otherwise each goes again alone, so that only the bad one fails."""
        named = _limit_named(error, "E_BAD_MESSAGE", _TOO_BIG)
        limit = math.inf
        if named is not None and all(req.ext is None for req in reqs):
            limit = float(named)
        failed = [req for req in reqs if len(req.bodies[0]) > limit]
        for req in reqs:
            if len(req.bodies[0]) <= limit:
                self._release(req)
                req.attempts -= 1
                req.alone = not failed
                req.not_before = 0.0
                self._requeue(req)
        return failed

    def _requeue(self, req: Request) -> None:
        """``req`` waits again, in its place in call order."""
        self.full = False
        waiting = self.waiting
        rid = req.request_id
        index = len(waiting)
        while index and waiting[index - 1].request_id > rid:
            index -= 1
        waiting.insert(index, req)

    def _release(self, req: Request) -> None:
        stream = req.stream
        if stream is not None:
            req.stream = None
            if self.streams.get(stream) == req.request_id:
                del self.streams[stream]

    def assign(self, now: float, routes: Routes, pool: Pool) -> list[Step]:
        """Decide where the queued requests go now, in call order: each one that can go is
        assigned to a connection of ``pool`` (its attempt counted) and taken off the queue;
        the others stay queued, in order.  A request waits while its route is unknown, while
        its retry backs off, while an earlier request of its ordered partition is on the wire
        or waiting, and while no connection has room (a request for any connection then holds
        back every later one: FIFO).  Returns the decisions, in order."""
        waiting = self.waiting
        streams = self.streams
        self.full = False
        steps: list[Step] = []
        #: ordered partitions whose earliest queued request cannot go now: later ones wait
        blocked: set[tuple[str, int]] = set()
        skipped: list[Request] = []
        while waiting:
            req = waiting.popleft()
            try:
                routed = routes.route(req)
            except LocalProtocolError as exc:
                steps.append(Refuse(req, exc))
                continue
            if routed is None:
                skipped.append(req)
                continue
            address, partition = routed
            stream = routes.stream(req, partition)
            if stream is not None and (stream in blocked or stream in streams):
                # one request on the wire per ordered partition: a refusal or a loss can then
                # never let a later publish overtake an earlier one
                skipped.append(req)
                blocked.add(stream)
                continue
            if req.not_before > now:
                skipped.append(req)  # backing off before a retry
                if stream is not None:
                    blocked.add(stream)
                continue
            bodies = req.bodies
            if len(bodies) == 1 and req.ext is None:  # _ends_connection's common case, inline
                alone = len(bodies[0]) > self.msg_limit
            else:
                alone = self._ends_connection(req)
            conn_id = pool.pick(address, alone)
            if conn_id is None:
                if address is not None:
                    steps.append(OpenPool(address))
                skipped.append(req)
                if stream is not None:
                    blocked.add(stream)
                if address is None:
                    self.full = True
                    break  # every connection is busy: keep FIFO order
                continue
            if req.kind is Kind.DPUB and pool.partitioned(conn_id):
                steps.append(Refuse(req, LocalProtocolError(NO_DPUB)))
                continue
            pool.take(conn_id, alone)
            req.isolated = alone
            members = None
            if not alone and waiting and self._max_messages > 1 and _coalescable(req):
                members = self._join(req, address, partition, stream, now, routes)
            if members is None:
                req.attempts += 1
                req.conn_id = conn_id
                req.sent_partition = partition
                if stream is not None:
                    req.stream = stream
                    streams[stream] = req.request_id
                steps.append(req)
                continue
            for member in members:
                member.attempts += 1
                member.conn_id = conn_id
                member.sent_partition = partition
                member.stream = stream
            if stream is not None:
                # held by the last: the members expire in call order, so the partition is
                # free again only once none of them is on the wire
                streams[stream] = members[-1].request_id
            steps.append(Coalesced(members))
        waiting.extendleft(reversed(skipped))
        return steps

    def _join(
        self,
        head: Request,
        address: tuple[str, int] | None,
        partition: int | None,
        stream: tuple[str, int] | None,
        now: float,
        routes: Routes,
    ) -> list[Request] | None:
        """The single publishes queued after ``head`` that go with it as one MPUB (taken off
        the queue), ``head`` first; None when none can.  They are of its topic and go where it
        goes; an ordered partition's take no publish past one of theirs that cannot join."""
        max_messages = self._max_messages
        max_bytes = min(self._max_bytes, self.body_limit)
        msg_limit = self.msg_limit
        size = 4 + _mpub_size(head)
        if size > max_bytes:
            return None
        waiting = self.waiting
        topic = head.topic
        has_ext = head.ext is not None
        members = [head]
        kept: list[Request] = []
        while waiting and len(members) < max_messages:
            cand = waiting.popleft()
            if cand.topic != topic:
                kept.append(cand)
                continue
            joins = (
                cand.kind is Kind.PUB
                and cand.trace_ids is None
                and not cand.ext_traced
                and not cand.alone
                and (cand.ext is not None) is has_ext
                and cand.not_before <= now
            )
            if joins and (cand.sharding_key is not None or cand.partition is not None):
                try:
                    routed = routes.route(cand)
                except LocalProtocolError:
                    routed = None  # refused by the dispatch, in its turn
                joins = routed == (address, partition) and routes.stream(cand, partition) == stream
            # (a publish to any partition goes to this one)
            if not joins:
                kept.append(cand)
                if stream is not None:
                    break  # it may be of the ordered partition: nothing overtakes it
                continue
            ext = cand.ext
            added = 4 + len(cand.bodies[0]) + (0 if ext is None else 2 + len(ext))
            if added - 4 > msg_limit:  # it goes alone (see _ends_connection)
                kept.append(cand)
                break
            if size + added > max_bytes:
                kept.append(cand)
                break
            size += added
            members.append(cand)
        waiting.extendleft(reversed(kept))
        return members if len(members) > 1 else None
