"""Saying so when a streaming query waits for a destination that does not exist.

A misspelt queue name looks, to a range read, exactly like an empty queue: the query would wait
forever without a word. The broker marks the head of a queue it does not have
(`sluice-destination-missing`, docs/replay-protocol.md section 2), and the planning worker
logs it - once at first sight, then every `every` seconds while it lasts, and once when the
queue appears - never on each of the ~80 idle `latestOffset` calls a second. A queue this query
has seen is no typo: when it goes missing later, the broker dropped it as idle once it was
empty (`idle-destination-seconds`), it comes back with the next SEND, and nothing is said.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

log = logging.getLogger("sluicemq.spark")


class DestinationWatch:
    """Remembers whether the destination was missing and when that was last logged."""

    def __init__(self, destination: str, *, every: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.destination = destination
        self.every = every
        self.clock = clock
        self._logged_at: float | None = None  # set while the destination is missing
        self._seen = False  # it existed once: a later absence is an idle queue reclaimed

    def observe(self, exists: bool) -> None:
        """Feed one head answer's `exists`."""
        if exists:
            self._seen = True
            if self._logged_at is not None:
                log.warning("%s exists now: reading it", self.destination)
                self._logged_at = None
            return
        if self._seen:
            return
        now = self.clock()
        if self._logged_at is None or now - self._logged_at >= self.every:
            log.warning("waiting for %s: it does not exist (nothing sent to it yet, or it was "
                        "emptied and dropped as idle; check option destination for a typo)",
                        self.destination)
            self._logged_at = now
