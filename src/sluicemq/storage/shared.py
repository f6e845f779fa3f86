"""Records several queues hold: how many of them still do, by message id.

Why: a topic's persistent message is one record that every durable subscription it reached
holds, and it leaves the store only when the last of them lets go. A COMMIT's credit for the
broker-wide store (``flow.Credit``) counts the bytes its ACKs free, so it has to know whether
an ACK of one subscription's copy is the last holder's (``holders``). Only records with more
than one holder are kept (a queue's message has one), so a broker without fan-out to several
durable subscriptions pays one truth test of an empty dict a removal.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable


class SharedRecords:
    """Holders by message id of the records more than one queue holds (the store keeps it)."""

    __slots__ = ("_low", "held")

    def __init__(self) -> None:
        self.held: dict[int, int] = {}  # message id -> holders (2 or more)
        # A dict keeps its table when entries go: once a drained backlog left it an eighth
        # full it is copied into one its size (as ``UserShares`` does).
        self._low = 0

    def add(self, mid: int, holds: int) -> None:
        """Record ``mid`` was appended held by ``holds`` queues (one: nothing to keep)."""
        if holds > 1:
            held = self.held
            held[mid] = holds
            if len(held) >> 3 > self._low:
                self._low = len(held) >> 3

    def release(self, mid: int) -> None:
        """One holder of ``mid`` let go (a record held once is not kept: ignored)."""
        held = self.held
        n = held.get(mid)
        if n is None:
            return
        if n > 2:
            held[mid] = n - 1
            return
        del held[mid]
        if len(held) < self._low:
            self.held = dict(held)
            self._low = len(held) >> 3

    def release_run(self, mids: array | Iterable[int]) -> None:
        release = self.release
        for mid in mids:
            release(mid)

    def holders(self, mid: int) -> int:
        """How many queues hold the stored record of ``mid`` (1 unless several do)."""
        return self.held.get(mid, 1)

    def recount(self, mids: Iterable[int]) -> int:
        """Start-up: the holders again, from every held message id of the queues that may
        share records (a durable subscription's), once per holder; returns the records found
        shared."""
        seen: dict[int, int] = {}
        for mid in mids:
            seen[mid] = seen.get(mid, 0) + 1
        self.held = {mid: n for mid, n in seen.items() if n > 1}
        self._low = len(self.held) >> 3
        return len(self.held)
