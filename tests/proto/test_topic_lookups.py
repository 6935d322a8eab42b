"""The producer's topic lookups (``_topic_lookups.py``) alone: lookups out, their answers
turned into the nsqd to connect to or the failure of a refused topic, with no producer
around them."""

from __future__ import annotations

from nsq_proto import HttpRequest, LookupdError, LookupFailed, LookupResult, ProducerConfig
from nsq_proto._lookupd_schedule import LOOKUP_RETRY_DELAY
from nsq_proto._outputs import Output
from nsq_proto._routes import Routes
from nsq_proto._timers import TimerKind, Timers
from nsq_proto._topic_lookups import Refused, Routed, TopicLookups

from .helpers import PARTITIONED_LOOKUP, http_response, of_type, standard_lookup

REFUSAL = http_response(
    b'{"status_code":500,"status_txt":"TOPIC_NOT_READY","data":null}',
    b"500 Internal Server Error",
)


class Setup:
    def __init__(
        self,
        *lookupd: tuple[str, int],
        nsqd: list[tuple[str, int]] | None = None,
        interval: float = 60.0,
    ) -> None:
        self.sent: list[Output] = []
        self.timers = Timers()
        self.routes = Routes(lookupd=bool(lookupd), hasher=None)
        self.nsqd: list[tuple[str, int]] = [] if nsqd is None else nsqd
        config = ProducerConfig(lookupd_poll_interval=interval, lookupd_poll_timeout=5.0)
        self.lookups = TopicLookups(
            config,
            self.nsqd,
            list(lookupd),
            self.routes,
            timers=self.timers,
            send=self.sent.append,
        )

    def requests(self) -> list[HttpRequest]:
        """The HTTP requests sent since the last call (other outputs stay)."""
        found = of_type(self.sent, HttpRequest)
        self.sent[:] = [o for o in self.sent if not isinstance(o, HttpRequest)]
        return found

    def reply(self, request: HttpRequest, body: bytes, now: float) -> Routed | Refused | None:
        answer = self.lookups.client.http_data(request.request_id, body, now)
        return self.lookups.answer(answer, now)

    def poll_at(self, topic: str) -> float | None:
        return self.timers.deadline((TimerKind.LOOKUPD_POLL, topic))


def test_a_topic_is_looked_up_on_every_lookupd_once_until_answered() -> None:
    s = Setup(("l1", 4161), ("l2", 4161))
    s.lookups.lookup("t", 0.0)
    s.lookups.lookup("t", 0.1)  # under way: not asked twice
    first = s.requests()
    assert [(r.host, r.port) for r in first] == [("l1", 4161), ("l2", 4161)]
    assert all(b"topic=t" in r.data and b"access=w" in r.data for r in first)
    s.lookups.lookup("other", 0.2)  # another topic is its own lookup
    assert len(s.requests()) == 2
    assert s.reply(first[0], http_response(PARTITIONED_LOOKUP), 0.3) == Routed(
        (), (("n1", 4150), ("n2", 4150))
    )
    # the cluster's lookupd are asked for (the partitioned cluster answered)
    assert [b"/listlookup" in r.data for r in s.requests()] == [True, True]
    s.lookups.lookup("t", 0.4)  # l2 has not answered yet
    assert s.requests() == []
    s.reply(first[1], http_response(PARTITIONED_LOOKUP), 0.5)
    s.lookups.lookup("t", 0.6)  # answered: asked again
    assert [b"/lookup?" in r.data and b"topic=t" in r.data for r in s.requests()] == [True, True]


def test_an_answer_fills_the_routes_and_refreshes_them_an_interval_later() -> None:
    s = Setup(("l", 4161), interval=30.0)
    s.lookups.lookup("t", 0.0)
    (request,) = s.requests()
    assert s.reply(request, http_response(PARTITIONED_LOOKUP), 2.0) == Routed(
        (), (("n1", 4150), ("n2", 4150))
    )
    assert s.routes.partitioned("t") and s.routes.leaders() == [("n1", 4150), ("n2", 4150)]
    assert s.poll_at("t") == 32.0


def test_an_answer_listing_no_partition_keeps_the_known_ones() -> None:
    s = Setup(("l", 4161), interval=30.0)
    s.lookups.lookup("t", 0.0)
    s.reply(s.requests()[0], http_response(PARTITIONED_LOOKUP), 1.0)
    s.lookups.lookup("t", 32.0)
    (request,) = (r for r in s.requests() if b"/lookup?" in r.data)
    assert s.reply(request, http_response(b'{"channels":[],"producers":[]}'), 33.0) == Routed()
    assert s.routes.leaders() == [("n1", 4150), ("n2", 4150)]
    assert s.poll_at("t") == 31.0  # no refresh on an answer kept out


def test_a_standard_servers_nsqd_are_named_while_the_producer_has_none() -> None:
    s = Setup(("l", 4161))
    s.lookups.lookup("t", 0.0)
    (request,) = s.requests()
    routed = s.reply(request, http_response(standard_lookup("n1", "n2", "n1")), 1.0)
    assert routed == Routed((("n1", 4150), ("n2", 4150)))  # once each
    assert s.routes.known("t") and not s.routes.partitioned("t")
    s.nsqd.extend(routed.nsqd)  # what the producer does with them
    s.lookups.lookup("u", 2.0)
    (request,) = s.requests()
    assert s.reply(request, http_response(standard_lookup("n3")), 3.0) == Routed()


def test_a_failed_lookup_is_an_event_and_asked_again_a_little_later() -> None:
    s = Setup(("l", 4161))
    s.lookups.lookup("t", 0.0)
    (request,) = s.requests()
    answer = s.lookups.client.timed_out(request.request_id)
    assert s.lookups.answer(answer, 5.0) is None
    (failed,) = of_type(s.sent, LookupFailed)
    assert failed.address == ("l", 4161) and isinstance(failed.error, LookupdError)
    assert s.lookups.error("t") is failed.error
    assert s.poll_at("t") == 5.0 + LOOKUP_RETRY_DELAY
    s.lookups.lookup("t", 6.0)  # no longer under way
    (request,) = s.requests()
    s.reply(request, http_response(PARTITIONED_LOOKUP), 7.0)
    assert s.lookups.error("t") is None


def test_a_topic_refused_twice_fails_its_publishes_with_the_answer() -> None:
    s = Setup(("l", 4161))
    s.lookups.lookup("t", 0.0)
    assert s.reply(s.requests()[0], REFUSAL, 0.1) is None  # once: asked again
    s.lookups.lookup("t", 1.1)
    refused = s.reply(s.requests()[0], REFUSAL, 1.2)
    assert isinstance(refused, Refused) and refused.topic == "t"
    assert str(refused.error).startswith("no route to topic 't': ")
    assert isinstance(refused.error.__cause__, LookupdError)
    assert len(of_type(s.sent, LookupFailed)) == 2
    s.lookups.lookup("t", 2.2)  # the count starts again
    assert s.reply(s.requests()[0], REFUSAL, 2.3) is None


def test_timeouts_are_no_refusals() -> None:
    s = Setup(("l", 4161))
    for now in (0.0, 10.0, 20.0):
        s.lookups.lookup("t", now)
        (request,) = s.requests()
        assert s.lookups.answer(s.lookups.client.timed_out(request.request_id), now + 5) is None


def test_one_lookupd_refusing_while_another_is_asked_decides_nothing_yet() -> None:
    s = Setup(("l1", 4161), ("l2", 4161))
    s.lookups.lookup("t", 0.0)
    first, second = s.requests()
    assert s.reply(first, REFUSAL, 0.1) is None
    assert s.poll_at("t") is None  # l2 may still answer
    s.lookups.lookup("t", 0.2)
    assert s.requests() == []
    assert s.reply(second, http_response(PARTITIONED_LOOKUP), 0.3) == Routed(
        (), (("n1", 4150), ("n2", 4150))
    )


def test_a_known_route_is_no_lookup_error() -> None:
    s = Setup(("l", 4161))
    s.routes.apply("t", LookupResult())
    s.lookups.lookup("t", 0.0)
    s.lookups.answer(s.lookups.client.timed_out(s.requests()[0].request_id), 5.0)
    assert s.lookups.error("t") is None
    assert s.lookups.error("unknown") is None


def test_a_changed_topology_forgets_the_route_and_looks_it_up_again() -> None:
    s = Setup(("l", 4161))
    s.routes.apply("t", LookupResult())
    s.lookups.forget("t", 0.0)
    assert not s.routes.known("t")
    (request,) = s.requests()
    assert b"topic=t" in request.data
    alone = Setup()  # without lookupd: forgotten, nobody to ask
    alone.routes.apply("t", LookupResult())
    alone.lookups.forget("t", 0.0)
    assert not alone.routes.known("t") and alone.requests() == []


def test_no_lookup_once_closed() -> None:
    s = Setup(("l", 4161))
    s.lookups.lookup("t", 0.0)
    (request,) = s.requests()
    s.lookups.close()
    s.lookups.lookup("u", 1.0)
    s.lookups.forget("t", 1.0)
    assert s.requests() == []
    # an answer still in flight is taken (nothing is asked after it)
    assert s.lookups.answer(s.lookups.client.timed_out(request.request_id), 5.0) is None
    s.lookups.lookup("t", 6.0)
    assert s.requests() == []


def test_the_clusters_lookupd_list_decides_nothing_for_a_topic() -> None:
    s = Setup(("l", 4161))
    s.lookups.lookup("t", 0.0)
    s.reply(s.requests()[0], http_response(PARTITIONED_LOOKUP), 1.0)
    (listing,) = s.requests()  # the partitioned cluster answered: its lookupd are asked for
    assert b"/listlookup" in listing.data
    assert s.lookups.answer(s.lookups.client.timed_out(listing.request_id), 6.0) is None
    (failed,) = of_type(s.sent, LookupFailed)  # an event, and no topic's failure
    assert failed.address == ("l", 4161) and s.lookups.error("t") is None
    s.lookups.lookup("t", 7.0)
    listing = next(r for r in s.requests() if b"/listlookup" in r.data)
    learned = http_response(
        b'{"status_code":200,"status_txt":"OK","data":{"lookupdnodes":['
        b'{"ID":"2","NodeIP":"l2","TcpPort":"4160","HttpPort":"4161","RpcPort":"4162"}]}}'
    )
    assert s.reply(listing, learned, 8.0) is None
    assert s.lookups.client.addresses == [("l", 4161), ("l2", 4161)]  # asked from now on
