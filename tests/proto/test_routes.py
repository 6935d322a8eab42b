"""The producer's routes (``_routes.py``) alone: where each topic's publishes go, filled from
parsed lookupd answers."""

from __future__ import annotations

from dataclasses import replace

from nsq_proto import LookupResult
from nsq_proto._routes import Routes

from .helpers import partitioned_result


def test_routes_keep_known_partitions_until_an_answer_lists_some() -> None:
    routes = Routes(lookupd=True, hasher=None)
    assert routes.apply("t", partitioned_result("n0")) == [("n0", 4150)]
    assert routes.apply("t", LookupResult()) is None
    assert routes.partitioned("t") and routes.wanted(("n0", 4150))
    assert routes.leaders() == [("n0", 4150)]
    routes.forget("t")
    assert not routes.known("t") and not routes.wanted(("n0", 4150))
    assert routes.apply("t", LookupResult()) == [] and not routes.partitioned("t")


def test_a_topic_is_extended_once_lookupd_says_it_takes_headers() -> None:
    routes = Routes(lookupd=True, hasher=None)
    assert not routes.extended("t")  # not looked up yet
    routes.apply("t", partitioned_result("n0"))
    assert not routes.extended("t")
    extended = partitioned_result("n0")
    assert extended.meta is not None
    routes.apply(
        "t",
        LookupResult(
            partitions=extended.partitions, meta=replace(extended.meta, extend_support=True)
        ),
    )
    assert routes.extended("t")
    routes.apply("plain", LookupResult())  # a standard server: no headers
    assert not routes.extended("plain")
    routes.forget("t")
    assert not routes.extended("t")
