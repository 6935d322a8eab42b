"""A task that counts its turns, to see whether code that never awaits lets the loop run."""

from __future__ import annotations

import anyio.lowlevel


class Ticker:
    """:meth:`run` counts each turn the loop gives it; :meth:`mark` notes the count when
    something happens (a message taken, say)."""

    def __init__(self) -> None:
        self.ticks = 0
        #: the count at each :meth:`mark`
        self.seen_at: list[int] = []

    async def run(self) -> None:
        while True:
            self.ticks += 1
            await anyio.lowlevel.checkpoint()

    def mark(self) -> None:
        self.seen_at.append(self.ticks)

    def runs(self) -> list[int]:
        """How many marks each turn of the loop saw, in order. trio may reverse the order of
        the runnable tasks from one batch to the next (ticker, worker | worker, ticker), so
        two runs of a worker can see the same tick, never three."""
        return [self.seen_at.count(t) for t in sorted(set(self.seen_at))]
