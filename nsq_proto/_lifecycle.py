"""The life of a consumer, one state: :class:`Lifecycle`, and the moves between its states.

A consumer is created (:attr:`~Lifecycle.NEW`), started (:attr:`~Lifecycle.RUNNING`), and on
``stop()`` sends CLS everywhere and waits for the application's answers
(:attr:`~Lifecycle.STOPPING`); when the application can answer nothing more
(``requeue_unanswered``) everything held and everything still arriving is requeued at once
(:attr:`~Lifecycle.REQUEUEING`); once every connection is closed it is
:attr:`~Lifecycle.STOPPED`.  The consumer changes its state only through :func:`after_start`,
:func:`after_stop` and :func:`after_all_closed`; it reads :func:`is_stopping`.
"""

from __future__ import annotations

from enum import Enum
from typing import Final

from ._errors import LocalProtocolError

__all__ = [
    "NEW",
    "REQUEUEING",
    "RUNNING",
    "STOPPED",
    "STOPPING",
    "Lifecycle",
    "after_all_closed",
    "after_start",
    "after_stop",
    "is_stopping",
]


class Lifecycle(Enum):
    """Where a consumer is in its life."""

    # members are singletons: identity hashing is exact and much cheaper than Enum's
    __hash__ = object.__hash__

    #: created: connects to nothing yet
    NEW = "new"
    #: started: discovers, connects, subscribes, gives RDY
    RUNNING = "running"
    #: CLS sent: no new connection, no RDY; each connection closes once the application
    #: answered its messages (or after ``stop_timeout``)
    STOPPING = "stopping"
    #: stopping, and the application can answer nothing more: what it holds and what still
    #: arrives is requeued at once
    REQUEUEING = "requeueing"
    #: every connection is closed (``Stopped`` was reported)
    STOPPED = "stopped"


# the members as module names: ``Lifecycle.RUNNING`` is an attribute lookup on the enum's class,
# several times slower than a module name (the consumer reads them per message)
NEW: Final = Lifecycle.NEW
RUNNING: Final = Lifecycle.RUNNING
STOPPING: Final = Lifecycle.STOPPING
REQUEUEING: Final = Lifecycle.REQUEUEING
STOPPED: Final = Lifecycle.STOPPED


def after_start(state: Lifecycle) -> Lifecycle:
    """``start()``: once, and not once stopped."""
    if state is NEW:
        return RUNNING
    if state is STOPPED:
        raise LocalProtocolError("the consumer is stopped: it cannot start")
    raise LocalProtocolError("the consumer is already started")


def after_stop(state: Lifecycle, requeue_unanswered: bool) -> Lifecycle:
    """``stop()``: stopping from now on (requeueing, with ``requeue_unanswered``, until
    stopped); a stopped consumer stays stopped."""
    if state is STOPPED:
        return state
    if requeue_unanswered or state is REQUEUEING:
        return REQUEUEING
    return STOPPING


def after_all_closed(state: Lifecycle) -> Lifecycle:
    """Every connection of a stopping consumer is closed."""
    if not is_stopping(state):
        raise LocalProtocolError(f"a consumer {state.value} cannot have stopped")
    return STOPPED


def is_stopping(state: Lifecycle) -> bool:
    """``stop()`` was called (the consumer may have stopped since)."""
    return state is not RUNNING and state is not NEW
