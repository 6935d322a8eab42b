"""Which nsqd a consumer connects to: :class:`Discovery`, from its fixed list and lookupd.

A consumer consumes from *targets*: an nsqd, or one partition on a partitioned nsqd, named by
a key (``host:port`` or ``host:port-partition``).  The targets come from the fixed nsqd list
(one per configured partition, or one per nsqd) and from each lookup (the partitions' leaders,
then the nsqd that list the topic without partitions); :class:`Discovery` keeps the book of the
targets the consumer is connected (or connecting) to, so that a target is connected to once.
It asks lookupd (through its :class:`~._lookupd_client.LookupdClient`, whose HTTP calls and
their answers the consumer hands on) and, before the first connection to a partition with a
``start_from`` position, has the position set on the partition's leader
(:class:`~._start_positions.StartPositions`).

After a loss it decides how the target comes back (:class:`AfterLoss`): found through lookupd,
only if lookupd lists it again, which it asks soon (its :class:`~._lookupd_schedule.PollSchedule`
schedules the recheck); from the fixed list, after a reconnect delay
(:class:`~._core.ReconnectScheduler`; the ``RECONNECT`` timer, whose argument is the target's
``(address, partition)``, is set in the core's timers).  It also learns from lookup answers and
nsqd's errors whether the topic must be consumed in order (``SUB_ORDERED``) and whether it is
extended.

It hands its decisions back through two callbacks the consumer gives: ``connect`` (a target
to connect to now: the consumer opens the connection, asking :meth:`Discovery.wanted` and
telling :meth:`Discovery.connecting`) and ``send`` (its HTTP requests and its events:
``LookupSucceeded``, ``LookupFailed``, ``StartFromApplied``, ``StartFromFailed``), in the order
decided.  Nothing here knows a :class:`Connection`.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Final

from ._config import ConfigError, ConsumerConfig
from ._core import ReconnectScheduler
from ._errors import LookupdError
from ._events import ConnId, LookupFailed, LookupSucceeded, StartFromApplied
from ._lookupd import LookupResult, Peer
from ._lookupd_client import (
    HttpAnswer,
    LookupAnswered,
    LookupdClient,
    LookupdFailed,
    LookupdsLearned,
    NsqdAnswered,
)
from ._lookupd_schedule import PollSchedule
from ._outputs import Output
from ._partitioned import TOPOLOGY_CHANGED
from ._start_positions import StartDecision, StartPositions
from ._timers import TimerKind, Timers

__all__ = ["AfterLoss", "ConnectTarget", "Discovery", "LookupPlan", "Target", "target_key"]

#: seconds before lookupd is asked again after nsqd said the topic's topology changed (go-nsq)
TOPOLOGY_RECHECK_DELAY: Final = 1.0


def target_key(address: tuple[str, int], partition: int | None) -> str:
    """The key of a target: ``host:port``, and ``-partition`` for a partition."""
    key = f"{address[0]}:{address[1]}"
    return key if partition is None else f"{key}-{partition}"


@dataclass(frozen=True, slots=True)
class Target:
    """One place to consume from: an nsqd, or one partition on it."""

    address: tuple[str, int]
    partition: int | None = None
    #: the topic is extended (its messages carry an extension header)
    extend_support: bool = False
    #: lookup targets on a partition: the partition's leader as lookupd lists it (where its
    #: start position is set)
    leader: Peer | None = None


@dataclass(frozen=True, slots=True)
class LookupPlan:
    """What a lookup answer means: the targets to consume from, in the order to connect (the
    consumer skips those it has), and the keys lookupd listed (for ``LookupSucceeded``)."""

    targets: tuple[Target, ...]
    keys: tuple[str, ...]


#: the consumer's callback: connect to ``address`` (its ``partition``) now; ``extend_support``:
#: the topic is extended
ConnectTarget = Callable[[tuple[str, int], int | None, bool], None]


class AfterLoss(Enum):
    """How a lost target comes back."""

    # members are singletons: identity hashing is exact and much cheaper than Enum's
    __hash__ = object.__hash__

    #: found through lookupd: connected again only if lookupd lists it again (asked soon)
    RECHECK = "recheck"
    #: from the fixed list: connected again when its ``RECONNECT`` timer fires
    RECONNECT = "reconnect"
    #: neither (a target of a lookup when the consumer has no lookupd any more): gone
    GONE = "gone"


class Discovery:
    """The targets of one consumer (see the module's docstring)."""

    __slots__ = (
        "_by_key",
        "_connect",
        "_lookupd",
        "_nsqd",
        "_partitions",
        "_polls",
        "_reconnects",
        "_send",
        "_starts",
        "_stopped",
        "_timers",
        "_topic",
        "extend_support",
        "ordered_required",
    )

    def __init__(
        self,
        topic: str,
        channel: str,
        config: ConsumerConfig,
        nsqd: Sequence[tuple[str, int]],
        lookupd: list[tuple[str, int]],
        *,
        rng: random.Random,
        timers: Timers,
        reconnects: ReconnectScheduler,
        connect: ConnectTarget,
        send: Callable[[Output], None],
    ) -> None:
        self._lookupd = LookupdClient(
            lookupd,
            timeout=config.lookupd_poll_timeout,
            user_agent=config.user_agent,
            timers=timers,
            send=send,
        )
        self._starts = StartPositions(topic, channel, config, self._lookupd)
        if config.ordered and nsqd and not lookupd and not config.partitions:
            # SUB_ORDERED names a partition: without lookupd to learn them, say which
            raise ConfigError(
                "ordered=True with nsqd_tcp_addresses needs partitions=[...] "
                "(or lookupd_http_addresses, to learn the topic's partitions)"
            )
        self._topic = topic
        self._nsqd = nsqd
        self._connect = connect
        self._send = send
        self._partitions = config.partitions
        self._timers = timers
        self._reconnects = reconnects
        self._polls = PollSchedule(
            rng,
            timers,
            enabled=bool(lookupd),
            interval=config.lookupd_poll_interval,
            jitter=config.lookupd_poll_jitter,
            recheck_delay=config.lookupd_recheck_delay,
        )
        #: key -> the connection to that target (connected or connecting)
        self._by_key: dict[str, ConnId] = {}
        #: the topic must be consumed in order: SUB_ORDERED on every partition
        self.ordered_required = config.ordered
        #: the latest lookup said the topic is extended
        self.extend_support = False
        self._stopped = False

    # ------------------------------------------------------------------ targets

    def start(self, now: float) -> None:
        """Connect to the fixed list's targets: each nsqd, once per configured partition (a
        partitioned server without lookupd) or once; then poll lookupd."""
        partitions: Sequence[int | None] = self._partitions or (None,)
        for address in self._nsqd:
            for partition in partitions:
                self._connect(address, partition, False)
        if self._lookupd.addresses:
            self.poll(now)

    def wanted(self, address: tuple[str, int], partition: int | None) -> str | None:
        """The key of a target to connect to, or None when a connection to it exists."""
        key = target_key(address, partition)
        return None if key in self._by_key else key

    def connecting(self, key: str, conn_id: ConnId) -> None:
        """The consumer opens ``conn_id`` to the target ``key``."""
        self._by_key[key] = conn_id

    def ordered(self, partition: int | None) -> bool:
        """Whether a connection to ``partition`` subscribes in order (SUB_ORDERED)."""
        return self.ordered_required and partition is not None

    def plan(self, result: LookupResult, now: float) -> LookupPlan:
        """What a lookup answer means: the partitions' leaders (the configured partitions
        only), then the nsqd listing the topic without partitions (none for a consumer pinned
        to partitions).  Schedules the next poll soon while nothing is listed."""
        meta = result.meta
        if meta is not None and meta.ordered:
            self.ordered_required = True
        extend = self.extend_support = bool(meta and meta.extend_support)
        wanted = self._partitions
        targets: list[Target] = []
        keys: list[str] = []
        partitioned = set()
        for pid, peer in sorted(result.partitions.items()):
            partitioned.add(peer.key)
            if wanted is not None and pid not in wanted:
                continue
            keys.append(f"{peer.key}-{pid}")
            targets.append(Target(peer.address, pid, extend, peer))
        if wanted is None:
            # partition-pinned consumers skip the nodes without partitions
            for peer in result.producers:
                if peer.key not in partitioned:
                    keys.append(peer.key)
                    targets.append(Target(peer.address))
        self._polls.lookup_answered(bool(keys or self._by_key), now)
        return LookupPlan(tuple(targets), tuple(keys))

    # ------------------------------------------------------------------ lookupd's answers

    def http_data(self, request_id: int, data: bytes, now: float) -> None:
        """Bytes of a lookupd (or nsqd HTTP API) response (``b""`` at EOF)."""
        self._answered(self._lookupd.http_data(request_id, data, now), now)

    def http_failed(self, request_id: int, error: BaseException, now: float) -> None:
        """The call could not reach lookupd (or nsqd's HTTP API), or the transfer broke."""
        self._answered(self._lookupd.http_failed(request_id, error), now)

    def http_timed_out(self, request_id: int, now: float) -> None:
        """The ``HTTP_TIMEOUT`` timer of a call fired."""
        self._answered(self._lookupd.timed_out(request_id), now)

    def _answered(self, answer: HttpAnswer | None, now: float) -> None:
        if answer is None:
            return
        if isinstance(answer, LookupAnswered):
            if not self._stopped:
                self._lookup(answer.address, answer.result, now)
        elif isinstance(answer, LookupdsLearned):
            self.poll_within(now)
        elif isinstance(answer, LookupdFailed):
            self._send(LookupFailed(answer.address, answer.error))
        elif isinstance(answer, NsqdAnswered):
            self._started(self._starts.answered(answer, now))
        else:
            self._started(self._starts.failed(answer))

    def _lookup(self, address: tuple[str, int], result: LookupResult, now: float) -> None:
        plan = self.plan(result, now)
        starts = self._starts
        for target in plan.targets:
            pid, leader = target.partition, target.leader
            if pid is not None and leader is not None and starts.pending(pid):
                starts.seek(leader, pid, now)  # connects once the position is set
            else:
                self._connect(target.address, pid, target.extend_support)
        self._send(LookupSucceeded(address, plan.keys, result.topic_found))

    def _started(self, decision: StartDecision) -> None:
        if decision is None:
            return
        self._send(decision)
        if isinstance(decision, StartFromApplied):
            # the position is set: consume from the partition now
            self._connect(decision.address, decision.partition, self.extend_support)

    # ------------------------------------------------------------------ losses and errors

    def connected(self, address: tuple[str, int], partition: int | None) -> None:
        """The connection to a target completed its handshake: its next loss waits the
        first reconnect delay again."""
        self._reconnects.connected((address, partition))

    def lost(self, key: str, conn_id: ConnId) -> None:
        """The connection ``conn_id`` to ``key`` closed: the target is free again."""
        if self._by_key.get(key) == conn_id:
            del self._by_key[key]

    def replace(
        self, key: str, address: tuple[str, int], partition: int | None, now: float
    ) -> AfterLoss:
        """How the lost target ``key`` comes back (see :class:`AfterLoss`); schedules the
        lookupd recheck or the ``RECONNECT`` timer."""
        if self._lookupd.addresses and address not in self._nsqd:
            # the guide: with lookupd, reconnect only if lookupd still lists it; go-nsq asks
            # lookupd again right after a close rather than waiting for the next poll
            self._polls.connection_lost(key, now)
            return AfterLoss.RECHECK
        if address in self._nsqd:
            target = (address, partition)
            delay = self._reconnects.delay(target)
            self._timers.set((TimerKind.RECONNECT, target), now + delay)
            return AfterLoss.RECONNECT
        return AfterLoss.GONE

    def nsqd_error(self, code: str, now: float) -> None:
        """nsqd answered ``code``: after ``E_SUB_ORDER_IS_MUST`` every partition subscribes in
        order; after it or a change of topology, lookupd is asked again soon (go-nsq: drop
        that target and look the topic up about 1 s later)."""
        must = code == "E_SUB_ORDER_IS_MUST"
        if must:
            self.ordered_required = True
        if must or code in TOPOLOGY_CHANGED:
            self._polls.poll_within(now, TOPOLOGY_RECHECK_DELAY)

    # ------------------------------------------------------------------ lookupd polls

    def poll(self, now: float) -> None:
        """Look the topic up on every lookupd (and ask the cluster for its other lookupd) now;
        the next regular poll is scheduled.  Nothing once stopped."""
        if self._stopped:
            return
        self._lookupd.lookup(self._topic, "r", now)
        self._lookupd.refresh_cluster(now)
        self._polls.polled(now)

    def poll_within(self, now: float, delay: float = 0.0) -> None:
        """Poll at ``now + delay`` unless a poll is due sooner (nothing once stopped)."""
        self._polls.poll_within(now, delay)

    def recheck(self, now: float) -> None:
        """A ``LOOKUPD_RECHECK`` timer fired: look up now if some target lost through lookupd
        is still away."""
        if self._polls.recheck_due(now, self._by_key):  # (never once stopped)
            self._lookupd.lookup(self._topic, "r", now)
            self._lookupd.refresh_cluster(now)

    def stop(self, now: float) -> None:
        """The consumer stops: no more polls, rechecks or reconnects, and the calls out are
        cancelled (each reported as failed: ``LookupFailed``, ``StartFromFailed``)."""
        self._stopped = True
        self._polls.stop()
        self._timers.cancel_kind(TimerKind.RECONNECT)
        for answer in self._lookupd.cancel_all(LookupdError("consumer stopping")):
            self._answered(answer, now)
