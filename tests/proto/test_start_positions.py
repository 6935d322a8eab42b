"""The consumer's start positions (``nsq_proto/_start_positions.py``): alone, the calls it sends
to each partition's leader, the decision each answer turns into, and which partitions still
need their position; then the consumer's side, its calls to nsqd before it subscribes.  The
positions themselves are ``test_start_from.py``'s; against the emulator,
``test_start_positions_x_emulator.py``; against a real cluster,
``tests/real/test_partitioned.py``."""

from __future__ import annotations

import pytest

from nsq_proto import (
    ConfigError,
    Connect,
    Consumer,
    ConsumerConfig,
    HttpRequest,
    LookupdError,
    Output,
    StartFrom,
    StartFromApplied,
    StartFromFailed,
)
from nsq_proto._lookupd import Peer
from nsq_proto._lookupd_client import LookupdClient, NsqdAnswered, NsqdCallFailed
from nsq_proto._start_positions import Seek, StartPositions
from nsq_proto._timers import Timers

from .helpers import PARTITIONED_LOOKUP, http_response, of_type, requests_by_target

MSGCOUNT_5 = StartFrom.message_count(5)
LEADER = Peer(
    broadcast_address="n1",
    tcp_port=4150,
    http_port=4151,
    hostname="n1",
    version="0.3.7-HA.1.13.0",
    distributed_id="",
)


def positions(
    start_from: StartFrom | dict[int, StartFrom] | None = MSGCOUNT_5,
    lookupd: tuple[tuple[str, int], ...] = (("l", 4161),),
) -> tuple[StartPositions, list[Output]]:
    sent: list[Output] = []
    client = LookupdClient(
        list(lookupd), timeout=5.0, user_agent="test", timers=Timers(), send=sent.append
    )
    config = ConsumerConfig(start_from=start_from)
    return StartPositions("t", "c", config, client), sent


def call(sent: list[Output]) -> HttpRequest:
    (request,) = sent
    sent.clear()
    assert isinstance(request, HttpRequest)
    return request


def test_start_from_needs_lookupd_to_name_the_leaders() -> None:
    with pytest.raises(ConfigError, match="start_from needs lookupd_http_addresses"):
        positions(lookupd=())
    positions(start_from=None, lookupd=())  # no position: nothing to ask


def test_a_position_is_set_once_on_the_leaders_http_port() -> None:
    starts, sent = positions()
    assert starts.pending(0)
    starts.seek(LEADER, 0, 1.0)
    request = call(sent)
    assert (request.host, request.port) == ("n1", 4151)
    assert request.data.startswith(b"POST /channel/setoffset?topic=t&partition=0&channel=c ")
    assert request.data.endswith(b"\r\n\r\nmsgcount:5")
    assert starts.seeks == {0: Seek.SETTING}
    starts.seek(LEADER, 0, 1.5)  # a later lookup while the call is out: no second call
    assert sent == []
    decision = starts.answered(NsqdAnswered(request.request_id, 200, b"OK"), 2.0)
    assert decision == StartFromApplied(("n1", 4150), 0)
    assert starts.seeks == {0: Seek.APPLIED}
    assert not starts.pending(0)  # never again, not on a reconnect


def test_a_missing_channel_is_created_then_its_position_set() -> None:
    starts, sent = positions()
    starts.seek(LEADER, 1, 1.0)
    setoffset = call(sent)
    missing = NsqdAnswered(setoffset.request_id, 404, b"CHANNEL_NOT_FOUND")
    assert starts.answered(missing, 1.1) is None  # another call is out
    create = call(sent)
    assert create.data.startswith(b"POST /channel/create?topic=t&partition=1&channel=c ")
    assert starts.answered(NsqdAnswered(create.request_id, 200, b""), 1.2) is None
    again = call(sent)
    assert again.data.startswith(b"POST /channel/setoffset?") and again.data.endswith(b"5")
    decision = starts.answered(NsqdAnswered(again.request_id, 200, b"OK"), 1.3)
    assert decision == StartFromApplied(("n1", 4150), 1)


@pytest.mark.parametrize(
    ("status", "body", "says"),
    [
        (500, b"boom", "start_from for partition 0: /channel/setoffset answered HTTP 500: boom"),
        (400, b"", "start_from for partition 0: /channel/setoffset answered HTTP 400"),
    ],
)
def test_a_refused_position_is_forgotten_for_the_next_lookup(
    status: int, body: bytes, says: str
) -> None:
    starts, sent = positions()
    starts.seek(LEADER, 0, 1.0)
    decision = starts.answered(NsqdAnswered(call(sent).request_id, status, body), 1.1)
    assert isinstance(decision, StartFromFailed)
    assert (decision.address, decision.partition, str(decision.error)) == (("n1", 4150), 0, says)
    assert starts.seeks == {} and starts.pending(0)
    starts.seek(LEADER, 0, 2.0)  # the next lookup asks again
    assert call(sent).data.startswith(b"POST /channel/setoffset?")


def test_a_failed_create_and_a_call_cut_short_are_failures() -> None:
    starts, sent = positions()
    starts.seek(LEADER, 0, 1.0)
    starts.answered(NsqdAnswered(call(sent).request_id, 404, b"CHANNEL_NOT_FOUND"), 1.1)
    decision = starts.answered(NsqdAnswered(call(sent).request_id, 404, b"CHANNEL_NOT_FOUND"), 1.2)
    assert isinstance(decision, StartFromFailed)  # the create itself: not retried
    assert "/channel/create answered HTTP 404: CHANNEL_NOT_FOUND" in str(decision.error)
    starts.seek(LEADER, 0, 2.0)
    cut = NsqdCallFailed(call(sent).request_id, LookupdError("connection reset"))
    assert starts.failed(cut) == StartFromFailed(("n1", 4150), 0, cut.error)
    assert starts.seeks == {}


def test_only_partitions_with_a_position_are_pending() -> None:
    starts, _ = positions(start_from={1: StartFrom.end()})
    assert not starts.pending(0) and starts.pending(1)
    starts, _ = positions(start_from=None)
    assert not starts.pending(0)


# -- through the consumer: its calls to nsqd -------------------------------------------------


def test_start_from_sets_each_partitions_position_before_subscribing() -> None:
    core = Consumer(
        "t",
        "c",
        ConsumerConfig(start_from=StartFrom.message_count(5)),
        lookupd_http_addresses=["l:4161"],
    )
    core.start(0.0)
    (lookup,) = of_type(core.outputs(), HttpRequest)
    core.http_data(lookup.request_id, http_response(PARTITIONED_LOOKUP), 0.1)
    out = core.outputs()
    assert not of_type(out, Connect)  # no subscription before the position is set
    calls = requests_by_target(out)
    assert set(calls) == {
        ("l", "/listlookup"),  # a partitioned answer: learn the cluster's other lookupd
        ("n1", "/channel/setoffset"),
        ("n2", "/channel/setoffset"),
    }
    first, second = calls[("n1", "/channel/setoffset")], calls[("n2", "/channel/setoffset")]
    assert first.port == 4151 and first.data.endswith(b"\r\n\r\nmsgcount:5")
    assert b"?topic=t&partition=0&channel=c " in first.data
    # partition 0: set; its connection opens
    core.http_data(first.request_id, http_response(b"OK"), 0.2)
    out = core.outputs()
    assert out[0] == StartFromApplied(("n1", 4150), 0)
    assert [(o.host, o.port) for o in of_type(out, Connect)] == [("n1", 4150)]
    # partition 1: the channel does not exist yet: created, then its position set
    core.http_data(second.request_id, http_response(b"CHANNEL_NOT_FOUND", b"404 Not Found"), 0.3)
    create = requests_by_target(core.outputs())[("n2", "/channel/create")]
    core.http_data(create.request_id, http_response(b""), 0.4)
    again = requests_by_target(core.outputs())[("n2", "/channel/setoffset")]
    core.http_data(again.request_id, http_response(b"boom", b"500 Internal Server Error"), 0.5)
    out = core.outputs()
    (failed,) = of_type(out, StartFromFailed)
    assert (failed.address, failed.partition) == (("n2", 4150), 1)
    assert str(failed.error) == (
        "start_from for partition 1: /channel/setoffset answered HTTP 500: boom"
    )
    assert not of_type(out, Connect)  # not consumed from until a later lookup sets it


def test_an_nsqd_call_cut_short_is_a_failed_start_from() -> None:
    core = Consumer(
        "t", "c", ConsumerConfig(start_from=StartFrom.end()), lookupd_http_addresses=["l:4161"]
    )
    core.start(0.0)
    (lookup,) = of_type(core.outputs(), HttpRequest)
    core.http_data(lookup.request_id, http_response(PARTITIONED_LOOKUP), 0.1)
    calls = requests_by_target(core.outputs())
    setoffset = calls[("n1", "/channel/setoffset")]
    assert setoffset.data.endswith(b"special:-1")
    core.http_data(setoffset.request_id, b"", 0.2)  # EOF before a byte of the answer
    (failed,) = of_type(core.outputs(), StartFromFailed)
    assert (failed.address, failed.partition) == (("n1", 4150), 0)
    assert str(failed.error) == "the connection closed before an HTTP response arrived"
    setoffset = calls[("n2", "/channel/setoffset")]
    core.http_data(setoffset.request_id, b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nOK", 0.3)
    assert core.outputs() == []  # half a response: waiting for the rest
    core.http_failed(setoffset.request_id, OSError("connection reset"), 0.4)
    (failed,) = of_type(core.outputs(), StartFromFailed)
    assert failed.partition == 1 and str(failed.error).endswith(": connection reset")
    assert not of_type(core.outputs(), Connect)
