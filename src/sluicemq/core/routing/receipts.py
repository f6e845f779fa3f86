"""The receipt clock: callbacks waiting until what was appended so far is on disk.

Receipts, DISCONNECT and staged publications wait on it; a failed write turns the waits it
covers into errors instead of receipts.

Receipts also follow dispatch: before the session of a connection that consumes (has a
subscription) handles a frame that asks for a receipt, the broker runs the dispatch pass that
is scheduled, if any (``Broker.settle_dispatch``); nothing can be owed to one that consumes
nothing, and running the pass per receipted SEND halved a pipelined stream. So
once a client holds a RECEIPT, every MESSAGE that frames handled before that frame - on this
connection, or on another that had its own RECEIPT first - made deliverable to this
connection came before it (up to one pass's per-queue budget, 64). "Nothing was delivered"
is then a fact a client reads after a round trip, not a guess after a quiet while. Why not
leave it to the event loop's order: frames of one read are handled together, before a pass
scheduled by the first of them runs. What the frame itself makes deliverable (a SUBSCRIBE's
backlog, a SEND to the sender's own subscription) may come after its RECEIPT, as before.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from sluicemq.storage.store import Store

Waiter = Callable[[BaseException | None], None]


class DurableWaits:
    """Waiters in the order they came, each with the sequence number it waits for.

    A first-in first-out line, not a heap: each waits for the newest record appended when it
    came, and that number only grows, so the line is already sorted (every receipted
    persistent SEND passes through here twice)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._waiters: deque[tuple[int, Waiter]] = deque()

    def add(self, callback: Waiter) -> None:
        """Call back once everything appended so far is on disk."""
        seq = self.store.flush()
        if seq <= self.store.durable_seq:
            callback(None)
            return
        self._waiters.append((seq, callback))

    def durable(self, seq: int) -> None:
        waiters = self._waiters
        while waiters and waiters[0][0] <= seq:
            waiters.popleft()[1](None)

    def failed(self, first: int, last: int, exc: BaseException) -> None:
        """Records [first, last] never reached the disk: their waiters get ``exc``."""
        failing = [cb for seq, cb in self._waiters if first <= seq <= last]
        self._waiters = deque(e for e in self._waiters if not first <= e[0] <= last)
        for callback in failing:  # (one may add a waiter: it goes after those kept)
            callback(exc)
