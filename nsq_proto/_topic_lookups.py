"""The producer's lookups of its topics' routes: :class:`TopicLookups`.

A producer with lookupd asks it where a topic's publishes go when a publish needs a route,
again at its :class:`~._lookupd_schedule.RouteRefresh` deadlines, and at once when nsqd says
the topic's topology changed.  :class:`TopicLookups` owns the topics being looked up, the
latest failure of each topic's lookup and how often lookupd refused it lately, and its
:class:`~._lookupd_client.LookupdClient` (the HTTP calls: the producer hands their answers on
to :meth:`TopicLookups.answer`); it fills the producer's :class:`~._routes.Routes` from the
answers.

It hands its decisions back as values: the nsqd to open a pool to (:class:`Routed`), or the
failure of the publishes waiting for a topic that lookupd refused twice
(:class:`Refused`); the producer carries them out.  Its events
(:class:`~nsq_proto.LookupFailed`) go out through the ``send`` callable it is given.  Nothing
here knows a connection or a request.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ._config import ProducerConfig
from ._errors import LookupdError, NSQError
from ._events import LookupFailed
from ._lookupd import LookupResult
from ._lookupd_client import HttpAnswer, LookupAnswered, LookupdClient, LookupdFailed
from ._lookupd_schedule import RouteRefresh
from ._outputs import Output
from ._routes import Routes
from ._timers import Timers

__all__ = ["Refused", "Routed", "TopicLookups"]


@dataclass(frozen=True, slots=True)
class Routed:
    """A lookup answered: the producer opens a pool to each of these nsqd, in this order."""

    #: nsqd of a standard server that lookupd listed, for a producer with no nsqd yet (they
    #: become its nsqd list)
    nsqd: tuple[tuple[str, int], ...] = ()
    #: the leaders of the topic's partitions, sorted
    leaders: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, slots=True)
class Refused:
    """lookupd refused ``topic`` twice: the publishes waiting for it fail with ``error`` (each
    with a copy of it)."""

    topic: str
    error: LookupdError


class TopicLookups:
    """The lookups of one producer's topics (see the module's docstring)."""

    __slots__ = (
        "_errors",
        "_nsqd",
        "_pending",
        "_refresh",
        "_refusals",
        "_routes",
        "_send",
        "client",
    )

    def __init__(
        self,
        config: ProducerConfig,
        nsqd: Sequence[tuple[str, int]],
        lookupd: list[tuple[str, int]],
        routes: Routes,
        *,
        timers: Timers,
        send: Callable[[Output], None],
    ) -> None:
        #: the HTTP calls to lookupd (``lookupd``: the configured ones)
        self.client = LookupdClient(
            lookupd,
            timeout=config.lookupd_poll_timeout,
            user_agent=config.user_agent,
            timers=timers,
            send=send,
        )
        #: the producer's nsqd list (a standard server's nsqd are looked up while it is empty)
        self._nsqd = nsqd
        self._routes = routes
        self._refresh = RouteRefresh(timers, interval=config.lookupd_poll_interval)
        self._send = send
        #: topics looked up and not answered yet (one lookup at a time per topic); None once
        #: closed (no lookup then)
        self._pending: set[str] | None = set()
        #: topic -> lookupd's latest failure for it
        self._errors: dict[str, NSQError] = {}
        #: topic -> how often lookupd refused it since its last answer
        self._refusals: dict[str, int] = {}

    def lookup(self, topic: str, now: float) -> None:
        """Ask every lookupd for ``topic``'s route (nothing while a lookup of it is under way,
        or once closed)."""
        pending = self._pending
        if pending is None or topic in pending:
            return
        pending.add(topic)
        self.client.refresh_cluster(now)  # the cluster's lookupd may have changed
        self.client.lookup(topic, "w", now)

    def forget(self, topic: str, now: float) -> None:
        """nsqd said ``topic``'s topology changed: its route is forgotten and looked up again."""
        self._routes.forget(topic)
        if self.client.addresses:
            self.lookup(topic, now)

    def close(self) -> None:
        """No lookup from now on."""
        self._pending = None

    def error(self, topic: str) -> NSQError | None:
        """Why ``topic`` has no route: its lookup's latest failure (None: it has a route, or
        no lookup of it failed since its last answer)."""
        if self._routes.known(topic):
            return None
        return self._errors.get(topic)

    def answer(self, answer: HttpAnswer | None, now: float) -> Routed | Refused | None:
        """An HTTP call's outcome (:meth:`LookupdClient.http_data` and the like): a
        :class:`Routed` when a lookup answered (the producer dispatches then); a
        :class:`Refused` when lookupd has now refused a topic twice; else None."""
        if isinstance(answer, LookupAnswered):
            return self._answered(answer.topic, answer.result, now)
        if isinstance(answer, LookupdFailed):
            self._send(LookupFailed(answer.address, answer.error))
            if answer.topic is not None:
                return self._failed(answer.topic, answer.error, answer.answered, now)
        # LookupdsLearned: asked at the next lookup; the producer makes no calls to nsqd
        return None

    def _answered(self, topic: str, result: LookupResult, now: float) -> Routed:
        self._refusals.pop(topic, None)
        self._errors.pop(topic, None)
        self._done(topic)
        leaders = self._routes.apply(topic, result)
        if leaders is None:
            return Routed()  # keep what we know until an answer says something useful
        self._refresh.answered(topic, now)
        if leaders or self._nsqd:
            return Routed((), tuple(leaders))
        # standard nsqd behind lookupd: publish to the nsqd it lists
        peers: list[tuple[str, int]] = []
        for peer in result.producers:
            if peer.address not in peers:
                peers.append(peer.address)
        return Routed(tuple(peers))

    def _failed(self, topic: str, error: NSQError, answered: bool, now: float) -> Refused | None:
        self._errors[topic] = error
        if answered:
            self._refusals[topic] = self._refusals.get(topic, 0) + 1
        if self.client.looking_up(topic):
            return None
        self._done(topic)
        # try again a little later; other waiting requests time out on their deadline
        self._refresh.failed(topic, now)
        if self._refusals.get(topic, 0) < 2 or self._routes.known(topic):
            return None
        # lookupd said no twice (e.g. "Topic has no channel, should init at least one for
        # the new topic"): the publishes waiting for it fail now, with its answer
        del self._refusals[topic]
        failure = LookupdError(f"no route to topic {topic!r}: {error}")
        failure.__cause__ = error
        return Refused(topic, failure)

    def _done(self, topic: str) -> None:
        if self._pending is not None and not self.client.looking_up(topic):
            self._pending.discard(topic)
