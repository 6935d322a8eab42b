"""The producer's queue and retries (``_publish_queue.py``) alone, on its routes: plain
requests, a pool of made-up connections, no Producer and no Connection."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from nsq_proto import (
    ConnectionClosedError,
    LocalProtocolError,
    LookupResult,
    ServerError,
)
from nsq_proto._publish_queue import (
    Coalesced,
    Kind,
    OpenPool,
    PublishQueue,
    Refuse,
    Request,
    Step,
)
from nsq_proto._routes import Routes

from .helpers import partitioned_result

ANY = Routes(lookupd=False, hasher=None)


@dataclass
class FakeConn:
    address: tuple[str, int]
    #: requests unanswered on it
    load: int
    partitioned: bool
    #: kept for a request alone
    kept: bool = False


class FakePool:
    """Connections named ``c<id>``: (address, requests unanswered, partitioned); room for
    ``cap`` each."""

    def __init__(self, cap: int = 2, **conns: tuple[tuple[str, int], int, bool]) -> None:
        self.cap = cap
        self.conns = {int(name[1:]): FakeConn(*value) for name, value in conns.items()}

    def pick(self, address: tuple[str, int] | None, alone: bool = False) -> int | None:
        best = None
        for conn_id, conn in self.conns.items():
            cap = 1 if alone else self.cap
            fits = (address is None or conn.address == address) and conn.load < cap
            fits = fits and not (conn.kept and conn.load)
            if fits and (best is None or conn.load < self.conns[best].load):
                best = conn_id
        return best

    def take(self, conn_id: int, alone: bool = False) -> None:
        self.conns[conn_id].load += 1
        self.conns[conn_id].kept = alone

    def partitioned(self, conn_id: int) -> bool:
        return self.conns[conn_id].partitioned


def queue(max_attempts: int = 5) -> PublishQueue:
    return PublishQueue(max_attempts=max_attempts)


def add(q: PublishQueue, topic: str = "t", deadline: float = 10.0, **kw: object) -> Request:
    kind = kw.pop("kind", Kind.PUB)
    assert isinstance(kind, Kind)
    return q.add(topic, kind, [b"x"], deadline, **kw)  # type: ignore[arg-type]


def sent(steps: list[Step]) -> list[tuple[int, int]]:
    """(request id, connection id) of each request assigned."""
    return [(s.request_id, s.conn_id) for s in steps if isinstance(s, Request)]


def commands(steps: list[Step]) -> list[tuple[list[int], int]]:
    """(request ids, connection id) of each command: a request alone or coalesced ones."""
    out: list[tuple[list[int], int]] = []
    for step in steps:
        if isinstance(step, Request):
            out.append(([step.request_id], step.conn_id))
        elif isinstance(step, Coalesced):
            conn_ids = {r.conn_id for r in step.requests}
            assert len(conn_ids) == 1
            out.append(([r.request_id for r in step.requests], conn_ids.pop()))
    return out


def coalescing(max_messages: int = 100, max_bytes: int = 1 << 20) -> PublishQueue:
    return PublishQueue(max_attempts=5, max_messages=max_messages, max_bytes=max_bytes)


def test_requests_are_numbered_in_call_order_and_their_deadlines_never_go_back() -> None:
    q = queue()
    a = add(q, deadline=10.0)
    b = add(q, deadline=9.0)  # a clock that went back: it waits for the one before it
    c = add(q, deadline=12.0)
    assert [r.request_id for r in (a, b, c)] == [1, 2, 3]
    assert [r.deadline for r in (a, b, c)] == [10.0, 10.0, 12.0]
    assert q.next_deadline() == 10.0 and len(q) == 3
    assert q.expired(9.9) == [] and q.expired(10.0) == [a, b]
    q.answered(a)
    q.remove(b)
    assert q.next_deadline() == 12.0 and len(q) == 1
    q.remove(c)
    assert q.next_deadline() is None


def test_each_request_goes_to_the_least_loaded_connection_counting_this_dispatch() -> None:
    q = queue()
    for _ in range(4):
        add(q)
    pool = FakePool(cap=3, c1=(("a", 1), 1, False), c2=(("b", 1), 0, False))
    steps = q.assign(0.0, ANY, pool)
    assert sent(steps) == [(1, 2), (2, 1), (3, 2), (4, 1)]
    assert all(isinstance(s, Request) and s.attempts == 1 for s in steps)
    assert not q.waiting and len(q) == 4  # sent, not yet answered


def test_with_every_connection_busy_the_first_request_holds_back_the_rest() -> None:
    q = queue()
    for _ in range(3):
        add(q)
    pool = FakePool(cap=1, c1=(("a", 1), 0, False))
    assert sent(q.assign(0.0, ANY, pool)) == [(1, 1)]
    assert [r.request_id for r in q.waiting] == [2, 3]
    pool.conns[1].load = 0  # answered
    assert sent(q.assign(0.0, ANY, pool)) == [(2, 1)]


def test_a_lost_request_is_retried_after_its_backoff_in_its_place_in_call_order() -> None:
    q = queue()
    first, second = add(q), add(q)
    pool = FakePool(cap=1, c1=(("a", 1), 0, False))
    assert sent(q.assign(0.0, ANY, pool)) == [(1, 1)]
    pool.conns[1].load = 0
    retry_at = q.retry(first, ConnectionClosedError("lost"), 1.0)
    assert retry_at is not None and retry_at == pytest.approx(
        1.0 + 0.008 + 0.010 * 2
    )  # go-nsq: 8 ms + 10 ms * 2^n
    assert [r.request_id for r in q.waiting] == [1, 2]
    # backing off: the first waits, the second may go (no order is promised across them)
    assert sent(q.assign(1.01, ANY, pool)) == [(2, 1)]
    pool.conns[1].load = 0
    assert sent(q.assign(retry_at, ANY, pool)) == [(1, 1)]
    assert first.attempts == 2 and second.attempts == 1


def test_a_refusal_is_not_retried_but_a_changed_topology_is() -> None:
    q = queue()
    req = add(q)
    q.assign(0.0, ANY, FakePool(c1=(("a", 1), 0, False)))
    assert q.retry(req, ServerError("E_BAD_TOPIC", "no", True), 0.1) is None
    assert q.retry(req, ServerError("E_FAILED_ON_NOT_LEADER", "moved", False), 0.1) is not None


def test_a_request_fails_once_its_attempts_are_spent_or_its_deadline_passed() -> None:
    q = queue(max_attempts=1)
    req = add(q, deadline=5.0)
    q.assign(0.0, ANY, FakePool(c1=(("a", 1), 0, False)))
    assert q.retry(req, ConnectionClosedError("lost"), 0.1) is None
    q = queue(max_attempts=3)
    req = add(q, deadline=5.0)
    q.assign(0.0, ANY, FakePool(c1=(("a", 1), 0, False)))
    assert q.retry(req, ConnectionClosedError("lost"), 5.0) is None
    assert not q.waiting


def test_an_ordered_partition_has_one_request_on_the_wire_until_it_is_answered() -> None:
    routes = Routes(lookupd=True, hasher=None)
    assert routes.apply("t", partitioned_result("n0", "n1", ordered=True)) == [
        ("n0", 4150),
        ("n1", 4150),
    ]
    q = queue()
    a = add(q, partition=0)
    add(q, partition=0)
    add(q, partition=1)
    pool = FakePool(cap=5, c1=(("n0", 4150), 0, True), c2=(("n1", 4150), 0, True))
    assert sent(q.assign(0.0, routes, pool)) == [(1, 1), (3, 2)]
    assert q.streams == {("t", 0): 1, ("t", 1): 3}
    assert sent(q.assign(0.0, routes, pool)) == []  # the second waits for the first
    q.answered(a)
    assert sent(q.assign(0.0, routes, pool)) == [(2, 1)]


def test_a_retry_of_an_ordered_partition_holds_back_the_requests_after_it() -> None:
    routes = Routes(lookupd=True, hasher=None)
    routes.apply("t", partitioned_result("n0", ordered=True))
    q = queue()
    a = add(q, partition=0)
    add(q, partition=0)
    pool = FakePool(cap=5, c1=(("n0", 4150), 0, True))
    q.assign(0.0, routes, pool)
    retry_at = q.retry(a, ConnectionClosedError("lost"), 1.0)
    assert retry_at is not None and q.streams == {}
    assert sent(q.assign(1.0, routes, pool)) == []
    assert sent(q.assign(retry_at, routes, pool)) == [(1, 1)]


def test_a_request_waits_for_its_route_and_a_leader_without_connections_is_opened() -> None:
    routes = Routes(lookupd=True, hasher=None)
    q = queue()
    add(q, partition=1)
    add(q, topic="other")
    pool = FakePool(c1=(("n0", 4150), 0, True))
    assert q.assign(0.0, routes, pool) == []  # no lookup answered yet
    routes.apply("t", partitioned_result("n0", "n1"))
    routes.apply("other", LookupResult())  # a standard server: any connection
    steps = q.assign(0.0, routes, pool)
    assert steps[0] == OpenPool(("n1", 4150))
    assert sent(steps) == [(2, 1)]  # the other topic's request is not held back
    assert [r.request_id for r in q.waiting] == [1]


def test_a_request_that_can_go_nowhere_is_refused() -> None:
    routes = Routes(lookupd=True, hasher=None)
    routes.apply("t", partitioned_result("n0", "n1"))
    q = queue()
    add(q, partition=7)
    add(q, kind=Kind.DPUB)
    (refused, dpub) = q.assign(0.0, routes, FakePool(c1=(("n0", 4150), 0, True)))
    assert isinstance(refused, Refuse) and "has 2 partitions (0..1): no partition 7" in str(
        refused.error
    )
    assert isinstance(dpub, Refuse) and isinstance(dpub.error, LocalProtocolError)
    assert "no DPUB" in str(dpub.error)


def test_a_sharding_key_picks_its_partition_with_the_hasher_and_others_go_round_robin() -> None:
    routes = Routes(lookupd=True, hasher=lambda key: len(key))
    routes.apply("t", partitioned_result("n0", "n1", "n2"))
    q = queue()
    keyed = [add(q, sharding_key=b"k" * n) for n in (1, 2, 4)]
    spread = [add(q) for _ in range(4)]
    pool = FakePool(
        cap=9,
        c1=(("n0", 4150), 0, True),
        c2=(("n1", 4150), 0, True),
        c3=(("n2", 4150), 0, True),
    )
    q.assign(0.0, routes, pool)
    # a sharding key promises call order: the third waits for the first, on partition 1
    assert [r.sent_partition for r in keyed] == [1, 2, None]
    assert [r.stream for r in keyed] == [("t", 1), ("t", 2), None]
    assert list(q.waiting) == [keyed[2]]
    assert [r.sent_partition for r in spread] == [0, 1, 2, 0]
    assert [r.stream for r in spread] == [None] * 4  # an unordered topic: no order promised


def test_a_sharding_key_without_a_partition_count_is_refused() -> None:
    routes = Routes(lookupd=True, hasher=None)
    routes.apply("t", partitioned_result("n0", num=0))
    q = queue()
    add(q, sharding_key=b"k")
    (refused,) = q.assign(0.0, routes, FakePool(c1=(("n0", 4150), 0, True)))
    assert isinstance(refused, Refuse) and "no partition count" in str(refused.error)


def test_a_removed_request_is_gone_from_the_queue_its_stream_and_the_books() -> None:
    routes = Routes(lookupd=True, hasher=None)
    routes.apply("t", partitioned_result("n0", ordered=True))
    q = queue()
    a = add(q, partition=0)
    b = add(q)
    q.assign(0.0, routes, FakePool(cap=1, c1=(("n0", 4150), 0, True)))
    assert q.streams == {("t", 0): 1} and list(q.waiting) == [b]
    q.remove(a)
    q.remove(b)
    assert q.streams == {} and not q.waiting and len(q) == 0


# ------------------------------------------------------------------------------ coalescing


def test_waiting_single_publishes_of_a_topic_go_as_one_mpub_in_call_order() -> None:
    q = coalescing()
    for topic in ("t", "t", "t", "other", "t"):
        add(q, topic=topic)
    pool = FakePool(cap=2, c1=(("a", 1), 0, False))
    steps = q.assign(0.0, ANY, pool)
    assert commands(steps) == [([1, 2, 3, 5], 1), ([4], 1)]
    assert pool.conns[1].load == 2  # one command each
    assert all(r.attempts == 1 for r in q.requests.values())
    assert not q.waiting


def test_a_lone_publish_goes_alone() -> None:
    q = coalescing()
    add(q)
    assert commands(q.assign(0.0, ANY, FakePool(c1=(("a", 1), 0, False)))) == [([1], 1)]


def test_only_plain_single_publishes_share_an_mpub() -> None:
    q = coalescing()
    add(q)  # 1
    add(q, kind=Kind.DPUB)  # 2: its own delay
    add(q, kind=Kind.MPUB)  # 3: the caller's own batch
    add(q, trace_ids=[7])  # 4: its trace receipt is its own
    add(q, ext=b'{"k":"v"}', ext_traced=True)  # 5: a receipt too
    add(q, ext=b'{"k":"v"}')  # 6: MPUB_EXT, with 8
    add(q)  # 7
    add(q, ext=b'{"k":"w"}')  # 8
    alone = add(q)  # 9: split from a refused MPUB
    alone.alone = True
    backing_off = add(q)  # 10
    backing_off.not_before = 1.0
    add(q)  # 11
    pool = FakePool(cap=20, c1=(("a", 1), 0, False))
    assert commands(q.assign(0.0, ANY, pool)) == [
        ([1, 7, 11], 1),
        ([2], 1),
        ([3], 1),
        ([4], 1),
        ([5], 1),
        ([6, 8], 1),
        ([9], 1),
    ]
    assert [r.request_id for r in q.waiting] == [10]


def test_a_coalesced_mpub_is_bounded_in_messages_and_bytes() -> None:
    q = coalescing(max_messages=3)
    for _ in range(7):
        add(q)
    pool = FakePool(cap=5, c1=(("a", 1), 0, False))
    assert commands(q.assign(0.0, ANY, pool)) == [([1, 2, 3], 1), ([4, 5, 6], 1), ([7], 1)]
    # the body: a count, then each message's length and bytes: 4 + 2 * (4 + 1) for two
    q = coalescing(max_bytes=4 + 2 * 5)
    for _ in range(5):
        add(q)
    assert commands(q.assign(0.0, ANY, FakePool(cap=5, c1=(("a", 1), 0, False)))) == [
        ([1, 2], 1),
        ([3, 4], 1),
        ([5], 1),
    ]
    q = coalescing(max_bytes=8)  # one message is over the bound: it goes alone, as a PUB
    add(q)
    add(q)
    assert commands(q.assign(0.0, ANY, FakePool(cap=5, c1=(("a", 1), 0, False)))) == [
        ([1], 1),
        ([2], 1),
    ]


def test_with_every_connection_busy_the_queue_waits_then_goes_at_once() -> None:
    q = coalescing()
    for _ in range(5):
        add(q)
    pool = FakePool(cap=1, c1=(("a", 1), 0, False))
    assert commands(q.assign(0.0, ANY, pool)) == [([1, 2, 3, 4, 5], 1)]
    for _ in range(3):
        add(q)
    assert commands(q.assign(0.0, ANY, pool)) == []  # no room: all wait
    pool.conns[1].load = 0
    assert commands(q.assign(0.0, ANY, pool)) == [([6, 7, 8], 1)]


def test_an_ordered_partition_coalesces_in_order_and_nothing_overtakes() -> None:
    routes = Routes(lookupd=True, hasher=None)
    routes.apply("t", partitioned_result("n0", "n1", ordered=True))
    q = coalescing()
    add(q, partition=0)  # 1
    add(q, partition=0)  # 2
    add(q, partition=1)  # 3: another partition: not with 1
    add(q, partition=0, trace_ids=[5])  # 4: cannot join
    add(q, partition=0)  # 5: must not overtake 4
    pool = FakePool(cap=5, c1=(("n0", 4150), 0, True), c2=(("n1", 4150), 0, True))
    steps = q.assign(0.0, routes, pool)
    assert commands(steps) == [([1, 2], 1), ([3], 2)]
    # the partition is held until the last of the MPUB's publishes is answered
    assert q.streams == {("t", 0): 2, ("t", 1): 3}
    first = q.requests[1]
    assert [r.stream for r in (first, q.requests[2])] == [("t", 0), ("t", 0)]
    q.answered(first)
    q.answered(q.requests[2])
    assert commands(q.assign(0.0, routes, pool)) == [([4], 1)]
    q.answered(q.requests[4])
    assert commands(q.assign(0.0, routes, pool)) == [([5], 1)]


def test_publishes_to_any_partition_join_the_first_ones_partition() -> None:
    routes = Routes(lookupd=True, hasher=None)
    routes.apply("t", partitioned_result("n0", "n1"))
    q = coalescing()
    for _ in range(3):
        add(q)
    add(q, partition=1)
    pool = FakePool(cap=5, c1=(("n0", 4150), 0, True), c2=(("n1", 4150), 0, True))
    steps = q.assign(0.0, routes, pool)
    assert commands(steps) == [([1, 2, 3], 1), ([4], 2)]
    assert {r.sent_partition for r in q.requests.values()} == {0, 1}
    assert [r.stream for r in q.requests.values()] == [None] * 4  # unordered topic


def test_a_split_mpub_sends_each_publish_alone_at_once_its_attempt_not_counted() -> None:
    q = coalescing()
    for _ in range(3):
        add(q)
    add(q)  # 4: after them in call order
    pool = FakePool(cap=1, c1=(("a", 1), 0, False))
    steps = q.assign(0.0, ANY, pool)
    (batch,) = steps
    assert isinstance(batch, Coalesced) and len(batch.requests) == 4
    assert q.split(batch.requests[:3], ServerError("E_BAD_MESSAGE", "MPUB bad", True)) == []
    assert [r.request_id for r in q.waiting] == [1, 2, 3]
    assert all(r.alone and r.attempts == 0 for r in batch.requests[:3])
    pool.conns[1].load = 0
    assert commands(q.assign(0.0, ANY, FakePool(cap=5, c1=(("a", 1), 0, False)))) == [
        ([1], 1),
        ([2], 1),
        ([3], 1),
    ]


@pytest.mark.parametrize(
    ("text", "over"),
    [
        ("MPUB message too big 11 > 10", [2, 4]),  # nsqd named its limit
        ("MPUB message too big 11 > 11", []),  # ...but no body is over it: each alone
        ("MPUB invalid message(1) body size 0", []),  # no limit named: each alone
    ],
)
def test_a_split_mpub_fails_the_bodies_over_the_limit_nsqd_named(
    text: str, over: list[int]
) -> None:
    q = coalescing()
    for body in (b"ok", b"x" * 11, b"ok", b"y" * 11, b"ok"):
        q.add("t", Kind.PUB, [body], 10.0)
    pool = FakePool(cap=1, c1=(("a", 1), 0, False))
    (batch,) = q.assign(0.0, ANY, pool)
    assert isinstance(batch, Coalesced) and len(batch.requests) == 5
    failed = q.split(batch.requests, ServerError("E_BAD_MESSAGE", text, True))
    assert [r.request_id for r in failed] == over
    rest = [r for r in batch.requests if r.request_id not in over]
    # the others wait again, their attempt not counted
    assert list(q.waiting) == rest and all(r.attempts == 0 for r in rest)
    again = commands(q.assign(0.0, ANY, FakePool(cap=5, c1=(("a", 1), 0, False))))
    if over:  # coalesced again: the bad bodies are not sent again
        assert again == [([1, 3, 5], 1)]
    else:  # nothing known of the bad one: each alone, so that it fails alone
        assert again == [([n], 1) for n in range(1, 6)]
