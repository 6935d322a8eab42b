"""The HTTP calls of a core: nsqlookupd's ``/lookup`` and ``/listlookup``, and nsqd's HTTP API.

:class:`LookupdClient` owns the lookupd a core asks (the configured ones, then those the
partitioned cluster names in ``/listlookup``), the calls in flight (each with its request id,
response parser and timeout), and the count of unanswered calls that drops a lookupd learned
from the cluster.  It sends :class:`~nsq_proto.HttpRequest` outputs through the ``send``
callable it is given and hands every outcome back as a value (an :data:`HttpAnswer`); the core
decides what an answer means for it (connect, poll again, fail publishes) and turns a failure
into a :class:`~nsq_proto.LookupFailed` event.

When to ask is :mod:`._lookupd_schedule`'s decision (the consumer's polls with jitter and its
rechecks after a loss, the producer's route refreshes); the producer also asks for a topic
when a publish needs a route.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Final

from ._errors import LookupdError, NSQError
from ._lookupd import (
    HttpResponseParser,
    LookupResult,
    build_listlookup_request,
    build_lookup_request,
    build_post_request,
    feed_listlookup_response,
    feed_lookup_response,
)
from ._outputs import HttpRequest
from ._timers import TimerKind, Timers

__all__ = [
    "MAX_LOOKUPD_FAILURES",
    "HttpAnswer",
    "LookupAnswered",
    "LookupdClient",
    "LookupdFailed",
    "LookupdsLearned",
    "NsqdAnswered",
    "NsqdCallFailed",
]

#: requests in a row a lookupd learned from /listlookup may leave unanswered before it is dropped
MAX_LOOKUPD_FAILURES: Final = 3


class _Kind(Enum):
    """What an HTTP call asks."""

    LOOKUP = "lookup"
    LISTLOOKUP = "listlookup"
    #: a call to nsqd's HTTP API (the consumer's start position)
    NSQD = "nsqd"


@dataclass(slots=True)
class _Call:
    kind: _Kind
    address: tuple[str, int]
    parser: HttpResponseParser
    #: the topic looked up (``/lookup`` only)
    topic: str | None = None


# ------------------------------------------------------------------------------------ answers


@dataclass(frozen=True, slots=True)
class LookupAnswered:
    """A lookupd at ``address`` answered ``/lookup`` for ``topic`` with a usable result."""

    address: tuple[str, int]
    topic: str
    result: LookupResult


@dataclass(frozen=True, slots=True)
class LookupdsLearned:
    """``/listlookup`` named lookupd not known before (already added to the client's list)."""

    addresses: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class LookupdFailed:
    """A call to the lookupd at ``address`` failed: ``topic`` is the topic of a ``/lookup``
    (None for ``/listlookup``); ``answered``: lookupd itself said no (an error status or an
    unusable body), as opposed to a request that never got an answer."""

    address: tuple[str, int]
    topic: str | None
    error: NSQError
    answered: bool


@dataclass(frozen=True, slots=True)
class NsqdAnswered:
    """The call to nsqd's HTTP API that :meth:`LookupdClient.post` returned ``request_id`` for
    got a complete response (any status)."""

    request_id: int
    status: int
    body: bytes


@dataclass(frozen=True, slots=True)
class NsqdCallFailed:
    """The call to nsqd's HTTP API ``request_id`` got no complete response."""

    request_id: int
    error: NSQError


#: every outcome of an HTTP call a core is told about
HttpAnswer = LookupAnswered | LookupdsLearned | LookupdFailed | NsqdAnswered | NsqdCallFailed


class LookupdClient:
    """The HTTP calls of one core: requests out (through ``send``), answers back as values.

    ``timers`` is the core's registry: the client sets a ``(TimerKind.HTTP_TIMEOUT, request
    id)`` key per call and cancels it with the call, and the core hands such a key back to
    :meth:`timed_out` when it is due, so that the timeouts fire in deadline order with the
    core's own timers."""

    __slots__ = (
        "_calls",
        "_cluster_seen",
        "_failures",
        "_next_id",
        "_send",
        "_timeout",
        "_timers",
        "addresses",
        "seeds",
        "user_agent",
    )

    def __init__(
        self,
        addresses: list[tuple[str, int]],
        *,
        timeout: float,
        user_agent: str | None,
        timers: Timers,
        send: Callable[[HttpRequest], None],
    ) -> None:
        #: every lookupd asked: the configured ones, then those learned from /listlookup
        self.addresses = addresses
        #: the configured lookupd, never dropped; /listlookup asks them
        self.seeds = list(addresses)
        self.user_agent = user_agent or "nsq_proto"
        self._timeout = timeout
        self._timers = timers
        self._send = send
        self._calls: dict[int, _Call] = {}
        self._next_id = 1
        #: a lookup answered like the partitioned cluster: /listlookup asks for the other lookupd
        self._cluster_seen = False
        #: lookupd -> requests in a row that got no answer (a learned one is dropped at
        #: MAX_LOOKUPD_FAILURES; the configured ones are always kept)
        self._failures: dict[tuple[str, int], int] = {}

    # -------------------------------------------------------------------------- requests

    def _request(self, call: _Call, data: bytes, now: float) -> int:
        rid = self._next_id
        self._next_id += 1
        self._calls[rid] = call
        host, port = call.address
        self._send(HttpRequest(rid, host, port, data, self._timeout))
        self._timers.set((TimerKind.HTTP_TIMEOUT, rid), now + self._timeout)
        return rid

    def lookup(self, topic: str, access: str, now: float) -> None:
        """``GET /lookup`` of ``topic`` (``access`` ``"r"`` or ``"w"``, with the partitioned
        server's metainfo) on every lookupd."""
        for host, port in self.addresses:
            data = build_lookup_request(
                host, port, topic, access=access, metainfo=True, user_agent=self.user_agent
            )
            self._request(_Call(_Kind.LOOKUP, (host, port), HttpResponseParser(), topic), data, now)

    def refresh_cluster(self, now: float) -> None:
        """Once a lookup was answered like the partitioned cluster: ask the configured lookupd
        for every lookupd of the cluster (:meth:`list_lookupds`).  Else nothing."""
        if self._cluster_seen:
            self.list_lookupds(now)

    def list_lookupds(self, now: float) -> None:
        """go-nsq (partitioned cluster): ``GET /listlookup`` on every configured lookupd, one
        round at a time (none while a call other than a ``/lookup`` is in flight, a call to
        nsqd included)."""
        if any(call.kind is not _Kind.LOOKUP for call in self._calls.values()):
            return
        for host, port in self.seeds:
            data = build_listlookup_request(host, port, user_agent=self.user_agent)
            self._request(_Call(_Kind.LISTLOOKUP, (host, port), HttpResponseParser()), data, now)

    def post(
        self,
        address: tuple[str, int],
        path: str,
        query: Mapping[str, str | int],
        body: bytes,
        now: float,
    ) -> int:
        """``POST path?query`` to nsqd's HTTP API at ``address``; returns the request id its
        :class:`NsqdAnswered` or :class:`NsqdCallFailed` answer carries."""
        host, port = address
        data = build_post_request(host, port, path, query, body, self.user_agent)
        return self._request(_Call(_Kind.NSQD, address, HttpResponseParser()), data, now)

    def looking_up(self, topic: str) -> bool:
        """A ``/lookup`` of ``topic`` is in flight."""
        return any(call.topic == topic for call in self._calls.values())

    # -------------------------------------------------------------------------- answers

    def http_data(self, request_id: int, data: bytes, now: float) -> HttpAnswer | None:
        """Bytes of the response to ``request_id`` (``b""`` at EOF): its answer once it is
        complete or unusable, else None (more is expected, or the call is not ours)."""
        call = self._calls.get(request_id)
        if call is None:
            return None
        if call.kind is _Kind.NSQD:
            return self._nsqd_data(request_id, call, data)
        try:
            answer = (
                feed_listlookup_response(call.parser, data)
                if call.kind is _Kind.LISTLOOKUP
                else feed_lookup_response(call.parser, data)
            )
        except LookupdError as exc:
            return self.failed(request_id, exc, answered=True)
        if answer is None:
            return None
        self._end(request_id)
        self._failures.pop(call.address, None)
        if not isinstance(answer, LookupResult):
            known = self.addresses
            new = [n.http_address for n in answer if n.http_address not in known]
            if not new:
                return None
            known.extend(new)
            return LookupdsLearned(tuple(new))
        assert call.topic is not None
        if (answer.meta is not None or answer.partitions) and not self._cluster_seen:
            self._cluster_seen = True
            self.list_lookupds(now)
        return LookupAnswered(call.address, call.topic, answer)

    def _nsqd_data(self, request_id: int, call: _Call, data: bytes) -> HttpAnswer | None:
        try:
            response = call.parser.receive_data(data)
            if response is None and not data:
                raise LookupdError("nsqd closed the connection before a full response")
        except LookupdError as exc:
            return self.failed(request_id, exc)
        if response is None:
            return None
        self._end(request_id)
        return NsqdAnswered(request_id, response.status, response.body)

    def http_failed(self, request_id: int, error: BaseException) -> HttpAnswer | None:
        """The driver could not send ``request_id`` or read its response."""
        exc = LookupdError(f"lookupd request failed: {error}")
        exc.__cause__ = error
        return self.failed(request_id, exc)

    def timed_out(self, request_id: int) -> HttpAnswer | None:
        """The ``HTTP_TIMEOUT`` timer of ``request_id`` is due."""
        return self.failed(request_id, LookupdError("lookupd request timed out"))

    def failed(
        self, request_id: int, error: NSQError, *, answered: bool = False
    ) -> HttpAnswer | None:
        """End the call ``request_id`` with ``error`` (None: no such call).  ``answered``:
        lookupd itself said no."""
        call = self._end(request_id)
        if call is None:
            return None
        if call.kind is _Kind.NSQD:
            return NsqdCallFailed(request_id, error)
        self._count_failure(call.address, answered)
        return LookupdFailed(call.address, call.topic, error, answered)

    def cancel_all(self, error: NSQError) -> list[HttpAnswer]:
        """End every call in flight with ``error``: their answers, in the order sent."""
        answers = [self.failed(rid, error) for rid in list(self._calls)]
        return [a for a in answers if a is not None]

    def _end(self, request_id: int) -> _Call | None:
        self._timers.cancel((TimerKind.HTTP_TIMEOUT, request_id))
        return self._calls.pop(request_id, None)

    def _count_failure(self, address: tuple[str, int], answered: bool) -> None:
        failures = self._failures
        if answered:
            failures.pop(address, None)  # it is there, and said no
            return
        count = failures[address] = failures.get(address, 0) + 1
        if count >= MAX_LOOKUPD_FAILURES and address not in self.seeds:
            # learned from /listlookup and gone: forget it; the cluster names it again
            # (the next /listlookup) if it comes back
            del failures[address]
            with contextlib.suppress(ValueError):
                self.addresses.remove(address)
