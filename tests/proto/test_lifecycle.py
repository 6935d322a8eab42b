"""A consumer's life (``nsq_proto/_lifecycle.py``), alone: every move between its states, the
misuse each refuses; then the consumer's ``stopping``/``stopped`` read from it."""

from __future__ import annotations

import pytest

from nsq_proto import Consumer, LocalProtocolError, Stopped
from nsq_proto._lifecycle import (
    Lifecycle,
    after_all_closed,
    after_start,
    after_stop,
    is_stopping,
)

ALL = list(Lifecycle)


def test_a_consumer_starts_once() -> None:
    assert after_start(Lifecycle.NEW) is Lifecycle.RUNNING
    for state in (Lifecycle.RUNNING, Lifecycle.STOPPING, Lifecycle.REQUEUEING):
        with pytest.raises(LocalProtocolError, match=r"^the consumer is already started$"):
            after_start(state)
    with pytest.raises(LocalProtocolError, match=r"^the consumer is stopped: it cannot start$"):
        after_start(Lifecycle.STOPPED)


@pytest.mark.parametrize("state", [Lifecycle.NEW, Lifecycle.RUNNING, Lifecycle.STOPPING])
def test_stop_moves_to_stopping_or_requeueing(state: Lifecycle) -> None:
    assert after_stop(state, False) is Lifecycle.STOPPING
    assert after_stop(state, True) is Lifecycle.REQUEUEING


def test_requeueing_lasts_until_stopped_and_stopped_stays() -> None:
    assert after_stop(Lifecycle.REQUEUEING, False) is Lifecycle.REQUEUEING
    assert after_stop(Lifecycle.STOPPED, True) is Lifecycle.STOPPED
    assert after_stop(Lifecycle.STOPPED, False) is Lifecycle.STOPPED


def test_only_a_stopping_consumer_can_have_stopped() -> None:
    for state in (Lifecycle.STOPPING, Lifecycle.REQUEUEING, Lifecycle.STOPPED):
        assert is_stopping(state)
        assert after_all_closed(state) is Lifecycle.STOPPED
    for state in (Lifecycle.NEW, Lifecycle.RUNNING):
        assert not is_stopping(state)
        with pytest.raises(LocalProtocolError, match="cannot have stopped"):
            after_all_closed(state)
    assert len(ALL) == 5  # every state is covered above


def test_the_consumer_reads_its_life_from_one_state() -> None:
    core = Consumer("t", "c", nsqd_tcp_addresses=["h:4150"])
    assert (core.stopping, core.stopped) == (False, False)
    core.start(0.0)
    core.outputs()
    assert (core.stopping, core.stopped) == (False, False)
    core.stop(1.0)  # its one connection was never made: closed at once
    assert (core.stopping, core.stopped) == (True, True)
    assert [o for o in core.outputs() if isinstance(o, Stopped)] == [Stopped()]
    with pytest.raises(LocalProtocolError, match="the consumer is stopped: it cannot start"):
        core.start(2.0)
