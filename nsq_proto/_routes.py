"""The producer's routes: where each topic's publishes go (routing and sharding).

Filled from lookupd's answers; it names addresses and partitions, never a connection.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ._errors import LocalProtocolError
from ._lookupd import LookupResult
from ._partitioned import partition_for_key

if TYPE_CHECKING:
    from ._publish_queue import Request

__all__ = ["Routes"]


@dataclass(slots=True)
class _TopicRoute:
    partition_num: int
    partitions: dict[int, tuple[str, int]]
    ordered: bool
    #: the topic takes JSON extension headers (lookupd's ``extend_support``)
    extended: bool = False
    next_rr: int = 0


class Routes:
    """Where each topic's publishes go: routing and sharding.

    Without lookupd every publish goes to any connection of the pool.  With lookupd, a topic
    is routed once its lookup answered: a standard server's topic to any connection, a
    partitioned topic to the leader of a partition (the publish's own, its sharding key's, or
    the next one round-robin).  It knows no connection: it names addresses and partitions."""

    __slots__ = ("_hasher", "_lookupd", "routes")

    def __init__(self, *, lookupd: bool, hasher: Callable[[bytes], int] | None) -> None:
        self._lookupd = lookupd
        self._hasher = hasher
        #: topic -> its route, once a lookup answered
        self.routes: dict[str, _TopicRoute] = {}

    def known(self, topic: str) -> bool:
        return topic in self.routes

    def partitioned(self, topic: str) -> bool:
        """lookupd named partitions for ``topic``."""
        route = self.routes.get(topic)
        return route is not None and bool(route.partitions)

    def extended(self, topic: str) -> bool:
        """lookupd said ``topic`` takes JSON extension headers (an extended topic of the
        partitioned server)."""
        route = self.routes.get(topic)
        return route is not None and route.extended

    def wanted(self, address: tuple[str, int]) -> bool:
        """Some topic's partition is led from ``address``."""
        return any(address in r.partitions.values() for r in self.routes.values())

    def leaders(self) -> list[tuple[str, int]]:
        """The address of every partition leader known (with repeats)."""
        return [a for route in self.routes.values() for a in route.partitions.values()]

    def apply(self, topic: str, result: LookupResult) -> list[tuple[str, int]] | None:
        """A lookup of ``topic`` answered: the partition leaders to connect to, sorted (empty
        for a standard server); None when the answer is kept out (it lists no partition where
        a route with partitions is known: what is known stays until a useful answer)."""
        meta = result.meta
        partitions = {pid: p.address for pid, p in result.partitions.items()}
        old = self.routes.get(topic)
        if old is not None and old.partitions and not partitions:
            return None
        # no count from lookupd: 0, never the number of partitions listed (one may be missing)
        num = meta.partition_num if meta is not None and meta.partition_num > 0 else 0
        route = _TopicRoute(
            num, partitions, bool(meta and meta.ordered), bool(meta and meta.extend_support)
        )
        if old is not None:
            route.next_rr = old.next_rr
        self.routes[topic] = route
        return sorted(set(partitions.values()))

    def forget(self, topic: str) -> None:
        """The topology changed (a partitioned server's error): look ``topic`` up again."""
        self.routes.pop(topic, None)

    def route(self, req: Request) -> tuple[tuple[str, int] | None, int | None] | None:
        """Where a request goes: (address or None for any, partition); None: not yet known.
        Raises LocalProtocolError where it can go nowhere."""
        if not self._lookupd:
            return None, req.partition
        route = self.routes.get(req.topic)
        if route is None:
            return None
        if not route.partitions:
            return None, req.partition  # standard server behind lookupd: any of our nsqd
        if req.sharding_key is not None:
            if route.partition_num <= 0:
                raise LocalProtocolError(
                    f"lookupd gave no partition count (meta.partition_num) for topic "
                    f"{req.topic!r}: a sharding key cannot be mapped to a partition"
                )
            num = route.partition_num
            cached = req.hashed
            if cached is None or cached[0] != num:
                cached = req.hashed = (num, partition_for_key(req.sharding_key, num, self._hasher))
            pid = cached[1]
        elif req.partition is not None:
            pid = req.partition
        else:
            pids = sorted(route.partitions)
            pid = pids[route.next_rr % len(pids)]
            route.next_rr += 1
        address = route.partitions.get(pid)
        if address is None:
            num = route.partition_num
            if num and not 0 <= pid < num:
                raise LocalProtocolError(
                    f"topic {req.topic!r} has {num} partitions (0..{num - 1}): no partition {pid}"
                )
            return None
        return address, pid

    def stream(self, req: Request, partition: int | None) -> tuple[str, int] | None:
        """The ordered partition ``req`` belongs to: a publish with a sharding key, or to a
        partition of an ordered topic; None where call order is not promised."""
        if partition is None:
            return None
        if req.sharding_key is None and req.partition is None:
            return None
        if req.sharding_key is None:
            route = self.routes.get(req.topic)
            if route is None or not route.ordered:
                return None
        return (req.topic, partition)
