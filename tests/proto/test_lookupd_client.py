"""The lookupd client of ``_lookupd_client.py`` alone: requests out, answers back as values,
with no consumer or producer around it."""

from __future__ import annotations

from nsq_proto import Consumer, HttpRequest, LookupdError
from nsq_proto._lookupd_client import (
    MAX_LOOKUPD_FAILURES,
    LookupAnswered,
    LookupdClient,
    LookupdFailed,
    LookupdsLearned,
    NsqdAnswered,
    NsqdCallFailed,
)
from nsq_proto._timers import TimerKind, Timers

from .helpers import PARTITIONED_LOOKUP, http_response, of_type, requests_by_target, standard_lookup

LISTLOOKUP = (
    b'{"status_code":200,"status_txt":"OK","data":{"lookupdnodes":['
    b'{"ID":"1","NodeIP":"l1","TcpPort":"4160","HttpPort":"4161","RpcPort":"4162"},'
    b'{"ID":"2","NodeIP":"l2","TcpPort":"4160","HttpPort":"4161","RpcPort":"4162"}]}}'
)


def client(
    *addresses: tuple[str, int], timeout: float = 5.0
) -> tuple[LookupdClient, list[HttpRequest], Timers]:
    sent: list[HttpRequest] = []
    timers = Timers()
    lookupd = LookupdClient(
        list(addresses), timeout=timeout, user_agent="ua", timers=timers, send=sent.append
    )
    return lookupd, sent, timers


def path_of(request: HttpRequest) -> str:
    return request.data.split(b" ", 2)[1].split(b"?")[0].decode()


def test_a_lookup_asks_every_lookupd_and_arms_a_timeout_for_each() -> None:
    lookupd, sent, timers = client(("l1", 4161), ("l2", 4161), timeout=5.0)
    lookupd.lookup("t", "r", 10.0)
    assert [(r.host, r.port, path_of(r)) for r in sent] == [
        ("l1", 4161, "/lookup"),
        ("l2", 4161, "/lookup"),
    ]
    assert [r.request_id for r in sent] == [1, 2] and {r.timeout for r in sent} == {5.0}
    assert b"topic=t" in sent[0].data and b"access=r" in sent[0].data
    assert b"User-Agent: ua" in sent[0].data
    assert timers.deadline((TimerKind.HTTP_TIMEOUT, 1)) == 15.0
    assert lookupd.looking_up("t") and not lookupd.looking_up("other")


def test_an_answer_read_in_pieces_comes_back_once_complete_and_ends_its_call() -> None:
    lookupd, sent, timers = client(("l", 4161))
    lookupd.lookup("t", "w", 0.0)
    rid = sent[0].request_id
    data = http_response(standard_lookup("n1"))
    assert lookupd.http_data(rid, data[:10], 0.1) is None
    answer = lookupd.http_data(rid, data[10:], 0.2)
    assert isinstance(answer, LookupAnswered)
    assert answer.address == ("l", 4161) and answer.topic == "t"
    assert [p.address for p in answer.result.producers] == [("n1", 4150)]
    assert (TimerKind.HTTP_TIMEOUT, rid) not in timers
    assert not lookupd.looking_up("t")
    assert lookupd.http_data(rid, b"", 0.3) is None  # the call is over: ignored


def test_an_unusable_answer_is_a_failure_lookupd_gave() -> None:
    lookupd, sent, timers = client(("l", 4161))
    lookupd.lookup("t", "r", 0.0)
    answer = lookupd.http_data(sent[0].request_id, http_response(b"{", b"500 Oops"), 0.1)
    assert isinstance(answer, LookupdFailed)
    assert answer.answered and answer.topic == "t" and answer.address == ("l", 4161)
    assert isinstance(answer.error, LookupdError)
    assert not timers.deadline((TimerKind.HTTP_TIMEOUT, sent[0].request_id))


def test_a_timed_out_call_fails_unanswered_and_a_late_answer_is_ignored() -> None:
    lookupd, sent, _ = client(("l", 4161))
    lookupd.lookup("t", "r", 0.0)
    rid = sent[0].request_id
    answer = lookupd.timed_out(rid)
    assert isinstance(answer, LookupdFailed) and not answer.answered
    assert str(answer.error) == "lookupd request timed out"
    assert lookupd.http_data(rid, http_response(standard_lookup()), 1.0) is None
    assert lookupd.timed_out(rid) is None


def test_a_transport_failure_is_a_lookupd_error_caused_by_it() -> None:
    lookupd, sent, _ = client(("l", 4161))
    lookupd.lookup("t", "r", 0.0)
    cause = OSError("refused")
    answer = lookupd.http_failed(sent[0].request_id, cause)
    assert isinstance(answer, LookupdFailed) and not answer.answered
    assert str(answer.error) == "lookupd request failed: refused"
    assert answer.error.__cause__ is cause
    assert lookupd.http_failed(99, cause) is None


def test_a_partitioned_answer_asks_the_configured_lookupd_for_the_cluster_once_a_round() -> None:
    lookupd, sent, _ = client(("l1", 4161))
    lookupd.refresh_cluster(0.0)  # no cluster seen yet: nothing
    assert sent == []
    lookupd.lookup("t", "r", 0.0)
    answer = lookupd.http_data(sent[0].request_id, http_response(PARTITIONED_LOOKUP), 0.1)
    assert isinstance(answer, LookupAnswered) and set(answer.result.partitions) == {0, 1}
    (listlookup,) = sent[1:]
    assert path_of(listlookup) == "/listlookup"
    lookupd.refresh_cluster(0.2)  # one round at a time
    assert len(sent) == 2
    learned = lookupd.http_data(listlookup.request_id, http_response(LISTLOOKUP), 0.3)
    assert learned == LookupdsLearned((("l2", 4161),))
    assert lookupd.addresses == [("l1", 4161), ("l2", 4161)]
    assert lookupd.seeds == [("l1", 4161)]
    lookupd.refresh_cluster(0.4)  # the round is over: the next one only asks the seeds
    assert [(r.host, path_of(r)) for r in sent[2:]] == [("l1", "/listlookup")]
    again = lookupd.http_data(sent[2].request_id, http_response(LISTLOOKUP), 0.5)
    assert again is None  # nothing new
    lookupd.lookup("t", "r", 0.6)
    assert [r.host for r in sent[3:]] == ["l1", "l2"]


def test_a_call_to_nsqd_in_flight_holds_back_the_listlookup_round() -> None:
    lookupd, sent, _ = client(("l1", 4161))
    lookupd.post(("n1", 4151), "/channel/setoffset", {"topic": "t"}, b"x", 0.0)
    lookupd.list_lookupds(0.0)
    assert [path_of(r) for r in sent] == ["/channel/setoffset"]


def test_a_learned_lookupd_that_stops_answering_is_dropped_and_a_configured_one_is_kept() -> None:
    lookupd, sent, _ = client(("l1", 4161))
    lookupd.list_lookupds(0.0)
    assert isinstance(
        lookupd.http_data(sent[0].request_id, http_response(LISTLOOKUP), 0.1), LookupdsLearned
    )
    for attempt in range(MAX_LOOKUPD_FAILURES):
        assert lookupd.addresses == [("l1", 4161), ("l2", 4161)]
        first = len(sent)
        lookupd.lookup("t", "r", 1.0 + attempt)
        for request in sent[first:]:
            lookupd.timed_out(request.request_id)
    assert lookupd.addresses == [("l1", 4161)]


def test_a_refusal_is_an_answer_and_starts_the_count_of_unanswered_calls_again() -> None:
    lookupd, sent, _ = client(("l1", 4161))
    lookupd.list_lookupds(0.0)
    lookupd.http_data(sent[0].request_id, http_response(LISTLOOKUP), 0.1)

    def lookup_l2() -> int:
        first = len(sent)
        lookupd.lookup("t", "r", 1.0)
        (request,) = [r for r in sent[first:] if r.host == "l2"]
        return request.request_id

    for _ in range(MAX_LOOKUPD_FAILURES - 1):
        lookupd.timed_out(lookup_l2())
    lookupd.http_data(lookup_l2(), http_response(b"{}", b"500 Oops"), 2.0)
    for _ in range(MAX_LOOKUPD_FAILURES - 1):
        lookupd.timed_out(lookup_l2())
    assert ("l2", 4161) in lookupd.addresses


def test_a_call_to_nsqd_answers_with_its_status_and_body_whatever_they_are() -> None:
    lookupd, sent, timers = client(("l", 4161), timeout=2.0)
    rid = lookupd.post(("n1", 4151), "/channel/create", {"topic": "t", "partition": 1}, b"", 3.0)
    (request,) = sent
    assert (request.host, request.port, path_of(request)) == ("n1", 4151, "/channel/create")
    assert request.data.startswith(b"POST /channel/create?topic=t&partition=1 ")
    assert timers.deadline((TimerKind.HTTP_TIMEOUT, rid)) == 5.0
    answer = lookupd.http_data(rid, http_response(b"nope", b"404 Not Found"), 3.1)
    assert answer == NsqdAnswered(rid, 404, b"nope")
    assert (TimerKind.HTTP_TIMEOUT, rid) not in timers


def test_a_call_to_nsqd_cut_short_fails_and_counts_against_no_lookupd() -> None:
    lookupd, _, _ = client(("l", 4161))
    rid = lookupd.post(("n1", 4151), "/channel/setoffset", {}, b"x", 0.0)
    assert lookupd.http_data(rid, b"HTTP/1.1 200 OK\r\n", 0.1) is None
    answer = lookupd.http_data(rid, b"", 0.2)
    assert isinstance(answer, NsqdCallFailed) and answer.request_id == rid
    assert str(answer.error).startswith("the connection closed before the end of the HTTP")
    rid = lookupd.post(("n1", 4151), "/channel/setoffset", {}, b"x", 0.0)
    answer = lookupd.timed_out(rid)
    assert isinstance(answer, NsqdCallFailed) and answer.request_id == rid
    assert str(answer.error) == "lookupd request timed out"
    assert lookupd.addresses == [("l", 4161)]


def test_cancel_all_ends_every_call_in_the_order_sent() -> None:
    lookupd, _, timers = client(("l1", 4161), ("l2", 4161))
    lookupd.lookup("t", "r", 0.0)
    rid = lookupd.post(("n1", 4151), "/channel/setoffset", {}, b"x", 0.0)
    error = LookupdError("stopping")
    answers = lookupd.cancel_all(error)
    assert [type(a) for a in answers] == [LookupdFailed, LookupdFailed, NsqdCallFailed]
    assert all(isinstance(a, LookupdFailed | NsqdCallFailed) and a.error is error for a in answers)
    assert isinstance(answers[2], NsqdCallFailed) and answers[2].request_id == rid
    assert timers.next_deadline() is None
    assert lookupd.cancel_all(error) == []
    assert not lookupd.looking_up("t")


def test_listlookup_adds_the_clusters_other_lookupd_to_the_polls() -> None:
    core = Consumer("t", "c", lookupd_http_addresses=["l1:4161"])
    core.start(0.0)
    (lookup,) = of_type(core.outputs(), HttpRequest)
    core.http_data(lookup.request_id, http_response(PARTITIONED_LOOKUP), 0.1)
    listlookup = requests_by_target(core.outputs())[("l1", "/listlookup")]
    nodes = (
        b'{"status_code":200,"status_txt":"OK","data":{"lookupdnodes":['
        b'{"ID":"1","NodeIP":"l1","TcpPort":"4160","HttpPort":"4161","RpcPort":"4162"},'
        b'{"ID":"2","NodeIP":"l2","TcpPort":"4160","HttpPort":"4161","RpcPort":"4162"}]}}'
    )
    core.http_data(listlookup.request_id, http_response(nodes), 0.2)
    assert core.outputs() == []
    core.handle_timer(0.2)  # a new lookupd: the topic is looked up everywhere at once
    assert {(h, p) for h, p in requests_by_target(core.outputs())} == {
        ("l1", "/lookup"),
        ("l2", "/lookup"),
        ("l1", "/listlookup"),
    }
