"""A real journal and store for in-process specs of the storage layer and what sits on it.

Deferred store work (group-commit turns, batched ACKs, paced compaction copies) goes into
``calls`` and runs only in ``settle``: a spec decides when a loop turn happens. The journal's
writer thread is real; ``settle`` waits, bounded, for its reports (durable, failed), which
wake it - no polling.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

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
        self.reported = threading.Condition()  # the writer thread reported something
        self.loop_durability = loop_durability
        self.store.start(self._report)

    def _report(self, fn: Callable[..., None], *args: Any) -> None:
        """The store's call_soon_threadsafe, on the writer thread."""
        if self.loop_durability:
            self.calls.append(lambda: fn(*args))
        else:
            fn(*args)
        with self.reported:
            self.reported.notify_all()

    def settle(self) -> None:
        """Run deferred work until nothing is left and everything appended is durable."""
        deadline = time.monotonic() + WAIT_SECONDS
        while True:
            while self.calls:
                self.calls.pop(0)()
            with self.reported:  # checked under the lock the writer notifies with: no lost wake
                if self.calls:
                    continue
                if self.store.durable_seq >= self.store.appended_seq:
                    return
                left = deadline - time.monotonic()
                assert left > 0 and self.reported.wait(left), "journal never became durable"
