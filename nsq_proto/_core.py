"""What the consumer and producer cores share: many connections behind one output queue."""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections import deque
from typing import Generic, Protocol, TypeVar

from ._connection import Connection
from ._errors import NSQError
from ._events import ConnId
from ._outputs import Output
from ._timers import Timers

__all__ = ["ClientCore", "MultiConnectionCore"]


class ClientCore(Protocol):
    """The interface every driver (an adapter, the in-memory network) uses on a core."""

    def start(self, now: float) -> None: ...
    def next_output(self) -> Output | None: ...
    def next_deadline(self) -> float | None: ...
    def handle_timer(self, now: float) -> None: ...
    def connection_made(self, conn_id: ConnId, now: float) -> None: ...
    def tls_established(self, conn_id: ConnId, now: float) -> None: ...
    def receive_data(self, conn_id: ConnId, data: bytes, now: float) -> None: ...
    def connection_lost(
        self, conn_id: ConnId, now: float, error: BaseException | None = None
    ) -> None: ...
    def http_data(self, request_id: int, data: bytes, now: float) -> None: ...
    def http_failed(self, request_id: int, error: BaseException, now: float) -> None: ...


class _HasConnection(Protocol):
    conn: Connection


R = TypeVar("R", bound=_HasConnection)


class MultiConnectionCore(ABC, Generic[R]):
    """Routes transport events to the right :class:`Connection` and moves its outputs (through
    :meth:`_pump`, where the subclass reacts to its events) to the one queue."""

    _conns: dict[ConnId, R]
    _outputs: deque[Output]
    _timers: Timers
    _now: float

    @abstractmethod
    def _pump(self, rec: R, now: float) -> None:
        """Move ``rec``'s outputs to the queue, reacting to its events."""

    def _after_input(self) -> None:
        """Called after bytes or a loss were fed in (the producer dispatches queued work)."""

    def _pump_all(self) -> None:
        # commands issued on a connection (RDY, FIN, ...) wait in its buffer until drained
        for rec in list(self._conns.values()):
            self._pump(rec, self._now)

    def next_output(self) -> Output | None:
        if not self._outputs:
            self._pump_all()
        return self._outputs.popleft() if self._outputs else None

    def outputs(self) -> list[Output]:
        self._pump_all()
        out = list(self._outputs)
        self._outputs.clear()
        return out

    def next_deadline(self) -> float | None:
        deadline = self._timers.next_deadline()
        for rec in self._conns.values():
            d = rec.conn.next_deadline()
            if d is not None and (deadline is None or d < deadline):
                deadline = d
        return deadline

    def _fire_connection_timers(self, now: float) -> None:
        for rec in list(self._conns.values()):
            d = rec.conn.next_deadline()
            if d is not None and d <= now:
                rec.conn.handle_timer(now)
                self._pump(rec, now)

    def connection_made(self, conn_id: ConnId, now: float) -> None:
        self._now = now
        rec = self._conns.get(conn_id)
        if rec is not None:
            rec.conn.connection_made(now)
            self._pump(rec, now)

    def tls_established(self, conn_id: ConnId, now: float) -> None:
        self._now = now
        rec = self._conns.get(conn_id)
        if rec is not None:
            rec.conn.tls_established(now)
            self._pump(rec, now)

    def receive_data(self, conn_id: ConnId, data: bytes, now: float) -> None:
        self._now = now
        rec = self._conns.get(conn_id)
        if rec is None:
            return
        # a protocol error has already queued Close + ConnectionClosed(error=...) on the
        # connection: one broken link must not break its neighbours
        with contextlib.suppress(NSQError):
            rec.conn.receive_data(data, now)
        self._pump(rec, now)
        self._after_input()

    def connection_lost(
        self, conn_id: ConnId, now: float, error: BaseException | None = None
    ) -> None:
        self._now = now
        rec = self._conns.get(conn_id)
        if rec is not None:
            rec.conn.connection_lost(now, error)
            self._pump(rec, now)
            self._after_input()


def reconnect_delay(attempt: int, base: float, cap: float, jitter: float, u: float) -> float:
    """``base``, then doubling per attempt up to ``cap``, less up to ``jitter`` of it (``u`` is
    a uniform draw from the core's random source)."""
    delay: float = min(cap, base * 2.0 ** (attempt - 1))
    return delay * (1 - jitter * u)
