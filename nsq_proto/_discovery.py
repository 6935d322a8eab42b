"""Which nsqd a consumer connects to: :class:`Discovery`, from its fixed list and lookupd.

A consumer consumes from *targets*: an nsqd, or one partition on a partitioned nsqd, named by
a key (``host:port`` or ``host:port-partition``).  The targets come from the fixed nsqd list
(one per configured partition, or one per nsqd) and from each lookup (the partitions' leaders,
then the nsqd that list the topic without partitions); :class:`Discovery` keeps the book of the
targets the consumer is connected (or connecting) to, so that a target is connected to once.

After a loss it decides how the target comes back (:class:`AfterLoss`): found through lookupd,
only if lookupd lists it again, which it asks soon (its :class:`~._lookupd_schedule.PollSchedule`
schedules the recheck); from the fixed list, after a reconnect delay
(:class:`~._core.ReconnectScheduler`; the ``RECONNECT`` timer, whose argument is the target's
``(address, partition)``, is set in the core's timers).  It also learns from lookup answers and
nsqd's errors whether the topic must be consumed in order (``SUB_ORDERED``) and whether it is
extended.

The consumer asks it and carries out its decisions: it opens the connections
(:meth:`Discovery.wanted`, :meth:`Discovery.connecting`), sends the lookups, sets the start
positions of the partitions that still need one.  Nothing here knows a :class:`Connection`.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from ._config import ConfigError, ConsumerConfig
from ._core import ReconnectScheduler
from ._events import ConnId
from ._lookupd import LookupResult, Peer
from ._lookupd_schedule import PollSchedule
from ._partitioned import TOPOLOGY_CHANGED
from ._timers import TimerKind, Timers

__all__ = ["AfterLoss", "Discovery", "LookupPlan", "Target", "target_key"]

#: seconds before lookupd is asked again after nsqd said the topic's topology changed (go-nsq)
TOPOLOGY_RECHECK_DELAY = 1.0


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
        "_lookupd",
        "_nsqd",
        "_partitions",
        "_polls",
        "_reconnects",
        "_timers",
        "extend_support",
        "ordered_required",
    )

    def __init__(
        self,
        config: ConsumerConfig,
        nsqd: Sequence[tuple[str, int]],
        *,
        lookupd: bool,
        rng: random.Random,
        timers: Timers,
        reconnects: ReconnectScheduler,
    ) -> None:
        if config.ordered and nsqd and not lookupd and not config.partitions:
            # SUB_ORDERED names a partition: without lookupd to learn them, say which
            raise ConfigError(
                "ordered=True with nsqd_tcp_addresses needs partitions=[...] "
                "(or lookupd_http_addresses, to learn the topic's partitions)"
            )
        self._nsqd = nsqd
        self._lookupd = lookupd
        self._partitions = config.partitions
        self._timers = timers
        self._reconnects = reconnects
        self._polls = PollSchedule(
            rng,
            timers,
            enabled=lookupd,
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

    # ------------------------------------------------------------------ targets

    def fixed_targets(self) -> list[Target]:
        """The fixed list's targets: each nsqd, once per configured partition (a partitioned
        server without lookupd) or once."""
        partitions: Sequence[int | None] = self._partitions or (None,)
        return [Target(address, partition) for address in self._nsqd for partition in partitions]

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

    def lookup(self, result: LookupResult, now: float) -> LookupPlan:
        """A lookup answer: the partitions' leaders (the configured partitions only), then the
        nsqd listing the topic without partitions (none for a consumer pinned to partitions).
        Schedules the next poll soon while nothing is listed."""
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
        if self._lookupd and address not in self._nsqd:
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

    def polled(self, now: float) -> None:
        """A poll was sent at ``now``: the next regular one is scheduled."""
        self._polls.polled(now)

    def poll_within(self, now: float, delay: float = 0.0) -> None:
        """Poll at ``now + delay`` unless a poll is due sooner (nothing once stopped)."""
        self._polls.poll_within(now, delay)

    def recheck_due(self, now: float) -> bool:
        """A ``LOOKUPD_RECHECK`` timer fired: whether to look up now (some target lost
        through lookupd is still away)."""
        return self._polls.recheck_due(now, self._by_key)

    def stop(self) -> None:
        """The consumer stops: no more polls, rechecks or reconnects."""
        self._polls.stop()
        self._timers.cancel_kind(TimerKind.RECONNECT)
