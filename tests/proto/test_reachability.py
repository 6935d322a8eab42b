"""The producer's failure diagnosis (``_reachability.py``) alone: which places failed how,
and when a publish should fail at once with the causes."""

from __future__ import annotations

from nsq_proto import AuthRequired, ConnectionClosedError
from nsq_proto._reachability import Place, Reachability

A: Place = (("10.0.0.1", 4150), 0)
A1: Place = (("10.0.0.1", 4150), 1)
B: Place = (("10.0.0.2", 4150), 0)


def refused(place: Place) -> ConnectionClosedError:
    error = ConnectionClosedError(f"connecting to {place[0][0]}:{place[0][1]} failed")
    error.__cause__ = ConnectionRefusedError("connection refused")
    return error


def test_nothing_failed_is_no_diagnosis() -> None:
    reach = Reachability()
    assert not reach.failing
    assert reach.diagnosis({A, B}, set()) is None
    # a clean close is no failure
    reach.closed(A, None, was_connected=True)
    assert not reach.failing


def test_every_place_refused_names_each_cause() -> None:
    reach = Reachability()
    reach.closed(A, refused(A), was_connected=False)
    assert reach.failing
    assert reach.diagnosis({A, B}, set()) is None  # B may still take it
    reach.closed(B, refused(B), was_connected=False)
    failure = reach.diagnosis({A, B}, set())
    assert isinstance(failure, ConnectionClosedError)
    assert str(failure) == (
        "could not connect to any nsqd: 10.0.0.1:4150: connection refused; "
        "10.0.0.2:4150: connection refused"
    )
    assert isinstance(failure.__cause__, ConnectionClosedError)


def test_a_place_being_tried_again_or_reached_keeps_publishes_waiting() -> None:
    reach = Reachability()
    reach.closed(A, refused(A), was_connected=False)
    reach.closed(B, refused(B), was_connected=False)
    assert reach.diagnosis({A, B}, {B}) is None  # an attempt at B is under way
    reach.connected(B)
    assert reach.diagnosis({A, B}, set()) is None
    reach.connected(A)
    assert not reach.failing


def test_a_loss_after_connecting_is_no_refusal() -> None:
    reach = Reachability()
    reach.closed(A, ConnectionClosedError("connection lost"), was_connected=True)
    assert not reach.failing
    assert reach.diagnosis({A}, set()) is None


def test_a_permanent_failure_everywhere_is_that_failure_until_ready_again() -> None:
    reach = Reachability()
    auth = AuthRequired("nsqd requires AUTH")
    reach.closed(A, auth, was_connected=True)
    reach.closed(A1, auth, was_connected=True)
    assert reach.diagnosis({A, A1}, set()) is auth
    # a permanent failure at one nsqd and a refusal at the other: the words of both
    reach.closed(B, refused(B), was_connected=False)
    failure = reach.diagnosis({A, A1, B}, set())
    assert isinstance(failure, ConnectionClosedError)
    assert str(failure) == (
        "could not connect to any nsqd: 10.0.0.1:4150: nsqd requires AUTH; "
        "10.0.0.2:4150: connection refused"
    )
    reach.ready(A)
    reach.ready(A1)
    reach.connected(B)
    assert not reach.failing and reach.diagnosis({A, A1, B}, set()) is None


def test_a_permanent_cause_is_found_in_the_chain() -> None:
    reach = Reachability()
    wrapped = ConnectionClosedError("TLS handshake failed")
    wrapped.__cause__ = AuthRequired("nsqd requires AUTH")
    reach.closed(A, wrapped, was_connected=True)
    assert reach.diagnosis({A}, set()) is wrapped.__cause__


def test_no_place_is_no_diagnosis() -> None:
    reach = Reachability()
    reach.closed(A, refused(A), was_connected=False)
    assert reach.diagnosis(set(), set()) is None
