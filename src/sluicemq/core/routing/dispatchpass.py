"""The dispatch pass: which queues changed since the last one, and the loop turn that delivers
from them, a budget a queue.

Why apart from the broker: it is the broker's one piece of scheduling state (the changed
queues, whether a pass is due, whether one is running) with rules of its own - a queue that
used its whole budget goes round again after the sockets were read, and a frame that asks for
a receipt has the due pass's dispatch run first (``settle``) - while the broker routes. Queues
reach ``schedule`` through ``Broker.schedule_dispatch``, bound to it once: they ask per message.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sluicemq.core.limits.turns import Turns
from sluicemq.core.routing.dispatch import dispatch
from sluicemq.core.routing.queue import Queue

DISPATCH_BUDGET = 64  # deliveries per queue per loop turn


class DispatchPass:
    """The queues waiting for a dispatch pass, and the pass (on a later loop turn)."""

    def __init__(self, schedule: Callable[[Callable[[], None]], Any],
                 now_ms: Callable[[], int], turns: Turns, after: Callable[[], None]) -> None:
        self._schedule = schedule
        self._now_ms = now_ms
        self._turns = turns  # told how long each pass's deliveries took
        self._after = after  # at the end of a pass (flow control: resume producers)
        self._dirty: dict[int, Queue] = {}
        self._scheduled = False
        self._running = False

    def is_dirty(self, queue: Queue) -> bool:
        """Is ``queue`` waiting for a dispatch pass?"""
        return id(queue) in self._dirty

    def schedule(self, queue: Queue) -> None:
        self._dirty[id(queue)] = queue
        if not self._scheduled:
            self._scheduled = True
            self._schedule(self.run)

    def run(self) -> None:
        """Dispatch every queue that changed. A queue that used its whole per-turn budget goes
        round again on the next loop turn, after the sockets were read: a busy consumer cannot
        starve producers (their receipts) or other connections."""
        self._scheduled = False
        for q in self._dispatch_dirty():
            self.schedule(q)
        self._after()

    def settle(self) -> None:
        """Run the scheduled pass's dispatch now, before a frame that asks for a receipt
        (``receipts.py``). The pass itself still runs later (what is left, resuming
        producers); nothing happens from inside a pass."""
        if self._scheduled and not self._running:
            for q in self._dispatch_dirty():
                self._dirty[id(q)] = q

    def _dispatch_dirty(self) -> list[Queue]:
        """Dispatch every changed queue; returns those that used their whole budget."""
        now = self._now_ms()
        again: list[Queue] = []
        turns = self._turns
        started, delivered = turns.clock(), 0
        self._running = True
        try:
            while self._dirty:
                batch = list(self._dirty.values())
                self._dirty.clear()
                for q in batch:
                    n = dispatch(q, now, max_deliveries=DISPATCH_BUDGET)
                    delivered += n
                    if n >= DISPATCH_BUDGET:
                        again.append(q)
        finally:
            self._running = False
        turns.dispatched(turns.clock() - started, delivered)
        return again
