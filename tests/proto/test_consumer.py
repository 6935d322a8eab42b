from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsq_proto import (
    CloseWaitReceived,
    ConnectionClosed,
    LocalProtocolError,
    LookupdError,
    Message,
    MessageReceived,
    MessagesReceived,
    Ready,
    Send,
    StartTLS,
    Subscribed,
)
from nsq_proto import commands as cmd
from nsq_proto._config import ConfigError
from nsq_proto._consumer import REQUEUE_GRACE, Consumer, ConsumerConfig, parse_address
from nsq_proto._events import (
    BackoffChanged,
    LookupFailed,
    LookupSucceeded,
    MessageGivenUp,
    Stopped,
)
from nsq_proto._outputs import Close, Connect, HttpRequest
from nsq_proto._timers import TimerKind

from ..compiled import COMPILED
from .helpers import (
    consumer,
    error,
    http_response,
    identify_response,
    message,
    mid,
    of_type,
    response,
    sent_on,
    standard_lookup,
)


def sends(outputs: Iterable[object]) -> dict[int, bytes]:
    got: dict[int, bytes] = {}
    for o in outputs:
        if isinstance(o, Send):
            got[o.conn_id] = got.get(o.conn_id, b"") + o.data
    return got


def start(
    n: int = 2, now: float = 0.0, *, batches: bool = False, **config: Any
) -> tuple[Consumer, list[int]]:
    core = Consumer(
        "t",
        "c",
        ConsumerConfig(**config),
        nsqd_tcp_addresses=[f"10.0.0.{i}:4150" for i in range(n)],
        rng=random.Random(1),
        message_batches=batches,
    )
    core.start(now)
    conns = [o.conn_id for o in core.outputs() if isinstance(o, Connect)]
    assert len(conns) == n
    for c in conns:
        core.connection_made(c, now)
        core.receive_data(c, identify_response(), now)
        core.receive_data(c, response(b"OK"), now)
    core.outputs()
    return core, conns


def rdy_of(core: Consumer) -> dict[int, int]:
    return {s.conn_id: s.rdy for s in core.connections()}


def test_parse_address() -> None:
    assert parse_address("127.0.0.1:4150") == ("127.0.0.1", 4150)
    assert parse_address("[::1]:4150") == ("::1", 4150)
    for bad in ("nohost", ":4150", "h:0", "h:70000", "h:x"):
        with pytest.raises(ConfigError):
            parse_address(bad)


@pytest.mark.parametrize(
    "bad",
    [
        {"max_in_flight": -1},
        {"max_attempts": -1},
        {"lookupd_poll_jitter": 1.5},
        {"lookupd_poll_interval": 0},
        {"backoff_multiplier": float("nan")},
        {"heartbeat_interval": 0.5},
    ],
)
def test_invalid_config(bad: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        ConsumerConfig(**bad)  # type: ignore[arg-type]


def test_handshake_subscribes_with_initial_rdy_1() -> None:
    core = Consumer("t", "c", ConsumerConfig(max_in_flight=10), nsqd_tcp_addresses=["h:4150"])
    core.start(0.0)
    (connect,) = [o for o in core.outputs() if isinstance(o, Connect)]
    assert (connect.host, connect.port) == ("h", 4150)
    core.connection_made(connect.conn_id, 0.0)
    assert sends(core.outputs())[connect.conn_id].startswith(b"  V2IDENTIFY\n")
    core.receive_data(connect.conn_id, identify_response(), 0.0)
    assert sends(core.outputs())[connect.conn_id] == b"SUB t c\nRDY 1\n"
    core.receive_data(connect.conn_id, response(b"OK") + message(mid(1), b"a"), 0.0)
    out = core.outputs()
    (ev,) = [o for o in out if isinstance(o, MessageReceived)]
    # once the first message arrived the connection goes to its full share (go-nsq)
    assert sends(out)[connect.conn_id] == b"RDY 10\n"
    assert core.total_rdy == 10
    core.finish(ev.conn_id, ev.message.id, 0.1)
    assert sends(core.outputs())[connect.conn_id] == b"FIN " + mid(1) + b"\n"


def test_rdy_is_spread_and_never_exceeds_max_in_flight() -> None:
    core, conns = start(3, max_in_flight=10)
    assert sum(rdy_of(core).values()) <= 10
    for i, c in enumerate(conns):
        core.receive_data(c, message(mid(i), b"x"), 1.0)
    for o in core.outputs():
        if isinstance(o, MessageReceived):
            core.finish(o.conn_id, o.message.id, 1.0)
    assert rdy_of(core) == {c: 3 for c in conns}
    assert core.total_rdy == 9


def test_max_in_flight_below_connections_rotates() -> None:
    core, conns = start(3, max_in_flight=1, low_rdy_idle_timeout=10.0)
    rdy = rdy_of(core)
    assert sum(rdy.values()) == 1
    first = next(c for c, r in rdy.items() if r == 1)
    seen = {first}
    now = 0.0
    for _ in range(40):
        now += 5.0
        core.handle_timer(now)
        rdy = rdy_of(core)
        assert sum(rdy.values()) <= 1
        seen |= {c for c, r in rdy.items() if r == 1}
        # keep connections alive
        for c in conns:
            core.receive_data(c, response(b"_heartbeat_"), now)
        core.outputs()
    assert seen == set(conns)


def test_max_attempts_gives_up_and_finishes() -> None:
    core, (c,) = start(1, max_attempts=3)
    core.receive_data(c, message(mid(1), b"x", attempts=4), 0.0)
    out = core.outputs()
    (given_up,) = [o for o in out if isinstance(o, MessageGivenUp)]
    assert given_up.finished and given_up.message.attempts == 4
    assert not [o for o in out if isinstance(o, MessageReceived)]
    assert sends(out)[c] == b"FIN " + mid(1) + b"\n"
    assert core.messages_given_up == 1


def test_answering_twice_is_a_local_error() -> None:
    core, (c,) = start(1)
    core.receive_data(c, message(mid(1), b"x"), 0.0)
    core.outputs()
    assert core.finish(c, mid(1), 0.0)
    with pytest.raises(LocalProtocolError):
        core.finish(c, mid(1), 0.0)
    with pytest.raises(LocalProtocolError):
        core.requeue(c, mid(2), 0.0)


def test_requeue_delay_grows_with_attempts_up_to_the_cap() -> None:
    core, (c,) = start(1, default_requeue_delay=10.0, max_requeue_delay=25.0, backoff=False)
    core.receive_data(c, message(mid(1), b"x", attempts=1) + message(mid(2), b"y", attempts=2), 0.0)
    core.receive_data(c, message(mid(3), b"z", attempts=3), 0.0)
    core.outputs()
    core.requeue(c, mid(1), 0.0)
    core.requeue(c, mid(2), 0.0)
    core.requeue(c, mid(3), 0.0)
    data = sends(core.outputs())[c]
    assert b"REQ " + mid(1) + b" 10000\n" in data
    assert b"REQ " + mid(2) + b" 20000\n" in data
    assert b"REQ " + mid(3) + b" 25000\n" in data


def test_backoff_enters_tests_the_waters_and_recovers() -> None:
    core, conns = start(2, max_in_flight=4, backoff_multiplier=1.0)
    for i, c in enumerate(conns):
        core.receive_data(c, message(mid(i), b"x"), 0.0)
    msgs = [o for o in core.outputs() if isinstance(o, MessageReceived)]
    core.finish(msgs[0].conn_id, msgs[0].message.id, 0.0)
    core.outputs()
    core.requeue(msgs[1].conn_id, msgs[1].message.id, 0.0)
    out = core.outputs()
    assert BackoffChanged(1, 2.0) in out
    assert core.total_rdy == 0
    assert all(b"RDY 0\n" in d for d in sends(out).values() if b"RDY" in d)
    assert core.next_deadline() == 2.0
    core.handle_timer(2.0)
    rdy = rdy_of(core)
    assert sorted(rdy.values()) == [0, 1]
    tester = next(c for c, r in rdy.items() if r == 1)
    core.receive_data(tester, message(mid(9), b"x", attempts=2), 2.1)
    core.outputs()
    core.finish(tester, mid(9), 2.2)
    out = core.outputs()
    assert BackoffChanged(0, 0.0) in out
    assert sum(rdy_of(core).values()) == 4


def test_backoff_level_stops_where_the_next_window_would_pass_the_cap() -> None:
    # go-nsq: a failure raises the level only while multiplier * 2**(level + 1) fits under
    # max_backoff_duration; a consumer failing for days keeps windows of at most the cap and
    # its requeue() keeps working
    core, (c,) = start(1, max_in_flight=5, backoff_multiplier=1.0, max_backoff_duration=120.0)
    now, levels, windows = 0.0, [], []
    for i in range(1500):
        core.receive_data(c, message(mid(i), b"x", attempts=2), now)
        core.outputs()
        core.requeue(c, mid(i), now)
        out = core.outputs()
        levels += [e.level for e in out if isinstance(e, BackoffChanged)]
        windows += [e.duration for e in out if isinstance(e, BackoffChanged)]
        deadline = core.next_deadline()
        assert deadline is not None
        now = deadline
        core.handle_timer(now)
        core.outputs()
    assert max(levels) == 6 and levels[-1] == 6  # 64 s; level 7 would be 128 s > 120 s
    assert core.backoff_level == 6
    assert max(windows) == 64.0


def test_a_backoff_window_ending_with_a_redistribution_tests_the_waters_once() -> None:
    # the window ends at 5.0, when the periodic RDY redistribution is due too: one connection
    # gets RDY 1, not two (else two messages come in the window's test, above max_in_flight)
    core, _ = start(8, max_in_flight=4, backoff_multiplier=1.0, rdy_redistribute_interval=5.0)
    core.handle_timer(3.0)
    core.outputs()
    holder = next(c for c, r in rdy_of(core).items() if r == 1)
    core.receive_data(holder, message(mid(1), b"x"), 3.0)
    core.outputs()
    core.requeue(holder, mid(1), 3.0)
    assert BackoffChanged(1, 2.0) in core.outputs()
    assert core.next_deadline() == 5.0
    core.handle_timer(5.0)
    core.outputs()
    assert sorted(rdy_of(core).values()) == [0] * 7 + [1]
    assert core.total_rdy == 1


def test_results_during_a_backoff_window_are_ignored() -> None:
    core, (c,) = start(1, max_in_flight=5)
    core.receive_data(c, message(mid(1), b"x") + message(mid(2), b"y"), 0.0)
    core.outputs()
    core.requeue(c, mid(1), 0.0)
    core.requeue(c, mid(2), 0.5)  # inside the window: does not grow the level
    assert core.backoff_level == 1


def test_backoff_can_be_switched_off() -> None:
    core, (c,) = start(1, max_in_flight=5, backoff=False)
    core.receive_data(c, message(mid(1), b"x"), 0.0)
    core.outputs()
    core.requeue(c, mid(1), 0.0)
    assert core.backoff_level == 0
    assert core.total_rdy > 0


def test_lost_connection_reconnects_with_exponential_backoff() -> None:
    core, (c,) = start(1, reconnect_delay=8.0, reconnect_jitter=0.0)
    core.connection_lost(c, 1.0, OSError("reset"))
    out = core.outputs()
    assert any(isinstance(o, ConnectionClosed) for o in out)
    assert core.total_rdy == 0
    key = (TimerKind.RECONNECT, (("10.0.0.0", 4150), None))
    assert core._timers.deadline(key) == 9.0
    core.handle_timer(9.0)
    (connect,) = [o for o in core.outputs() if isinstance(o, Connect)]
    core.connection_lost(connect.conn_id, 9.5, OSError("refused"))
    core.outputs()
    assert core._timers.deadline(key) == 25.5


def test_fatal_error_closes_only_that_connection() -> None:
    core, conns = start(2, max_in_flight=2)
    core.receive_data(conns[0], error(b"E_INVALID cannot SUB in current state"), 0.0)
    out = core.outputs()
    assert Close in [type(o) for o in out]
    assert [s.conn_id for s in core.connections()] == [conns[1]]


def test_garbage_from_one_nsqd_does_not_break_the_others() -> None:
    core, conns = start(2, max_in_flight=2)
    core.receive_data(conns[0], b"\x00\x00\x00\x01garbage", 0.0)
    assert [s.conn_id for s in core.connections()] == [conns[1]]
    core.receive_data(conns[1], message(mid(1), b"x"), 0.0)
    assert any(isinstance(o, MessageReceived) for o in core.outputs())


def test_graceful_stop_waits_for_in_flight_then_closes() -> None:
    core, (c,) = start(1, max_in_flight=2)
    core.receive_data(c, message(mid(1), b"x"), 0.0)
    core.outputs()
    core.stop(1.0)
    assert sends(core.outputs())[c] == b"CLS\n"
    core.receive_data(c, response(b"CLOSE_WAIT"), 1.1)
    out = core.outputs()
    assert not any(isinstance(o, Close) for o in out)
    core.finish(c, mid(1), 1.2)
    out = core.outputs()
    assert sends(out)[c] == b"FIN " + mid(1) + b"\n"
    assert any(isinstance(o, Close) for o in out)
    assert any(isinstance(o, Stopped) for o in out)
    assert core.stopped


def test_graceful_stop_requeues_unanswered_messages_on_timeout() -> None:
    core, (c,) = start(1, max_in_flight=2, stop_timeout=5.0)
    core.receive_data(c, message(mid(1), b"x"), 0.0)
    core.outputs()
    core.stop(1.0)
    core.receive_data(c, response(b"CLOSE_WAIT"), 1.1)
    core.outputs()
    core.handle_timer(6.0)
    out = core.outputs()
    assert sends(out)[c] == b"REQ " + mid(1) + b" 0\n"
    assert any(isinstance(o, Stopped) for o in out)
    assert core.finish(c, mid(1), 7.0) is False


def test_is_starved() -> None:
    core, (c,) = start(1, max_in_flight=4)
    core.receive_data(c, message(mid(1), b"x"), 0.0)
    core.outputs()
    core.finish(c, mid(1), 0.0)
    core.outputs()
    assert not core.is_starved()
    core.receive_data(c, b"".join(message(mid(i), b"x") for i in range(2, 6)), 0.0)
    core.outputs()
    assert core.is_starved()


LOOKUP_BODY = (
    b'{"channels":["c"],"producers":[{"remote_address":"127.0.0.1:1","hostname":"h",'
    b'"broadcast_address":"n1","tcp_port":4150,"http_port":4151,"version":"1.3.0"},'
    b'{"remote_address":"127.0.0.1:2","hostname":"h","broadcast_address":"n2","tcp_port":4150,'
    b'"http_port":4151,"version":"1.3.0"}]}'
)


def test_lookupd_poll_connects_and_reconnects_only_when_listed_again() -> None:
    core = Consumer(
        "t",
        "c",
        ConsumerConfig(lookupd_poll_interval=60.0, lookupd_poll_jitter=0.3),
        lookupd_http_addresses=["l1:4161", "l2:4161"],
        rng=random.Random(3),
    )
    core.start(0.0)
    reqs = [o for o in core.outputs() if isinstance(o, HttpRequest)]
    assert [(r.host, r.port) for r in reqs] == [("l1", 4161), ("l2", 4161)]
    assert reqs[0].data.startswith(b"GET /lookup?topic=t&access=r&metainfo=true HTTP/1.1\r\n")
    core.http_data(reqs[0].request_id, http_response(LOOKUP_BODY), 0.1)
    core.http_data(reqs[1].request_id, http_response(LOOKUP_BODY), 0.1)
    connects = [o for o in core.outputs() if isinstance(o, Connect)]
    assert sorted((c.host, c.port) for c in connects) == [("n1", 4150), ("n2", 4150)]
    poll_at = core._timers.deadline((TimerKind.LOOKUPD_POLL, None))
    assert poll_at is not None and 60.0 <= poll_at <= 78.0
    # n1 dies: no reconnect until a poll lists it again
    core.connection_lost(connects[0].conn_id, 1.0, OSError("x"))
    core.outputs()
    assert (TimerKind.RECONNECT, (("n1", 4150), None)) not in core._timers
    core.handle_timer(poll_at)
    reqs = [o for o in core.outputs() if isinstance(o, HttpRequest)]
    core.http_data(reqs[0].request_id, http_response(LOOKUP_BODY), poll_at)
    assert [(c.host, c.port) for c in core.outputs() if isinstance(c, Connect)] == [("n1", 4150)]


def test_a_topic_lookupd_does_not_know_yet_is_asked_for_again_soon() -> None:
    """Started before its topic exists: lookupd answers TOPIC_NOT_FOUND, and the consumer
    asks again at 1 s, 2 s, 4 s... (not at the next 60 s poll) until an nsqd has it."""
    core = Consumer(
        "t",
        "c",
        ConsumerConfig(lookupd_poll_interval=60.0, lookupd_poll_jitter=0.0),
        lookupd_http_addresses=["l1:4161"],
    )
    core.start(0.0)
    now, asked_at = 0.0, []

    def next_request() -> HttpRequest:
        nonlocal now
        while not (reqs := [o for o in core.outputs() if isinstance(o, HttpRequest)]):
            deadline = core.next_deadline()
            assert deadline is not None
            now = deadline
            core.handle_timer(now)
        (req,) = reqs
        return req

    for _ in range(7):
        req = next_request()
        asked_at.append(now)
        core.http_data(
            req.request_id, http_response(b'{"message":"TOPIC_NOT_FOUND"}', b"404 Not Found"), now
        )
        (found,) = [o for o in core.outputs() if isinstance(o, LookupSucceeded)]
        assert found.producers == () and found.topic_found is False
    assert asked_at == [0.0, 1.0, 3.0, 7.0, 15.0, 31.0, 63.0]  # the poll interval at last
    # the topic appears: connected, and the regular interval again
    req = next_request()
    core.http_data(req.request_id, http_response(LOOKUP_BODY), now)
    out = core.outputs()
    assert len([o for o in out if isinstance(o, Connect)]) == 2
    assert [o.topic_found for o in out if isinstance(o, LookupSucceeded)] == [True]
    assert core._timers.deadline((TimerKind.LOOKUPD_POLL, None)) == now + 60.0


def test_hostile_lookupd_answer_is_a_failed_poll() -> None:
    core = Consumer("t", "c", lookupd_http_addresses=["l1:4161"])
    core.start(0.0)
    (req,) = [o for o in core.outputs() if isinstance(o, HttpRequest)]
    core.http_data(req.request_id, http_response(b'{"producers": [{"tcp_port": "x"}]}'), 0.0)
    (failed,) = [o for o in core.outputs() if isinstance(o, LookupFailed)]
    assert failed.address == ("l1", 4161)


def test_lookupd_timeout() -> None:
    core = Consumer(
        "t", "c", ConsumerConfig(lookupd_poll_timeout=2.0), lookupd_http_addresses=["l1:4161"]
    )
    core.start(0.0)
    core.outputs()
    core.handle_timer(2.0)
    assert any(isinstance(o, LookupFailed) for o in core.outputs())


PARTITIONED_BODY = (
    b'{"status_code":200,"status_txt":"OK","data":{"channels":[],"meta":{"partition_num":2,'
    b'"replica":1,"extend_support":false,"ordered":true,"multi_part":false,'
    b'"disable_channel_auto_create":false},"producers":[],"partitions":{'
    b'"0":{"id":"a","remote_address":"a","hostname":"h","broadcast_address":"n1","tcp_port":4150,'
    b'"http_port":4151,"version":"0.3.7-HA.1.13.0","distributed_id":""},'
    b'"1":{"id":"b","remote_address":"b","hostname":"h","broadcast_address":"n2","tcp_port":4150,'
    b'"http_port":4151,"version":"0.3.7-HA.1.13.0","distributed_id":""}}}}'
)


def test_partitioned_ordered_topic_subscribes_each_partition_with_sub_ordered() -> None:
    core = Consumer("t", "c", ConsumerConfig(max_in_flight=10), lookupd_http_addresses=["l:4161"])
    core.start(0.0)
    (req,) = [o for o in core.outputs() if isinstance(o, HttpRequest)]
    core.http_data(req.request_id, http_response(PARTITIONED_BODY), 0.0)
    connects = [o for o in core.outputs() if isinstance(o, Connect)]
    assert len(connects) == 2
    for c in connects:
        core.connection_made(c.conn_id, 0.0)
        core.receive_data(c.conn_id, identify_response(version="0.3.7-HA.1.13.0"), 0.0)
    data = sends(core.outputs())
    assert data[connects[0].conn_id].endswith(b"SUB_ORDERED t c 0\nRDY 1\n")
    assert data[connects[1].conn_id].endswith(b"SUB_ORDERED t c 1\nRDY 1\n")
    # ordered connections never go above RDY 1
    for c in connects:
        core.receive_data(c.conn_id, response(b"OK"), 0.0)
    assert max(rdy_of(core).values()) == 1


def test_fixed_nsqd_with_partitions_opens_one_ordered_connection_per_partition() -> None:
    core = Consumer(
        "t",
        "c",
        ConsumerConfig(ordered=True, partitions=(0, 3), max_in_flight=10),
        nsqd_tcp_addresses=["n1:4150"],
    )
    core.start(0.0)
    connects = [o for o in core.outputs() if isinstance(o, Connect)]
    assert [(c.host, c.port) for c in connects] == [("n1", 4150), ("n1", 4150)]
    data = {}
    for c in connects:
        core.connection_made(c.conn_id, 0.0)
        core.receive_data(c.conn_id, identify_response(version="0.3.7-HA.1.13.0"), 0.0)
        data.update(sends(core.outputs()))
    assert data[connects[0].conn_id].endswith(b"SUB_ORDERED t c 0\nRDY 1\n")
    assert data[connects[1].conn_id].endswith(b"SUB_ORDERED t c 3\nRDY 1\n")
    partitions = [s.partition for s in core.connections()]
    assert len(partitions) == 2 and set(partitions) == {0, 3}


def test_ordered_on_a_fixed_nsqd_list_needs_partitions() -> None:
    from nsq_proto import ConfigError

    with pytest.raises(ConfigError, match="partitions"):
        Consumer("t", "c", ConsumerConfig(ordered=True), nsqd_tcp_addresses=["n:4150"])
    # with partitions, or through lookupd (which names them), it is fine
    Consumer("t", "c", ConsumerConfig(ordered=True, partitions=(0,)), nsqd_tcp_addresses=["n:4150"])
    Consumer("t", "c", ConsumerConfig(ordered=True), lookupd_http_addresses=["l:4161"])


def test_finish_many_writes_each_connections_fins_together() -> None:
    core, (a, b) = start(2, max_in_flight=10)
    for i in range(3):
        core.receive_data(a, message(mid(i), b"x"), 0.0)
        core.receive_data(b, message(mid(10 + i), b"y"), 0.0)
    core.outputs()
    answers = [(a, mid(0), 1), (b, mid(10), 1), (a, mid(2), 1), (b, mid(12), 1)]
    assert core.finish_many(answers, 1.0) == 4
    out = core.outputs()
    # one write each, the FINs in the order given
    assert [o.conn_id for o in out if isinstance(o, Send)] == [a, b]
    assert sends(out) == {
        a: b"FIN " + mid(0) + b"\nFIN " + mid(2) + b"\n",
        b: b"FIN " + mid(10) + b"\nFIN " + mid(12) + b"\n",
    }
    assert core.messages_finished == 4
    assert [m.id for m in core.in_flight(a)] == [mid(1)]
    assert [m.id for m in core.in_flight(b)] == [mid(11)]


def test_touch_many_writes_each_connections_touches_together() -> None:
    core, (a, b) = start(2, max_in_flight=10)
    for i in range(3):
        core.receive_data(a, message(mid(i), b"x"), 0.0)
        core.receive_data(b, message(mid(10 + i), b"y"), 0.0)
    # mid(2) came again (nsqd timed out the first delivery): only the newer copy is touched
    core.receive_data(a, message(mid(2), b"x", attempts=2), 0.5)
    core.outputs()
    answers = [(a, mid(0), 1), (b, mid(10), 1), (a, mid(1), None), (b, mid(12), 1)]
    assert core.touch_many([*answers, (a, mid(2), 1)], 1.0) == 4
    out = core.outputs()
    # one write each, the TOUCHes in the order given; the messages stay in flight
    assert [o.conn_id for o in out if isinstance(o, Send)] == [a, b]
    assert sends(out) == {
        a: b"TOUCH " + mid(0) + b"\nTOUCH " + mid(1) + b"\n",
        b: b"TOUCH " + mid(10) + b"\nTOUCH " + mid(12) + b"\n",
    }
    assert len(core.in_flight(a)) == 3 and len(core.in_flight(b)) == 3
    assert core.touch_many([(a, mid(2), 2)], 1.5) == 1
    assert sends(core.outputs()) == {a: b"TOUCH " + mid(2) + b"\n"}


def test_touch_many_skips_lost_connections_and_reports_what_is_not_in_flight() -> None:
    core, (a, b) = start(2, max_in_flight=10)
    core.receive_data(a, message(mid(1), b"x"), 0.0)
    core.receive_data(b, message(mid(2), b"y"), 0.0)
    core.outputs()
    core.connection_lost(b, 0.5)
    core.outputs()
    with pytest.raises(LocalProtocolError, match="not in flight"):
        core.touch_many([(a, mid(9), None), (b, mid(2), None), (a, mid(1), None)], 1.0)
    assert sends(core.outputs()) == {a: b"TOUCH " + mid(1) + b"\n"}
    assert core.touch_many([], 1.0) == 0
    assert sends(core.outputs()) == {}


def test_finish_many_skips_lost_connections_and_reports_what_is_not_in_flight() -> None:
    core, (a, b) = start(2, max_in_flight=10)
    core.receive_data(a, message(mid(1), b"x"), 0.0)
    core.receive_data(b, message(mid(2), b"y"), 0.0)
    core.outputs()
    core.connection_lost(b, 0.5)
    core.outputs()
    with pytest.raises(LocalProtocolError, match="not in flight"):
        # mid(9) was never delivered: the others are finished all the same
        core.finish_many([(a, mid(9), None), (b, mid(2), None), (a, mid(1), None)], 1.0)
    assert sends(core.outputs()) == {a: b"FIN " + mid(1) + b"\n"}
    assert core.messages_finished == 1
    assert core.finish_many([], 1.0) == 0


def test_set_max_in_flight_refuses_what_is_not_a_count() -> None:
    core, _ = consumer(max_in_flight=4)
    # the compiled core's signature takes True as 1 and refuses 2.5 itself (WRONG_TYPE)
    for bad in (-1,) if COMPILED else (-1, True, 2.5):
        with pytest.raises(ConfigError, match="max_in_flight must be an int >= 0"):
            core.set_max_in_flight(bad, 1.0)  # type: ignore[arg-type]
    assert core.max_in_flight == 4


def test_touch_resets_the_timeout_of_the_newest_delivery_only() -> None:
    core, (c,) = consumer(max_in_flight=4)
    core.receive_data(c, message(mid(1), b"x", attempts=1), 0.0)
    core.outputs()
    assert core.touch(c, mid(1), 1.0) is True
    assert sent_on(core.outputs(), c) == b"TOUCH " + mid(1) + b"\n"
    core.receive_data(c, message(mid(1), b"x", attempts=2), 2.0)  # delivered again
    core.outputs()
    assert core.touch(c, mid(1), 3.0, attempts=1) is True  # the older copy: nothing sent
    assert sent_on(core.outputs(), c) == b""
    assert core.touch(c, mid(1), 3.0, attempts=2) is True
    assert sent_on(core.outputs(), c) == b"TOUCH " + mid(1) + b"\n"
    with pytest.raises(LocalProtocolError, match=r"message b'0+9' is not in flight on connection"):
        core.touch(c, mid(9), 3.0)
    assert core.touch(99, mid(1), 3.0) is False  # a connection that is gone


def test_touch_many_writes_once_per_connection_and_skips_older_copies() -> None:
    core, (c1, c2) = consumer(2, max_in_flight=8)
    core.receive_data(c1, message(mid(1), b"a") + message(mid(2), b"b", attempts=3), 0.0)
    core.receive_data(c2, message(mid(3), b"c"), 0.0)
    core.outputs()
    sent = core.touch_many(
        [(c1, mid(1), None), (c2, mid(3), 1), (c1, mid(2), 2), (77, mid(4), None)], 1.0
    )
    assert sent == 2  # mid(2)'s attempts name an older copy; connection 77 is gone
    writes = of_type(core.outputs(), Send)
    assert [(w.conn_id, w.data) for w in writes] == [
        (c1, b"TOUCH " + mid(1) + b"\n"),
        (c2, b"TOUCH " + mid(3) + b"\n"),
    ]
    with pytest.raises(LocalProtocolError, match="is not in flight"):
        core.touch_many([(c1, mid(9), None), (c1, mid(1), None)], 2.0)
    # the messages that were in flight were still touched, in one write
    assert sent_on(core.outputs(), c1) == b"TOUCH " + mid(1) + b"\n"


def test_stop_requeue_unanswered_gives_everything_back_and_closes_on_close_wait() -> None:
    core, (c1, c2) = consumer(2, max_in_flight=8, stop_timeout=30.0)
    core.receive_data(c1, message(mid(1), b"a") + message(mid(2), b"b"), 0.0)
    core.receive_data(c2, message(mid(3), b"c"), 0.0)
    assert len(of_type(core.outputs(), MessageReceived)) == 3
    core.stop(1.0, requeue_unanswered=True)
    out = core.outputs()
    assert sent_on(out, c1) == b"CLS\nREQ " + mid(1) + b" 0\nREQ " + mid(2) + b" 0\n"
    assert sent_on(out, c2) == b"CLS\nREQ " + mid(3) + b" 0\n"
    assert of_type(out, Close) == []  # nsqd may have sent more before it read the CLS
    assert core.messages_requeued == 3 and not core.stopped
    # what nsqd sent before it read the CLS goes back at once, never to the application,
    # even a message it wrote right after its CLOSE_WAIT (taken before it read the CLS)
    core.receive_data(
        c1, message(mid(4), b"d") + response(b"CLOSE_WAIT") + message(mid(5), b"e"), 1.1
    )
    out = core.outputs()
    assert of_type(out, MessageReceived) == []
    assert sent_on(out, c1) == b"REQ " + mid(4) + b" 0\nREQ " + mid(5) + b" 0\n"
    assert [(o.conn_id, o.reason) for o in of_type(out, Close)] == [(c1, "consumer stopped")]
    assert core.messages_received == 5 and core.messages_requeued == 5
    # c2's nsqd never confirms: closed once no connection sent a byte for the grace (c1's
    # last came at 1.1), not after stop_timeout
    assert core.next_deadline() == pytest.approx(1.1 + REQUEUE_GRACE)
    core.handle_timer(1.1 + REQUEUE_GRACE)
    out = core.outputs()
    assert [o.conn_id for o in of_type(out, Close)] == [c2]
    assert of_type(out, Stopped) == [Stopped()]
    assert core.stopped and core.connections() == [] and core.next_deadline() is None
    # the application's late answer finds the connection gone: nsqd redelivers anyway
    assert core.finish(c1, mid(1), 2.0) is False


def test_a_second_stop_can_requeue_what_the_first_left_waiting() -> None:
    core, (c,) = consumer(max_in_flight=2)
    core.receive_data(c, message(mid(1), b"a"), 0.0)
    core.outputs()
    core.stop(1.0)
    assert sent_on(core.outputs(), c) == b"CLS\n"
    core.receive_data(c, response(b"CLOSE_WAIT"), 1.1)
    assert of_type(core.outputs(), CloseWaitReceived) == [CloseWaitReceived(c)]
    assert core.stopping and not core.stopped  # waiting for the application's answer
    core.stop(2.0)  # again: nothing changes
    assert core.outputs() == []
    core.stop(3.0, requeue_unanswered=True)
    out = core.outputs()
    assert sent_on(out, c) == b"REQ " + mid(1) + b" 0\n"
    assert of_type(out, Close) == [Close(c, "consumer stopped")]  # CLOSE_WAIT came before
    assert of_type(out, Stopped) == [Stopped()]


def test_stop_closes_connections_still_in_their_handshake() -> None:
    core = Consumer("t", "c", nsqd_tcp_addresses=["h1:4150", "h2:4150"])
    core.start(0.0)
    c1, c2 = (o.conn_id for o in of_type(core.outputs(), Connect))
    core.connection_made(c1, 0.0)  # IDENTIFY sent, no answer yet; c2 is not even connected
    core.outputs()
    core.stop(1.0)
    out = core.outputs()
    assert [(o.conn_id, o.reason) for o in of_type(out, Close)] == [
        (c1, "consumer stopping"),
        (c2, "consumer stopping"),
    ]
    assert of_type(out, Stopped) == [Stopped()]
    assert not of_type(out, Send)  # no CLS: neither was subscribed


def test_stop_fails_lookupd_requests_in_flight() -> None:
    core = Consumer("t", "c", lookupd_http_addresses=["l1:4161"])
    core.start(0.0)
    (request,) = of_type(core.outputs(), HttpRequest)
    core.stop(1.0)
    out = core.outputs()
    (failed,) = of_type(out, LookupFailed)
    assert failed.address == ("l1", 4161)
    assert isinstance(failed.error, LookupdError) and str(failed.error) == "consumer stopping"
    assert of_type(out, Stopped) == [Stopped()]
    core.http_data(request.request_id, b"HTTP/1.1 200 OK\r\n", 2.0)  # too late: ignored
    assert core.outputs() == []


def test_close_connection_closes_that_one_and_reconnects_later() -> None:
    core, (c1, c2) = consumer(2, max_in_flight=2, reconnect_delay=8.0, reconnect_jitter=0.0)
    core.receive_data(c1, message(mid(1), b"a"), 0.0)
    core.outputs()
    assert [m.id for m in core.in_flight(c1)] == [mid(1)]
    assert (core.in_flight_count(c1), core.in_flight_count(c2)) == (1, 0)
    core.finish(c1, mid(1), 0.5)
    assert core.in_flight_count(c1) == 0
    core.close_connection(c1, 0.5, "rotating")
    out = core.outputs()
    assert sent_on(out, c1).startswith(b"FIN " + mid(1) + b"\n")  # answered before the close
    assert of_type(out, Close) == [Close(c1, "rotating")]
    assert of_type(out, ConnectionClosed) == [ConnectionClosed(c1, "rotating", None)]
    assert core.connection_stats(c1) is None and core.connection(c1) is None
    assert core.in_flight(c1) == () and core.in_flight_count(c1) == 0
    stats = core.connection_stats(c2)
    assert stats is not None and stats.state == "SUBSCRIBED" and stats.address == ("10.0.0.1", 4150)
    assert core.connection(c2) is not None
    core.close_connection(12345, 0.6)  # unknown: nothing happens
    assert core.outputs() == []
    core.handle_timer(8.4)  # reconnect_delay after the close
    assert not of_type(core.outputs(), Connect)
    core.handle_timer(8.5)
    (again,) = of_type(core.outputs(), Connect)
    assert (again.host, again.port) == ("10.0.0.0", 4150) and again.conn_id not in (c1, c2)


def test_a_consumer_upgrades_to_tls_when_asked() -> None:
    core = Consumer("t", "c", ConsumerConfig(tls_v1=True), nsqd_tcp_addresses=["h:4150"])
    core.start(0.0)
    (connect,) = of_type(core.outputs(), Connect)
    c = connect.conn_id
    core.connection_made(c, 0.0)
    core.receive_data(c, identify_response(tls_v1=True), 0.1)
    assert of_type(core.outputs(), StartTLS) == [StartTLS(c, b"")]
    core.tls_established(c, 0.2)
    core.receive_data(c, response(b"OK"), 0.3)  # nsqd's OK, inside TLS
    out = core.outputs()
    assert of_type(out, Ready) and sent_on(out, c) == cmd.sub("t", "c") + cmd.rdy(1)
    core.receive_data(c, response(b"OK"), 0.4)
    assert of_type(core.outputs(), Subscribed) == [Subscribed(c)]


def test_transport_events_for_unknown_connections_are_ignored() -> None:
    core, (c,) = consumer()
    calls: list[Callable[[], object]] = [
        lambda: core.connection_made(99, 1.0),
        lambda: core.tls_established(99, 1.0),
        lambda: core.receive_data(99, response(b"OK"), 1.0),
        lambda: core.connection_lost(99, 1.0, OSError("gone")),
        lambda: core.http_data(99, b"", 1.0),
        lambda: core.http_failed(99, OSError("gone"), 1.0),
    ]
    for call in calls:
        call()
        assert core.outputs() == []
    assert [s.conn_id for s in core.connections()] == [c]


def test_http_failed_is_a_failed_lookup_and_the_poll_goes_on() -> None:
    core = Consumer(
        "t",
        "c",
        ConsumerConfig(lookupd_poll_interval=10.0, lookupd_poll_jitter=0.0),
        lookupd_http_addresses=["l1:4161"],
    )
    core.start(0.0)
    (request,) = of_type(core.outputs(), HttpRequest)
    refused = ConnectionRefusedError(111, "refused")
    core.http_failed(request.request_id, refused, 0.5)
    (failed,) = of_type(core.outputs(), LookupFailed)
    assert failed.address == ("l1", 4161)
    assert isinstance(failed.error, LookupdError)
    assert str(failed.error) == "lookupd request failed: [Errno 111] refused"
    assert failed.error.__cause__ is refused
    core.http_failed(request.request_id, refused, 0.6)  # already failed: nothing more
    assert core.outputs() == []
    core.handle_timer(10.0)
    (again,) = of_type(core.outputs(), HttpRequest)
    assert again.request_id != request.request_id and again.host == "l1"


def test_a_lost_nsqd_is_looked_up_again_soon_until_it_is_back() -> None:
    core = Consumer(
        "t",
        "c",
        ConsumerConfig(lookupd_recheck_delay=1.0, lookupd_poll_jitter=0.0),
        lookupd_http_addresses=["l:4161"],
    )
    core.start(0.0)
    (lookup,) = of_type(core.outputs(), HttpRequest)
    core.http_data(lookup.request_id, http_response(standard_lookup("n1")), 0.1)
    (connect,) = of_type(core.outputs(), Connect)
    core.connection_lost(connect.conn_id, 0.5, OSError("reset"))
    assert of_type(core.outputs(), ConnectionClosed)
    core.handle_timer(1.4)
    assert core.outputs() == []
    core.handle_timer(1.5)  # lookupd_recheck_delay after the loss
    (recheck,) = of_type(core.outputs(), HttpRequest)
    core.http_data(recheck.request_id, http_response(standard_lookup()), 1.6)  # not listed
    assert not of_type(core.outputs(), Connect)
    core.handle_timer(3.4)
    assert core.outputs() == []
    core.handle_timer(3.5)  # twice the delay: it stays away, lookupd is asked less often
    (recheck,) = of_type(core.outputs(), HttpRequest)
    core.http_data(recheck.request_id, http_response(standard_lookup("n1")), 3.6)
    (back,) = of_type(core.outputs(), Connect)
    assert (back.host, back.port) == ("n1", 4150)
    core.handle_timer(59.9)  # back: no more rechecks before the regular poll
    assert not of_type(core.outputs(), HttpRequest)
    core.handle_timer(60.0)
    assert of_type(core.outputs(), HttpRequest)


def test_close_connection_takes_now_for_the_reconnect() -> None:
    core = Consumer(
        "t",
        "c",
        ConsumerConfig(reconnect_delay=8.0, reconnect_jitter=0.0),
        nsqd_tcp_addresses=["n:4150"],
    )
    core.start(100.0)
    (connect,) = [o for o in core.outputs() if isinstance(o, Connect)]
    core.connection_made(connect.conn_id, 100.0)
    core.close_connection(connect.conn_id, 200.0)
    core.outputs()
    assert core._timers.deadline((TimerKind.RECONNECT, (("n", 4150), None))) == 208.0


# ---------------------------------------------------------------- message_batches


def test_with_message_batches_the_messages_of_a_read_are_one_event_in_order() -> None:
    core, (c,) = start(1, batches=True, max_in_flight=10)
    core.receive_data(c, b"".join(message(mid(i), b"x%d" % i) for i in range(3)), 0.0)
    (batch,) = [o for o in core.outputs() if not isinstance(o, Send)]
    assert isinstance(batch, MessagesReceived) and batch.conn_id == c
    assert [m.id for m in batch.messages] == [mid(0), mid(1), mid(2)]
    assert [m.body for m in batch.messages] == [b"x0", b"x1", b"x2"]
    assert core.in_flight_count(c) == 3
    # a frame cut by the read: its message comes with the next read's
    whole = message(mid(3), b"x3") + message(mid(4), b"x4")
    core.receive_data(c, whole[:30], 0.0)
    assert not of_type(core.outputs(), MessagesReceived)
    core.receive_data(c, whole[30:], 0.0)
    (batch,) = of_type(core.outputs(), MessagesReceived)
    assert [m.id for m in batch.messages] == [mid(3), mid(4)]


def test_a_given_up_message_keeps_its_place_between_the_batches() -> None:
    core, (c,) = start(1, batches=True, max_in_flight=10, max_attempts=3)
    read = message(mid(1), b"a") + message(mid(2), b"b", attempts=4) + message(mid(3), b"c")
    core.receive_data(c, read, 0.0)
    told = []
    for o in core.outputs():
        if isinstance(o, MessagesReceived):
            told.append(("got", [m.id for m in o.messages]))
        elif isinstance(o, MessageGivenUp):
            told.append(("gave up", [o.message.id]))
        else:
            assert isinstance(o, Send)
    assert told == [("got", [mid(1)]), ("gave up", [mid(2)]), ("got", [mid(3)])]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 11), st.integers(1, 5)), min_size=1, max_size=40),
    st.lists(st.integers(1, 400), max_size=12),
    st.integers(1, 20),
)
def test_message_batches_change_only_how_the_messages_are_told(
    deliveries: list[tuple[int, int]], cuts: list[int], max_in_flight: int
) -> None:
    """Whatever the messages (repeated ids, given-up attempts) and however the reads cut
    them, the batches hold the same messages in the same order as the events one by one,
    and the bytes sent (RDY, FINs of given-up messages, then each message's FIN) are the
    same."""
    stream = b"".join(message(mid(i), b"m%d" % i, attempts=a) for i, a in deliveries)
    runs = []
    for batches in (False, True):
        core, (c,) = start(1, batches=batches, max_in_flight=max_in_flight, max_attempts=3)
        told: list[tuple[str, bytes, int]] = []
        wire = b""
        pos = 0
        for cut in [*sorted(set(cuts)), len(stream)]:
            if cut <= pos:
                continue
            core.receive_data(c, stream[pos:cut], 1.0)
            pos = cut
            for o in core.outputs():
                if isinstance(o, MessageReceived):
                    told.append(("got", o.message.id, o.message.attempts))
                elif isinstance(o, MessagesReceived):
                    assert batches and o.messages
                    told += [("got", m.id, m.attempts) for m in o.messages]
                elif isinstance(o, MessageGivenUp):
                    told.append(("gave up", o.message.id, o.message.attempts))
                elif isinstance(o, Send):
                    wire += o.data
        for _, msg_id, attempts in [t for t in told if t[0] == "got"]:
            try:  # a repeated id is held once: its second FIN is refused
                core.finish(c, msg_id, 2.0, attempts=attempts)
            except LocalProtocolError:
                told.append(("refused", msg_id, attempts))
        wire += sends(core.outputs()).get(c, b"")
        runs.append((told, wire, core.messages_received, core.in_flight_count(c)))
    assert runs[0] == runs[1]


def test_finish_left_tells_what_the_application_still_holds_of_the_connection() -> None:
    core, (c, other) = start(2, max_in_flight=10)
    core.receive_data(c, message(mid(1), b"a") + message(mid(2), b"b"), 0.0)
    core.receive_data(other, message(mid(3), b"c"), 0.0)
    core.outputs()
    assert core.finish_left(c, mid(1), 1.0) == 1  # mid(2) is still held; other's not counted
    assert core.finish_left(c, mid(2), 1.0) == 0
    assert sends(core.outputs())[c] == b"FIN " + mid(1) + b"\nFIN " + mid(2) + b"\n"
    # a copy delivered again (its msg_timeout passed) is the slower path: counted the same
    core.receive_data(other, message(mid(4), b"d") + message(mid(3), b"c", attempts=2), 2.0)
    core.outputs()
    # the application holds both deliveries of mid(3): each is answered
    assert core.finish_left(other, mid(3), 3.0, attempts=2) == 2
    assert core.finish_left(other, mid(3), 3.0, attempts=1) == 1
    with pytest.raises(LocalProtocolError):
        core.finish_left(other, mid(3), 3.0)  # both answered
    core.connection_lost(other, 4.0, None)
    assert core.finish_left(other, mid(4), 4.0) == -1  # gone: nsqd delivers it again
    assert core.finish(other, mid(4), 4.0) is False


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 2), st.integers(0, 7), st.integers(1, 3)), max_size=30),
    st.data(),
    st.booleans(),
)
def test_finish_many_is_each_finish_in_turn_with_one_write_per_connection(
    deliveries: list[tuple[int, int, int]], data: st.DataObject, lose_one: bool
) -> None:
    """Whatever was delivered (ids delivered again, so held twice) and however the answers
    mix connections, name attempts or not, repeat a FIN, name what is not held or come for a
    connection that is gone: ``finish_many`` leaves the books, the counters and the bytes of
    every connection as ``finish`` called on each answer in turn, and raises if one of those
    raised."""
    answers = data.draw(
        st.lists(
            st.tuples(
                st.integers(0, 2), st.integers(0, 8), st.one_of(st.none(), st.integers(1, 3))
            ),
            max_size=30,
        )
    )
    answers = data.draw(st.permutations([(c, i, a) for c, i, a in deliveries] + answers))
    runs = []
    for many in (False, True):
        core, conns = start(3, max_in_flight=30)
        for c, i, a in deliveries:
            core.receive_data(conns[c], message(mid(i), b"m", attempts=a), 0.5)
        if lose_one:
            core.connection_lost(conns[2], 0.7)
        core.outputs()
        given = [(conns[c], mid(i), a) for c, i, a in answers]
        failed = False
        if many:
            try:
                core.finish_many(given, 1.0)
            except LocalProtocolError:
                failed = True
        else:
            for conn_id, msg_id, attempts in given:
                try:
                    core.finish(conn_id, msg_id, 1.0, attempts=attempts)
                except LocalProtocolError:
                    failed = True
        held = [[(m.id, m.attempts) for m in core.in_flight(c)] for c in conns]
        wire = sends(core.outputs())
        runs.append((failed, wire, held, core.messages_finished, rdy_of(core)))
    assert runs[0] == runs[1]


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 2), st.integers(0, 7), st.integers(1, 3)), max_size=30),
    st.data(),
    st.booleans(),
    st.booleans(),
)
def test_finish_messages_is_finish_many_of_their_answers(
    deliveries: list[tuple[int, int, int]], data: st.DataObject, lose_one: bool, failure: bool
) -> None:
    """The message objects a connection delivered, answered through ``finish_messages`` (in
    any order, some twice, some of another connection or never delivered, on a connection
    that is gone, delivered again while held, in backoff or not): the books, the counters,
    the backoff, the bytes and the error are those of ``finish_many`` of the same answers as
    ``(conn_id, msg_id, attempts)``, one connection after the other."""
    picks = data.draw(st.lists(st.integers(0, 40), max_size=40), label="answers")
    runs = []
    for objects in (False, True):
        core, conns = start(3, batches=True, max_in_flight=30)
        got: list[tuple[int, Message]] = []
        for c, i, a in deliveries:
            core.receive_data(conns[c], message(mid(i), b"m", attempts=a), 0.5)
            for o in core.outputs():
                if isinstance(o, MessagesReceived):
                    got += [(o.conn_id, m) for m in o.messages]
        if lose_one:
            core.connection_lost(conns[2], 0.7)
        assert len(got) == len(deliveries)
        if got and failure:  # in backoff (its window over): the answers that count are successes
            core.requeue(got[0][0], got[0][1].id, 0.8, backoff=True)
            core.handle_timer(5.0)
        core.outputs()
        strangers = [
            (conns[0], Message(mid(9), 0, 1, b"s")),  # never delivered
            (conns[1], Message(mid(1), 0, 3, b"s")),  # another object of an id it may hold
        ]
        pool = got + strangers
        answers = [pool[k % len(pool)] for k in picks]
        order = list(dict.fromkeys(c for c, _ in answers))
        failed = False
        for conn_id in order:
            mine = [m for c, m in answers if c == conn_id]
            try:
                if objects:
                    core.finish_messages(conn_id, mine, 5.0)
                else:
                    core.finish_many([(conn_id, m.id, m.attempts) for m in mine], 5.0)
            except LocalProtocolError:
                failed = True
        held = [[(m.id, m.attempts) for m in core.in_flight(c)] for c in conns]
        wire = sends(core.outputs())
        state = (core.messages_finished, core.backoff_level, rdy_of(core), core.next_deadline())
        runs.append((failed, wire, held, state))
    assert runs[0] == runs[1]


def test_finish_messages_takes_an_equal_message_as_the_delivery_finish_many_would() -> None:
    """Another object with a held id and attempts (an application's copy of the message) is
    answered as the delivery itself: FINished, and a success that ends a backoff's test of the
    waters, as ``finish_many`` of its ``(conn_id, msg_id, attempts)`` does."""
    runs = []
    for objects in (False, True):
        core, (c,) = start(1, batches=True, max_in_flight=5)
        core.receive_data(c, message(mid(1), b"a") + message(mid(2), b"b"), 0.0)
        core.outputs()
        core.requeue(c, mid(1), 0.5, backoff=True)
        core.handle_timer(5.0)  # the window over: RDY 1 tests the waters
        core.outputs()
        copy = Message(mid(2), 0, 1, b"b")
        if objects:
            assert core.finish_messages(c, [copy], 6.0) == 1
        else:
            assert core.finish_many([(c, mid(2), 1)], 6.0) == 1
        runs.append((sends(core.outputs()), core.backoff_level, rdy_of(core), core.in_flight(c)))
    assert runs[0] == runs[1]
    assert runs[1][1] == 0  # the success ended the backoff


class _AppMessage(Message):
    __slots__ = ()


def test_the_consumers_connections_build_the_message_class_given() -> None:
    core = Consumer(
        "t",
        "c",
        nsqd_tcp_addresses=["10.0.0.1:4150"],
        rng=random.Random(7),
        message_batches=True,
        message_class=_AppMessage,
    )
    core.start(0.0)
    (conn,) = [o.conn_id for o in core.outputs() if isinstance(o, Connect)]
    core.connection_made(conn, 0.0)
    core.receive_data(conn, identify_response(), 0.0)
    core.receive_data(conn, response(b"OK"), 0.0)
    core.outputs()
    core.receive_data(conn, message(mid(1), b"a") + message(mid(2), b"b"), 0.0)
    (event,) = of_type(core.outputs(), MessagesReceived)
    assert [(type(m), m.body) for m in event.messages] == [(_AppMessage, b"a"), (_AppMessage, b"b")]
    core.finish(conn, mid(1), 0.0)
    assert core.in_flight_count(conn) == 1
