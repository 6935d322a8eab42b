from __future__ import annotations

import random
from collections.abc import Iterable
from typing import Any

import pytest

from nsq_emulator.frames import encode_trace_receipt
from nsq_proto import (
    Close,
    ConnectionClosed,
    ConnectionClosedError,
    InvalidName,
    LocalProtocolError,
    LookupdError,
    LookupFailed,
    PublishFailed,
    PublishSucceeded,
    Send,
    ServerError,
    TraceReceipt,
)
from nsq_proto import commands as cmd
from nsq_proto._outputs import Connect, HttpRequest
from nsq_proto._partitioned import partition_for_key
from nsq_proto._producer import Producer, ProducerConfig, ProducerConnectionInfo, PublishTimeout
from nsq_proto._timers import TimerKind

from ..compiled import COMPILED, WRONG_TYPE
from .helpers import (
    error,
    http_response,
    identify_response,
    of_type,
    producer,
    response,
    sent_on,
)


def sends(outputs: Iterable[object]) -> dict[int, bytes]:
    got: dict[int, bytes] = {}
    for o in outputs:
        if isinstance(o, Send):
            got[o.conn_id] = got.get(o.conn_id, b"") + o.data
    return got


def started(
    addresses: list[str], version: str = "1.3.0", **config: Any
) -> tuple[Producer, dict[str, int]]:
    core = Producer(ProducerConfig(**config), nsqd_tcp_addresses=addresses, rng=random.Random(0))
    core.start(0.0)
    ids: dict[str, int] = {}
    for o in core.outputs():
        assert isinstance(o, Connect)
        ids[f"{o.host}:{o.port}"] = o.conn_id
        core.connection_made(o.conn_id, 0.0)
        core.receive_data(o.conn_id, identify_response(version=version), 0.0)
    core.outputs()
    return core, ids


def test_publish_round_trip_and_request_ids() -> None:
    core, ids = started(["n1:4150"])
    (c,) = ids.values()
    r1 = core.publish("t", b"hello", 0.0)
    r2 = core.publish_many("t", [b"m1", b"m2", b"m3"], 0.0)
    r3 = core.publish("t", b"deferred", 0.0, delay=1.0)
    # the first goes at once on the idle connection; the others at the flush, due now
    assert sends(core.outputs())[c] == cmd.pub("t", b"hello")
    assert core.next_deadline() == 0.0
    core.handle_timer(0.0)
    assert sends(core.outputs())[c] == (
        cmd.mpub("t", [b"m1", b"m2", b"m3"]) + cmd.dpub("t", 1000, b"deferred")
    )
    core.receive_data(c, response(b"OK") * 3, 0.1)
    out = [o for o in core.outputs() if isinstance(o, PublishSucceeded)]
    assert [o.request_id for o in out] == [r1, r2, r3]
    assert core.pending == 0


def test_validation_happens_at_the_call() -> None:
    core, _ = started(["n1:4150"])
    with pytest.raises(InvalidName):
        core.publish("bad!topic", b"x", 0.0)
    with pytest.raises(LocalProtocolError):
        core.publish("t", b"", 0.0)
    with pytest.raises(LocalProtocolError):
        core.publish_many("t", [], 0.0)
    with pytest.raises(LocalProtocolError):
        core.publish("t", b"x", 0.0, sharding_key="k")  # needs lookupd
    with pytest.raises(LocalProtocolError):
        core.publish_many("t", [b"a"], 0.0, trace_ids=[1, 2])
    assert core.pending == 0


def test_pipelining_is_bounded_per_connection_and_what_waits_goes_as_one_mpub() -> None:
    core, ids = started(["n1:4150"], max_outstanding=2)
    (c,) = ids.values()
    rids = [core.publish("t", b"%d" % i, 0.0) for i in range(5)]
    # a lone publish on an idle connection is its own PUB, at once: no added latency
    assert sends(core.outputs())[c] == cmd.pub("t", b"0")
    # behind a busy connection, the others go together at the flush: one MPUB, call order
    assert core.next_deadline() == 0.0
    core.handle_timer(0.0)
    assert sends(core.outputs())[c] == cmd.mpub("t", [b"1", b"2", b"3", b"4"])
    assert [conn.outstanding for conn in core.connections()] == [2]
    # the connection is full: what comes now waits for an answer, no flush is due
    more = [core.publish("t", b"%d" % i, 0.1) for i in range(5, 8)]
    assert core.outputs() == [] and core.next_deadline() != 0.1
    core.receive_data(c, response(b"OK"), 0.2)
    out = core.outputs()
    assert [o.request_id for o in out if isinstance(o, PublishSucceeded)] == [rids[0]]
    assert sends(out)[c] == cmd.mpub("t", [b"5", b"6", b"7"])
    core.receive_data(c, response(b"OK") * 2, 0.3)
    # each caller gets its own answer
    ok = [o.request_id for o in core.outputs() if isinstance(o, PublishSucceeded)]
    assert ok == rids[1:] + more
    assert core.pending == 0


def mpub_count(data: bytes) -> int:
    """The number of messages of the MPUB ``data`` starts with."""
    return int.from_bytes(data[data.index(b"\n") + 5 : data.index(b"\n") + 9], "big")


def callers_after_a_wait(
    waited: float, count: int = 200
) -> tuple[Producer, int, float, list[tuple[int, bytes]]]:
    """A publish answered after ``waited`` seconds in which the producer had nothing else to
    do, then ``count`` callers publishing one each, 20 us apart (one pass of a driver over
    its ready tasks): the core, its connection, the time of the last call, and what was
    written during the pass (the index of the caller whose publish wrote it, the bytes)."""
    core, ids = started(["n1:4150"], max_outstanding=8)
    (c,) = ids.values()
    core.publish("t", b"first", 0.0)
    core.outputs()
    core.receive_data(c, response(b"OK"), waited)
    core.outputs()
    now = waited
    written: list[tuple[int, bytes]] = []
    for i in range(count):
        now += 20e-6  # each caller's turn
        core.publish("t", b"%03d" % i, now)
        written += [(i, o.data) for o in core.outputs() if isinstance(o, Send)]
    return core, c, now, written


def test_across_a_long_round_trip_waiting_publishes_go_in_shares_before_the_flush() -> None:
    # the producer waited 50 ms for nsqd with nothing to do: the callers it then runs go in
    # MPUBs of 16 (at least 16, and a quarter of what is in flight), each as soon as it is
    # gathered, while the connection keeps half its room (4 of 8); the rest at the flush
    core, c, now, written = callers_after_a_wait(0.050)
    assert [(i, d.split(b" ")[0]) for i, d in written] == [
        (0, b"PUB"),  # alone, on the idle connection
        (16, b"MPUB"),
        (32, b"MPUB"),
        (48, b"MPUB"),
    ]
    assert [mpub_count(d) for _, d in written[1:]] == [16, 16, 16]
    assert [conn.outstanding for conn in core.connections()] == [4]
    deadline = core.next_deadline()
    assert deadline is not None and deadline <= now  # the other 151: at the flush, one MPUB
    core.handle_timer(now)
    (rest,) = [o.data for o in core.outputs() if isinstance(o, Send)]
    assert mpub_count(rest) == 151
    # call order on the wire, and each caller answered once
    bodies = [b"%03d" % i for i in range(200)]
    assert b"".join(d for _, d in written) + rest == (
        cmd.pub("t", bodies[0])
        + b"".join(cmd.mpub("t", bodies[n : n + 16]) for n in (1, 17, 33))
        + cmd.mpub("t", bodies[49:])
    )
    core.receive_data(c, response(b"OK") * 5, now + 0.050)
    ok = [o for o in core.outputs() if isinstance(o, PublishSucceeded)]
    assert len(ok) == 200 and core.pending == 0


def test_on_loopback_waiting_publishes_go_together_at_the_flush() -> None:
    # nsqd answered 0.1 ms after the producer's latest call: it is busy with its callers, not
    # waiting, so what they publish meanwhile goes as one MPUB at the flush (fewer commands)
    core, _, now, written = callers_after_a_wait(0.0001)
    assert [d for _, d in written] == [cmd.pub("t", b"000")]
    core.handle_timer(now)
    (rest,) = [o.data for o in core.outputs() if isinstance(o, Send)]
    assert rest == cmd.mpub("t", [b"%03d" % i for i in range(1, 200)])


def test_publishes_trickling_in_across_a_round_trip_all_go_before_the_first_answer() -> None:
    # the blocking API's threads wake one after another once their answers are in: the loop
    # runs a few of their publishes per pass, and each pass ends at the flush.  With the
    # default options, across a 50 ms round trip, every one of 200 such publishes is on the
    # wire before the first answer comes back (not only a full pipe's worth: the rest would
    # wait a second round trip)
    core, ids = started(["n1:4150"])
    (c,) = ids.values()
    core.publish("t", b"first", 0.0)
    core.outputs()
    core.receive_data(c, response(b"OK"), 0.050)  # the producer waited 50 ms for nsqd
    core.outputs()
    now = 0.050
    written: list[bytes] = []
    bodies = [b"%03d" % i for i in range(200)]
    for first in range(0, 200, 5):  # 40 passes of the loop, 5 threads' publishes each
        for body in bodies[first : first + 5]:
            now += 30e-6
            core.publish("t", body, now)
            written += [o.data for o in core.outputs() if isinstance(o, Send)]
        deadline = core.next_deadline()
        if deadline is not None and deadline <= now:
            core.handle_timer(now)  # the end of the pass
            written += [o.data for o in core.outputs() if isinstance(o, Send)]
    assert now < 0.050 + 0.050  # all within the round trip
    counts = [1 if d.startswith(b"PUB ") else mpub_count(d) for d in written]
    assert sum(counts) == 200 and len(written) > 8
    # call order on the wire
    expected, n = [], 0
    for d, count in zip(written, counts, strict=True):
        part = bodies[n : n + count]
        expected.append(cmd.pub("t", part[0]) if d.startswith(b"PUB ") else cmd.mpub("t", part))
        n += count
    assert written == expected
    core.receive_data(c, response(b"OK") * len(written), now + 0.050)
    ok = [o for o in core.outputs() if isinstance(o, PublishSucceeded)]
    assert len(ok) == 200 and core.pending == 0


def test_a_long_wait_long_ago_sends_nothing_early() -> None:
    # the wait that counts is the latest: it halves at each read after it
    core, ids = started(["n1:4150"], max_outstanding=8)
    (c,) = ids.values()
    core.publish("t", b"first", 0.0)
    core.outputs()
    core.receive_data(c, response(b"OK"), 0.050)  # waited 50 ms
    now = 0.050
    for _ in range(12):  # then twelve quick exchanges: 50 ms / 2**12 = 12 us
        now += 0.0001
        core.publish("t", b"x", now)
        core.outputs()
        core.receive_data(c, response(b"OK"), now)
    core.outputs()
    written = []
    for i in range(100):
        now += 20e-6
        core.publish("t", b"%03d" % i, now)
        written += [o.data for o in core.outputs() if isinstance(o, Send)]
    assert written == [cmd.pub("t", b"000")]


def test_waiting_publishes_with_headers_go_as_one_mpub_ext_each_with_its_header() -> None:
    core, ids = started(["n1:4150"], max_outstanding=1)
    (c,) = ids.values()
    rids = [core.publish("t", b"b%d" % i, 0.0, partition=1, ext={"n": i}) for i in range(3)]
    header = [cmd.encode_ext_header({"n": i}) for i in range(3)]
    assert sends(core.outputs())[c] == cmd.pub_ext("t", b"b0", header[0], 1)
    core.receive_data(c, response(b"OK"), 0.1)
    assert sends(core.outputs())[c] == cmd.mpub_ext(
        "t", [(header[1], b"b1"), (header[2], b"b2")], 1
    )
    core.receive_data(c, response(b"OK"), 0.2)
    assert [o.request_id for o in core.outputs() if isinstance(o, PublishSucceeded)] == rids[1:]


def test_a_publish_behind_others_waiting_for_room_is_held_back_with_nothing_to_carry_out() -> None:
    core, ids = started(["n1:4150"], max_outstanding=1, publish_timeout=5.0)
    (c,) = ids.values()
    core.publish("t", b"0", 0.0)
    assert not core.held_back and sends(core.outputs())[c] == cmd.pub("t", b"0")
    core.publish("t", b"1", 0.0)
    assert not core.held_back  # the first to wait: the dispatch found no room
    deadline = core.next_deadline()
    core.publish("t", b"2", 0.1)
    assert core.held_back and core.outputs() == [] and core.next_deadline() == deadline
    core.receive_data(c, response(b"OK"), 0.2)
    assert sends(core.outputs())[c] == cmd.mpub("t", [b"1", b"2"])
    # what waited timed out: the next publish finds the queue changed and is dispatched
    core.handle_timer(5.1)
    assert core.pending == 0 and core.outputs()
    core.receive_data(c, response(b"OK"), 5.2)
    core.outputs()
    core.publish("t", b"3", 5.3)
    assert not core.held_back and sends(core.outputs())[c] == cmd.pub("t", b"3")


def test_pipelining_without_coalescing() -> None:
    core, ids = started(["n1:4150"], max_outstanding=2, max_coalesced_messages=1)
    (c,) = ids.values()
    rids = [core.publish("t", b"%d" % i, 0.0) for i in range(5)]
    assert sends(core.outputs())[c] == cmd.pub("t", b"0")
    core.handle_timer(0.0)
    assert sends(core.outputs())[c] == cmd.pub("t", b"1")
    core.receive_data(c, response(b"OK"), 0.1)
    out = core.outputs()
    assert [o.request_id for o in out if isinstance(o, PublishSucceeded)] == [rids[0]]
    assert sends(out)[c] == cmd.pub("t", b"2")
    core.receive_data(c, response(b"OK") * 2, 0.2)
    assert sends(core.outputs())[c] == cmd.pub("t", b"3") + cmd.pub("t", b"4")
    core.receive_data(c, response(b"OK") * 2, 0.3)
    assert [o.request_id for o in core.outputs() if isinstance(o, PublishSucceeded)] == rids[3:]
    assert core.pending == 0


def test_fatal_error_fails_the_request_and_fails_over_the_rest() -> None:
    core, ids = started(["n1:4150", "n2:4150"], max_outstanding=4)
    c1, c2 = ids["n1:4150"], ids["n2:4150"]
    rids = [core.publish("t", b"%d" % i, 0.0) for i in range(4)]
    # 0 and 1 at once, each on an idle connection; 2 and 3 together at the flush, on n1
    assert sends(core.outputs()) == {c1: cmd.pub("t", b"0"), c2: cmd.pub("t", b"1")}
    core.handle_timer(0.0)
    assert sends(core.outputs()) == {c1: cmd.mpub("t", [b"2", b"3"])}
    # n1 refuses 0 fatally
    core.receive_data(c1, error(b"E_BAD_MESSAGE PUB message too big 9 > 1"), 0.1)
    out = core.outputs()
    failed = [o for o in out if isinstance(o, PublishFailed)]
    assert [f.request_id for f in failed] == [rids[0]]
    assert isinstance(failed[0].error, ServerError) and failed[0].error.code == "E_BAD_MESSAGE"
    # requests 2 and 3 go over to n2 once the retry backoff (18 ms: they were behind the
    # refused one, their attempt not counted) is over
    assert c2 not in sends(out)
    retry_at = core.next_deadline()
    assert retry_at is not None and retry_at == pytest.approx(0.118)
    core.handle_timer(retry_at)
    assert sends(core.outputs())[c2] == cmd.mpub("t", [b"2", b"3"])
    core.receive_data(c2, response(b"OK") * 2, 0.2)
    ok = [o.request_id for o in core.outputs() if isinstance(o, PublishSucceeded)]
    assert sorted(ok) == [rids[1], rids[2], rids[3]]


def test_connection_loss_retries_and_gives_up_after_max_publish_attempts() -> None:
    core, ids = started(
        ["n1:4150"], max_publish_attempts=2, reconnect_delay=1.0, reconnect_jitter=0.0
    )
    (c,) = ids.values()
    rid = core.publish("t", b"x", 0.0)
    core.outputs()
    core.connection_lost(c, 0.5, OSError("reset"))
    core.outputs()
    assert core.pending == 1
    core.handle_timer(1.5)  # reconnect
    (connect,) = [o for o in core.outputs() if isinstance(o, Connect)]
    core.connection_made(connect.conn_id, 1.5)
    core.outputs()
    core.receive_data(connect.conn_id, identify_response(), 1.5)
    assert sends(core.outputs())[connect.conn_id] == cmd.pub("t", b"x")
    core.connection_lost(connect.conn_id, 2.0, OSError("reset again"))
    failed = [o for o in core.outputs() if isinstance(o, PublishFailed)]
    assert [f.request_id for f in failed] == [rid]
    assert isinstance(failed[0].error, ConnectionClosedError)


def one_command_each(**config: Any) -> tuple[Producer, int]:
    """A started producer sending each publish as its own command, with one attempt each,
    reconnecting 1 s after a loss (unless ``config`` says otherwise); and its connection."""
    options: dict[str, Any] = {
        "max_publish_attempts": 1,
        "max_coalesced_messages": 1,
        "reconnect_delay": 1.0,
        "reconnect_jitter": 0.0,
    }
    core, ids = started(["n1:4150"], **(options | config))
    (c,) = ids.values()
    return core, c


def reconnected(core: Producer, now: float) -> int:
    """The reconnection due at ``now``, made and identified; the flush then due carried out."""
    core.handle_timer(now)
    (connect,) = [o for o in core.outputs() if isinstance(o, Connect)]
    core.connection_made(connect.conn_id, now)
    core.outputs()
    core.receive_data(connect.conn_id, identify_response(), now)
    core.handle_timer(now)
    return connect.conn_id


def test_a_loss_without_a_word_counts_an_attempt_of_the_first_unanswered_command_only() -> None:
    # nsqd reads a connection's commands in order: a body that makes it close (its error
    # frame lost to the reset) is the first unanswered command; those behind it go again
    # with their attempt not counted, so one bad body never uses up its neighbours' attempts
    core, c = one_command_each()
    rids = [core.publish("t", b"%d" % i, 0.0) for i in range(4)]
    core.handle_timer(0.0)
    assert sends(core.outputs())[c] == b"".join(cmd.pub("t", b"%d" % i) for i in range(4))
    core.receive_data(c, response(b"OK"), 0.1)  # the first is answered
    core.outputs()
    core.connection_lost(c, 0.2, OSError("connection reset by peer"))
    failed = [o for o in core.outputs() if isinstance(o, PublishFailed)]
    assert [f.request_id for f in failed] == [rids[1]]  # its one attempt spent
    assert isinstance(failed[0].error, ConnectionClosedError)
    again = reconnected(core, 1.5)
    assert sends(core.outputs())[again] == cmd.pub("t", b"2") + cmd.pub("t", b"3")
    core.receive_data(again, response(b"OK") * 2, 1.6)
    ok = [o.request_id for o in core.outputs() if isinstance(o, PublishSucceeded)]
    assert ok == rids[2:] and core.pending == 0


def test_a_loss_is_charged_to_the_first_unanswered_command_even_one_failed_already() -> None:
    # the first command on the wire timed out (its caller has its answer), then the
    # connection ends without a word: nsqd ended on that one, not on those behind it
    core, c = one_command_each(publish_timeout=1.0, reconnect_delay=0.2)
    first = core.publish("t", b"0", 0.0)
    core.outputs()
    rids = [core.publish("t", b"%d" % i, 0.5) for i in (1, 2)]
    core.handle_timer(0.5)
    assert sends(core.outputs())[c] == cmd.pub("t", b"1") + cmd.pub("t", b"2")
    core.handle_timer(1.0)
    (timed_out,) = [o for o in core.outputs() if isinstance(o, PublishFailed)]
    assert timed_out.request_id == first and isinstance(timed_out.error, PublishTimeout)
    core.connection_lost(c, 1.1, OSError("connection reset by peer"))
    assert [o for o in core.outputs() if isinstance(o, PublishFailed)] == []
    again = reconnected(core, 1.35)
    assert sends(core.outputs())[again] == cmd.pub("t", b"1") + cmd.pub("t", b"2")
    core.receive_data(again, response(b"OK") * 2, 1.4)
    ok = [o.request_id for o in core.outputs() if isinstance(o, PublishSucceeded)]
    assert ok == rids and core.pending == 0


def test_after_an_error_frame_no_command_left_on_the_wire_is_blamed() -> None:
    core, c = one_command_each()
    rids = [core.publish("t", b"%d" % i, 0.0) for i in range(3)]
    core.handle_timer(0.0)
    core.outputs()
    core.receive_data(c, error(b"E_BAD_MESSAGE PUB message too big 9 > 1"), 0.1)
    failed = [o for o in core.outputs() if isinstance(o, PublishFailed)]
    assert [f.request_id for f in failed] == [rids[0]]  # nsqd's refusal: its own
    again = reconnected(core, 1.5)
    assert sends(core.outputs())[again] == cmd.pub("t", b"1") + cmd.pub("t", b"2")


#: one byte over nsqd's default --max-msg-size
OVER_MSG_SIZE = b"x" * (1024 * 1024 + 1)


def test_a_body_over_nsqds_limit_goes_alone_on_an_idle_connection() -> None:
    # nsqd ends the connection on a body over its limit, without reading it: the reset may
    # lose the answers of the commands around it, which would then go again (twice on
    # nsqd). So it goes only once nothing else is unanswered there, and nothing follows it
    # on that connection before its answer
    core, ids = started(["n1:4150"], max_outstanding=4)
    (c,) = ids.values()
    first = core.publish("t", b"a", 0.0)
    big = core.publish("t", OVER_MSG_SIZE, 0.0)
    last = core.publish("t", b"b", 0.0)
    assert sends(core.outputs())[c] == cmd.pub("t", b"a")
    core.handle_timer(0.0)
    assert c not in sends(core.outputs())  # the big one waits for "a"'s answer; "b" behind it
    core.receive_data(c, response(b"OK"), 0.1)
    out = core.outputs()
    assert [o.request_id for o in out if isinstance(o, PublishSucceeded)] == [first]
    assert sends(out)[c] == cmd.pub("t", OVER_MSG_SIZE)
    core.handle_timer(0.1)
    assert c not in sends(core.outputs())  # nothing behind it
    core.receive_data(c, error(b"E_BAD_MESSAGE PUB message too big 1048577 > 1048576"), 0.2)
    out = core.outputs()
    failed = [o for o in out if isinstance(o, PublishFailed)]
    assert [f.request_id for f in failed] == [big]
    core.connection_lost(c, 0.2)  # nsqd closes on it
    again = reconnected(core, 1.5)
    assert sends(core.outputs())[again] == cmd.pub("t", b"b")
    core.receive_data(again, response(b"OK"), 1.6)
    ok = [o.request_id for o in core.outputs() if isinstance(o, PublishSucceeded)]
    assert ok == [last] and core.pending == 0


def test_a_big_body_nsqd_took_goes_as_any_other_afterwards() -> None:
    # an nsqd with a larger --max-msg-size took it: bodies up to that size need no care
    core, ids = started(["n1:4150"], max_outstanding=4)
    (c,) = ids.values()
    core.publish("t", b"a", 0.0)
    core.outputs()
    core.receive_data(c, response(b"OK"), 0.1)
    core.publish("t", OVER_MSG_SIZE, 0.1)
    assert sends(core.outputs())[c] == cmd.pub("t", OVER_MSG_SIZE)
    core.receive_data(c, response(b"OK"), 0.2)
    core.outputs()
    core.publish("t", b"b", 0.3)
    core.publish("t", OVER_MSG_SIZE, 0.3)
    core.publish("t", OVER_MSG_SIZE + b"y", 0.3)
    assert sends(core.outputs())[c] == cmd.pub("t", b"b")
    core.handle_timer(0.3)
    # the one of the size nsqd took goes behind "b"; one byte more waits to go alone
    assert sends(core.outputs())[c] == cmd.pub("t", OVER_MSG_SIZE)
    core.receive_data(c, response(b"OK") * 2, 0.4)
    assert sends(core.outputs())[c] == cmd.pub("t", OVER_MSG_SIZE + b"y")


def refused_for_its_size(core: Producer, c: int, refusal: bytes) -> int:
    """nsqd refuses what was sent on ``c`` with ``refusal`` and closes it; the connection
    that comes back at 1.5 s, its outputs taken."""
    core.outputs()
    core.receive_data(c, error(refusal), 0.1)
    core.connection_lost(c, 0.1)
    core.outputs()
    again = reconnected(core, 1.5)
    core.outputs()
    return again


def test_the_limit_nsqd_names_makes_bodies_over_it_go_alone() -> None:
    core, ids = started(["n1:4150"], max_outstanding=4, max_coalesced_messages=1)
    (c,) = ids.values()
    core.publish("t", b"x" * 200, 0.0)
    again = refused_for_its_size(core, c, b"E_BAD_MESSAGE PUB message too big 200 > 100")
    core.publish("t", b"small", 2.0)
    core.publish("t", b"y" * 101, 2.0)
    core.publish("t", b"tail", 2.0)
    assert sends(core.outputs())[again] == cmd.pub("t", b"small")
    core.handle_timer(2.0)
    assert again not in sends(core.outputs())
    core.receive_data(again, response(b"OK"), 2.1)
    assert sends(core.outputs())[again] == cmd.pub("t", b"y" * 101)


def test_an_mpub_over_nsqds_body_limit_goes_alone() -> None:
    core, ids = started(["n1:4150"], max_outstanding=4)
    (c,) = ids.values()
    core.publish("t", b"a", 0.0)
    bodies = [b"z" * (1024 * 1024)] * 5  # 5 MiB of bodies, and their sizes: over 5 MiB
    core.publish_many("t", bodies, 0.0)
    assert sends(core.outputs())[c] == cmd.pub("t", b"a")
    core.handle_timer(0.0)
    assert c not in sends(core.outputs())
    core.receive_data(c, response(b"OK"), 0.1)
    assert sends(core.outputs())[c] == cmd.mpub("t", bodies)


def test_the_body_limit_nsqd_names_bounds_mpubs_and_sends_larger_ones_alone() -> None:
    core, ids = started(["n1:4150"], max_outstanding=4)
    (c,) = ids.values()
    core.publish_many("t", [b"x" * 60, b"y" * 60], 0.0)
    again = refused_for_its_size(core, c, b"E_BAD_BODY MPUB body too big 136 > 100")
    core.publish("t", b"a", 2.0)
    for _ in range(3):
        core.publish("t", b"z" * 40, 2.0)
    core.publish_many("t", [b"m" * 30] * 3, 2.0)  # 4 + 3 * (4 + 30) = 106 bytes
    assert sends(core.outputs())[again] == cmd.pub("t", b"a")
    core.handle_timer(2.0)
    # coalesced up to the 100 bytes nsqd takes (4 + 2 * 44 = 92): the third alone; the
    # MPUB over 100 bytes waits for an idle connection
    assert sends(core.outputs())[again] == cmd.mpub("t", [b"z" * 40] * 2) + cmd.pub("t", b"z" * 40)
    core.receive_data(again, response(b"OK") * 3, 2.1)
    assert sends(core.outputs())[again] == cmd.mpub("t", [b"m" * 30] * 3)


def test_publish_timeout_without_any_nsqd() -> None:
    core = Producer(ProducerConfig(publish_timeout=5.0), nsqd_tcp_addresses=["n1:4150"])
    core.start(0.0)
    core.outputs()
    rid = core.publish("t", b"x", 0.0)
    assert core.next_deadline() == 5.0
    core.handle_timer(5.0)
    (failed,) = [o for o in core.outputs() if isinstance(o, PublishFailed)]
    assert failed.request_id == rid and isinstance(failed.error, PublishTimeout)


def test_publishes_answered_out_of_order_time_out_oldest_first() -> None:
    core, _ = started(["n1:4150", "n2:4150"], publish_timeout=5.0)
    rids = [core.publish("t", b"%d" % i, float(i)) for i in range(4)]
    deadline = {rid: 5.0 + i for i, rid in enumerate(rids)}
    core.handle_timer(3.0)  # the flush: 2 and 3 went behind busy connections
    written = sends(core.outputs())
    assert sum(data.count(b"PUB ") for data in written.values()) == 3  # 0, 1, MPUB of 2 3
    assert core.next_deadline() == 5.0
    # the oldest is acknowledged first on its connection: the next deadline is the second's
    (first_conn,) = [
        c for c, data in written.items() if data.startswith(b"PUB t\n\x00\x00\x00\x010")
    ]
    core.receive_data(first_conn, response(b"OK"), 1.0)
    acked = [o.request_id for o in core.outputs() if isinstance(o, PublishSucceeded)]
    assert rids[0] in acked
    pending = [r for r in rids if r not in acked]
    assert core.next_deadline() == min(deadline[r] for r in pending)
    core.handle_timer(7.5)
    timed_out = [o.request_id for o in core.outputs() if isinstance(o, PublishFailed)]
    assert timed_out == [r for r in pending if deadline[r] <= 7.5]
    assert core.next_deadline() == min(deadline[r] for r in pending if r not in timed_out)


def test_a_clock_that_goes_back_does_not_hide_an_older_deadline() -> None:
    core = Producer(ProducerConfig(publish_timeout=5.0), nsqd_tcp_addresses=["n1:4150"])
    core.start(0.0)
    core.outputs()
    first = core.publish("t", b"x", 10.0)
    second = core.publish("t", b"y", 3.0)  # a caller's clock went back
    assert core.next_deadline() == 15.0
    core.handle_timer(15.0)
    failed = [o.request_id for o in core.outputs() if isinstance(o, PublishFailed)]
    assert failed == [first, second]


def test_traced_publish_returns_the_receipt() -> None:
    core, ids = started(["n1:4150"], version="0.3.7-HA.1.13.0")
    (c,) = ids.values()
    rid = core.publish("orders", b"hi", 0.0, partition=2, trace_id=12345)
    assert sends(core.outputs())[c] == cmd.pub_trace("orders", 12345, b"hi", 2)
    receipt = TraceReceipt(1, 12345, 0, 32)
    core.receive_data(c, response(encode_trace_receipt(receipt)), 0.0)
    (ok,) = [o for o in core.outputs() if isinstance(o, PublishSucceeded)]
    assert (ok.request_id, ok.receipt) == (rid, receipt)


LOOKUP_W = (
    b'{"channels":["c"],"meta":{"partition_num":2,"replica":1,"extend_support":false,'
    b'"ordered":true,"multi_part":false,"disable_channel_auto_create":false},"producers":[],'
    b'"partitions":{"0":{"id":"a","remote_address":"a","hostname":"h","broadcast_address":"n1",'
    b'"tcp_port":4150,"http_port":4151,"version":"0.3.7-HA.1.13.0","distributed_id":""},'
    b'"1":{"id":"b","remote_address":"b","hostname":"h","broadcast_address":"n2","tcp_port":4150,'
    b'"http_port":4151,"version":"0.3.7-HA.1.13.0","distributed_id":""}}}'
)


def test_sharding_key_routes_to_the_partition_leader_and_relooks_up_on_not_leader() -> None:
    core = Producer(ProducerConfig(), lookupd_http_addresses=["l:4161"])
    core.start(0.0)
    rid = core.publish("orders", b"x", 0.0, sharding_key="hello")
    (req,) = [o for o in core.outputs() if isinstance(o, HttpRequest)]
    assert req.data.startswith(b"GET /lookup?topic=orders&access=w&metainfo=true HTTP/1.1\r\n")
    core.http_data(req.request_id, http_response(LOOKUP_W), 0.1)
    connects = {f"{o.host}": o.conn_id for o in core.outputs() if isinstance(o, Connect)}
    assert set(connects) == {"n1", "n2"}
    out = []
    for conn_id in connects.values():
        core.connection_made(conn_id, 0.1)
        core.receive_data(conn_id, identify_response(version="0.3.7-HA.1.13.0"), 0.1)
        out += core.outputs()
    pid = partition_for_key(b"hello", 2)
    assert pid == 1  # spec test vector
    leader = connects["n2"]
    assert sends(out)[leader].endswith(cmd.pub("orders", b"x", 1))
    assert not sends(out)[connects["n1"]].endswith(cmd.pub("orders", b"x", 1))
    # the leader moved: the request is retried after a new lookup
    core.receive_data(leader, error(b"E_FAILED_ON_NOT_LEADER "), 0.2)
    out = core.outputs()
    assert not [o for o in out if isinstance(o, PublishFailed)]
    (req2,) = [o for o in out if isinstance(o, HttpRequest)]
    moved = LOOKUP_W.replace(b'"broadcast_address":"n2"', b'"broadcast_address":"n1"')
    core.http_data(req2.request_id, http_response(moved), 0.3)
    out = core.outputs()
    assert sends(out)[connects["n1"]] == cmd.pub("orders", b"x", 1)
    core.receive_data(connects["n1"], response(b"OK"), 0.4)
    assert [o.request_id for o in core.outputs() if isinstance(o, PublishSucceeded)] == [rid]


def test_listlookup_after_a_partitioned_answer_and_its_timeout() -> None:
    from nsq_proto import LookupFailed

    core = Producer(ProducerConfig(lookupd_poll_timeout=2.0), lookupd_http_addresses=["l:4161"])
    core.start(0.0)
    core.publish("orders", b"x", 0.0, sharding_key="k")
    (req,) = [o for o in core.outputs() if isinstance(o, HttpRequest)]
    core.http_data(req.request_id, http_response(LOOKUP_W), 0.1)
    (listing,) = [o for o in core.outputs() if isinstance(o, HttpRequest)]
    assert listing.data.startswith(b"GET /listlookup HTTP/1.1\r\n")
    core.handle_timer(2.1)  # the lookupd never answers /listlookup
    failed = [o for o in core.outputs() if isinstance(o, LookupFailed)]
    assert [f.address for f in failed] == [("l", 4161)]


@pytest.mark.parametrize(
    "bad",
    [
        {"publish_timeout": 0},
        {"dial_timeout": float("inf")},
        {"reconnect_delay": True},
        {"pool_size": 0},
        {"max_outstanding": 1.5},
        {"reconnect_jitter": 2.0},
    ],
)
def test_invalid_producer_config(bad: dict[str, object]) -> None:
    from nsq_proto import ConfigError

    with pytest.raises(ConfigError):
        ProducerConfig(**bad)  # type: ignore[arg-type]


def test_connection_config_keeps_only_connection_settings() -> None:
    config = ProducerConfig(snappy=True, pool_size=3, client_id="me")
    conn = config.connection_config(extend_support=True)
    assert type(conn).__name__ == "ConnectionConfig"
    assert (conn.snappy, conn.client_id, conn.extend_support) == (True, "me", True)


def sharded_publish(
    answer: bytes, key: str = "hello", **config: Any
) -> tuple[Producer, int, list[object]]:
    """A sharding-key publish behind a lookupd that answers ``answer``; the outputs after the
    connections to every listed partition are ready."""
    core = Producer(ProducerConfig(**config), lookupd_http_addresses=["l:4161"])
    core.start(0.0)
    rid = core.publish("orders", b"x", 0.0, sharding_key=key)
    (req,) = [o for o in core.outputs() if isinstance(o, HttpRequest)]
    core.http_data(req.request_id, http_response(answer), 0.1)
    out: list[object] = []
    for o in core.outputs():
        out.append(o)
        if isinstance(o, Connect):
            core.connection_made(o.conn_id, 0.1)
            core.receive_data(o.conn_id, identify_response(version="0.3.7-HA.1.13.0"), 0.1)
            out += core.outputs()
    return core, rid, out


@pytest.mark.parametrize(
    "answer",
    [
        LOOKUP_W.replace(b'"partition_num":2', b'"partition_num":0'),
        LOOKUP_W.replace(LOOKUP_W[LOOKUP_W.index(b'"meta"') : LOOKUP_W.index(b'"producers"')], b""),
    ],
    ids=["zero", "missing"],
)
def test_a_sharding_key_without_a_partition_count_is_refused(answer: bytes) -> None:
    # go-nsq refuses: counting the partitions listed would send keys to the wrong partition
    # whenever one of them has no leader at the moment
    answer = answer.replace(b',"1":{', b',"9":{')  # only partitions 0 and 9 listed
    _, rid, out = sharded_publish(answer)
    (failed,) = [o for o in out if isinstance(o, PublishFailed)]
    assert failed.request_id == rid
    assert isinstance(failed.error, LocalProtocolError)
    assert "partition_num" in str(failed.error) and "orders" in str(failed.error)
    assert not [o for o in out if isinstance(o, Send) and b"PUB " in o.data]


def test_the_sharding_hasher_can_be_chosen() -> None:
    assert partition_for_key(b"hello", 2) == 1  # murmur3 (go-nsq's configured hasher)
    seen: list[bytes] = []

    def first_byte(key: bytes) -> int:
        seen.append(key)
        return key[0]

    _, _, out = sharded_publish(LOOKUP_W, hasher=first_byte)  # "h" = 104 -> partition 0
    assert seen == [b"hello"]
    assert cmd.pub("orders", b"x", 0) in b"".join(o.data for o in out if isinstance(o, Send))


@pytest.mark.parametrize("hasher", ["murmur3", 3])
def test_a_hasher_must_be_callable(hasher: object) -> None:
    from nsq_proto import ConfigError

    with pytest.raises(ConfigError, match="hasher"):
        ProducerConfig(hasher=hasher)  # type: ignore[arg-type]


def test_a_hasher_that_returns_no_int_fails_the_publish() -> None:
    _, rid, out = sharded_publish(LOOKUP_W, hasher=lambda key: "nope")
    (failed,) = [o for o in out if isinstance(o, PublishFailed)]
    assert failed.request_id == rid and isinstance(failed.error, LocalProtocolError)
    assert "hasher" in str(failed.error)


def test_producer_connections_are_records_of_each_nsqd() -> None:
    core, ids = started(["n1:4150", "n2:4150"])
    core.publish("t", b"x", 0.0)
    by_address = {conn.address: conn for conn in core.connections()}
    assert sorted(by_address) == [("n1", 4150), ("n2", 4150)]
    assert {a: c.conn_id for a, c in by_address.items()} == {
        ("n1", 4150): ids["n1:4150"],
        ("n2", 4150): ids["n2:4150"],
    }
    assert {c.state for c in by_address.values()} == {"READY"}
    # the publish went on one of them: it waits for nsqd's answer there
    assert sorted(c.outstanding for c in by_address.values()) == [0, 1]
    (busy,) = [c for c in by_address.values() if c.outstanding]
    core.receive_data(busy.conn_id, response(b"OK"), 0.1)
    assert [c.outstanding for c in core.connections()] == [0, 0]


def test_producer_close_fails_queued_publishes_and_refuses_new_ones() -> None:
    core = Producer(nsqd_tcp_addresses=["n1:4150"])
    core.start(0.0)
    (connect,) = of_type(core.outputs(), Connect)  # never connected: the publish waits
    rid = core.publish("t", b"x", 0.0)
    assert core.pending == 1
    assert core.connections() == [ProducerConnectionInfo(connect.conn_id, ("n1", 4150), "INIT", 0)]
    core.close(1.0)
    out = core.outputs()
    (failed,) = of_type(out, PublishFailed)
    assert failed.request_id == rid and isinstance(failed.error, ConnectionClosedError)
    assert str(failed.error) == "producer closed"
    assert of_type(out, Close) == [Close(connect.conn_id, "producer closed")]
    assert core.pending == 0 and core.connections() == []
    with pytest.raises(LocalProtocolError, match="the producer is closing"):
        core.publish("t", b"y", 2.0)
    core.handle_timer(100.0)  # no reconnect, nothing left to time out
    assert core.outputs() == []


def test_producer_close_fails_publishes_already_sent() -> None:
    core, c = producer(publish_timeout=30.0)
    rid = core.publish("t", b"x", 0.0)
    assert sent_on(core.outputs(), c) == cmd.pub("t", b"x")
    core.close(1.0)
    out = core.outputs()
    assert of_type(out, Close) == [Close(c, "producer closed")]
    assert [f.request_id for f in of_type(out, PublishFailed)] == [rid]


def test_producer_lookupd_failure_is_named_when_the_publish_times_out() -> None:
    core = Producer(ProducerConfig(publish_timeout=5.0), lookupd_http_addresses=["l1:4161"])
    core.start(0.0)
    assert core.outputs() == []  # nothing to connect to before a lookup
    rid = core.publish("t", b"x", 0.0)
    (request,) = of_type(core.outputs(), HttpRequest)
    assert request.data.startswith(b"GET /lookup?topic=t&access=w&metainfo=true HTTP/1.1\r\n")
    core.http_failed(request.request_id, OSError("no route to host"), 0.1)
    (failed_lookup,) = of_type(core.outputs(), LookupFailed)
    assert str(failed_lookup.error) == "lookupd request failed: no route to host"
    core.handle_timer(1.1)  # looked up again a second later
    (retry,) = of_type(core.outputs(), HttpRequest)
    core.http_failed(retry.request_id, OSError("no route to host"), 1.2)
    core.outputs()
    core.handle_timer(5.0)
    (failed,) = of_type(core.outputs(), PublishFailed)
    assert failed.request_id == rid and failed.conn_id == 0  # it was never sent
    assert str(failed.error) == (
        "publish 1 not acknowledged in time (no route: lookupd request failed: no route to host)"
    )


def test_producer_fails_a_publish_nsqd_refuses_without_retrying() -> None:
    core, c = producer(max_publish_attempts=3)
    rid = core.publish("t", b"x", 0.0)
    core.outputs()
    core.receive_data(c, error(b"E_BAD_MESSAGE PUB bad message"), 0.1)
    out = core.outputs()
    (failed,) = of_type(out, PublishFailed)
    assert failed.request_id == rid and failed.conn_id == c
    assert str(failed.error) == "E_BAD_MESSAGE PUB bad message"
    assert not of_type(out, Send)  # not sent again
    assert core.pending == 0


def test_a_permanent_failure_fails_every_publish_at_once() -> None:
    core = Producer(ProducerConfig(auth_secret=b"secret"), nsqd_tcp_addresses=["n1:4150"])
    core.start(0.0)
    (connect,) = of_type(core.outputs(), Connect)
    c = connect.conn_id
    waiting = core.publish("t", b"a", 0.0)
    core.connection_made(c, 0.0)
    core.receive_data(c, identify_response(auth_required=True), 0.0)
    assert sent_on(core.outputs(), c).endswith(cmd.auth(b"secret"))
    core.receive_data(c, error(b"E_AUTH_FAILED AUTH failed"), 0.1)
    out = core.outputs()
    (closed,) = of_type(out, ConnectionClosed)
    (failed,) = of_type(out, PublishFailed)
    assert failed.request_id == waiting
    assert isinstance(failed.error, ServerError) and failed.error.code == "E_AUTH_FAILED"
    assert failed.error.permanent and failed.error is not closed.error  # a copy of its own
    later = core.publish("t", b"b", 0.2)  # the next one is not kept waiting either
    (failed,) = of_type(core.outputs(), PublishFailed)
    assert failed.request_id == later and str(failed.error) == "E_AUTH_FAILED AUTH failed"


def test_a_topic_lookupd_refuses_twice_fails_its_publishes_with_the_answer() -> None:
    core = Producer(lookupd_http_addresses=["l:4161"])
    core.start(0.0)
    rid = core.publish("t", b"x", 0.0)
    refusal = http_response(
        b'{"status_code":500,"status_txt":"TOPIC_NOT_READY","data":null}',
        b"500 Internal Server Error",
    )
    (lookup,) = of_type(core.outputs(), HttpRequest)
    core.http_data(lookup.request_id, refusal, 0.1)
    assert of_type(core.outputs(), LookupFailed) and core.pending == 1
    core.handle_timer(1.1)  # asked again a second later
    (lookup,) = of_type(core.outputs(), HttpRequest)
    core.http_data(lookup.request_id, refusal, 1.2)
    out = core.outputs()
    (failed,) = of_type(out, PublishFailed)
    assert failed.request_id == rid and isinstance(failed.error, LookupdError)
    assert str(failed.error).startswith("no route to topic 't': ")
    assert isinstance(failed.error.__cause__, LookupdError)
    assert core.pending == 0


@pytest.mark.parametrize(
    ("publish", "says"),
    [
        (lambda p: p.publish("t", b"x", 0.0, partition=1, sharding_key=b"k"), "not both"),
        (lambda p: p.publish("t", b"x", 0.0, partition=-1), "partition must be a non-negative"),
        (lambda p: p.publish("t", b"x", 0.0, sharding_key="k"), "a sharding key needs lookupd"),
        (lambda p: p.publish("t", b"x", 0.0, delay=1.0, trace_id=1), "DPUB takes no partition"),
        (lambda p: p.publish("t", b"x", 0.0, delay=-1.0), "delay cannot be negative"),
        (lambda p: p.publish("t", b"", 0.0), "message bodies must be non-empty bytes"),
        pytest.param(
            lambda p: p.publish("t", "text", 0.0),
            "message bodies must be non-empty bytes",
            marks=pytest.mark.skipif(COMPILED, reason=WRONG_TYPE),
        ),
        (lambda p: p.publish_many("t", [], 0.0), "nothing to publish"),
        (lambda p: p.publish_many("t", [b"a"], 0.0, trace_ids=[1, 2]), "one trace id per body"),
        (
            lambda p: p.publish_many("t", [b"a"], 0.0, trace_ids=[1], ext={"k": "v"}),
            "MPUB_EXT takes no trace ids",
        ),
    ],
)
def test_publish_refuses_misuse_at_the_call(publish: Any, says: str) -> None:
    core, _ = producer()
    with pytest.raises(LocalProtocolError) as info:
        publish(core)
    assert says in str(info.value)
    assert core.pending == 0 and core.outputs() == []


def test_publish_takes_any_bytes_like_body() -> None:
    core, c = producer()
    # taken at run time, though publish_many's bodies are annotated Iterable[bytes] (bytearray
    # and memoryview are not bytes to mypy)
    rid = core.publish_many("t", [bytearray(b"ab"), memoryview(b"cd")], 0.0)  # type: ignore[list-item]
    assert sent_on(core.outputs(), c) == cmd.mpub("t", [b"ab", b"cd"])
    core.receive_data(c, response(b"OK"), 0.1)
    assert of_type(core.outputs(), PublishSucceeded) == [PublishSucceeded(c, rid, None)]


def test_producer_reconnects_after_the_scheduler_delay() -> None:
    core = Producer(
        ProducerConfig(reconnect_delay=2.0, reconnect_jitter=0.0),
        nsqd_tcp_addresses=["n:4150"],
    )
    core.start(0.0)
    (connect,) = [o for o in core.outputs() if isinstance(o, Connect)]
    core.connection_lost(connect.conn_id, 10.0, OSError("refused"))
    core.outputs()
    assert core._timers.deadline((TimerKind.RECONNECT, (("n", 4150), 0))) == 12.0
