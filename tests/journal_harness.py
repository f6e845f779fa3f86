"""A real journal and store for in-process specs of the storage layer and what sits on it.

Deferred store work (group-commit turns, batched ACKs, paced compaction copies) goes into
``calls`` and runs only in ``settle``: a spec decides when a loop turn happens. The journal's
writer thread is real; ``settle`` waits for it, bounded, on the durable sequence number.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from sluicemq.storage.journal import Journal
from sluicemq.storage.store import Store

WAIT_SECONDS = 10.0


class JournalHarness:
    """``loop_durability``: the writer thread's reports (durable, failed) wait for ``settle``
    like the deferred work, as on the broker's loop, so a spec can look at the state between
    an append and the store learning that it is durable."""

    def __init__(self, directory: Path, segment_bytes: int, *,
                 loop_durability: bool = False) -> None:
        self.calls: list[Callable[[], None]] = []
        self.journal = Journal(directory / "journal", sync=False, preallocate=False,
                               segment_bytes=segment_bytes)
        list(self.journal.recover())
        self.store = Store(self.journal, self.calls.append, inline_commit=False)
        if loop_durability:
            self.store.start(lambda fn, *args: self.calls.append(lambda: fn(*args)))
        else:
            self.store.start(lambda fn, *args: fn(*args))

    def settle(self) -> None:
        """Run deferred work until nothing is left and everything appended is durable."""
        deadline = time.monotonic() + WAIT_SECONDS
        while True:
            while self.calls:
                self.calls.pop(0)()
            if self.store.durable_seq >= self.store.appended_seq and not self.calls:
                return
            assert time.monotonic() < deadline, "journal never became durable"
            time.sleep(0.001)
