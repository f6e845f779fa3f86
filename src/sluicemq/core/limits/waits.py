"""SENDs that wait for a destination to have a consumer (``sluice-stream-wait-consumer``).

Why bounded: each waiting SEND keeps its frame and its connection's answer alive; unbounded,
300,000 of them with a wait of 1e9 seconds held half a gigabyte long after their client had
gone. So a wait is at most ``max_consumer_wait_seconds`` long, a connection may have
``max_consumer_waits`` of them at once (an ERROR names the limit beyond), and a connection's
waits are dropped when it goes.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from sluicemq.config import Limits
from sluicemq.errors import ProtocolError

Ready = Callable[[int], None]


class ConsumerWaits:
    """Waits by deadline, counted per owner (a session); the broker checks them as consumers
    attach and once a second."""

    def __init__(self, limits: Limits, consumers: Callable[[str, str], int]) -> None:
        self.limits = limits
        self._consumers = consumers
        self._waits: list[tuple[float, str, str, Ready, object]] = []
        self._per_owner: dict[object, int] = {}

    def __len__(self) -> int:
        return len(self._waits)

    def add(self, now: float, kind: str, name: str, timeout: float, ready: Ready,
            owner: object = None) -> None:
        """Call ``ready`` with the consumer count once there is one, or at the (capped) timeout."""
        if math.isnan(timeout):
            raise ProtocolError("invalid wait for a consumer: not a number", fatal=False)
        count = self._consumers(kind, name)
        if count or timeout <= 0:
            ready(count)
            return
        held = self._per_owner.get(owner, 0)
        limit = self.limits.max_consumer_waits
        if owner is not None and held >= limit:
            raise ProtocolError(f"too many SENDs waiting for a consumer on this connection "
                                f"(limit {limit}, max_consumer_waits)", fatal=False)
        self._per_owner[owner] = held + 1
        timeout = min(timeout, self.limits.max_consumer_wait_seconds)
        self._waits.append((now + timeout, kind, name, ready, owner))

    def check(self, now: float) -> None:
        """Answer every wait whose destination has a consumer now or whose time is up."""
        if not self._waits:
            return
        keep, due = [], []
        for entry in self._waits:
            deadline, kind, name, ready, owner = entry
            count = self._consumers(kind, name)
            if count or now >= deadline:
                due.append((ready, count, owner))
            else:
                keep.append(entry)
        self._waits = keep
        for ready, count, owner in due:
            self._forget(owner)
            ready(count)

    def cancel(self, owner: object) -> None:
        """``owner`` is gone: drop its waits unanswered."""
        if self._per_owner.pop(owner, None) is not None:
            self._waits = [w for w in self._waits if w[4] is not owner]

    def _forget(self, owner: object) -> None:
        left = self._per_owner.get(owner, 0) - 1
        if left > 0:
            self._per_owner[owner] = left
        else:
            self._per_owner.pop(owner, None)
