"""Spec of the store's group-commit turns (``Store._end_turn``): under load a batch fills
while loop iterations add to it, then is synced in place once an iteration was quiet; a batch
that kept the loop busy, or a stream's chunks, go to the writer thread as before."""

from __future__ import annotations

import queue
from collections.abc import Callable
from typing import Any

from sluicemq.storage.store import FILL_LOOKS, INLINE_BYTES, Store


class HandLoop:
    """The loop's two ways in, run by hand: ``iteration`` runs what was scheduled before it
    (not what those callbacks schedule) after the writer thread's reports, as a loop does."""

    def __init__(self) -> None:
        self.now = 100.0
        self.soon: list[Callable[[], object]] = []
        self.reports: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...]]] = (
            queue.SimpleQueue())

    def clock(self) -> float:
        return self.now

    def call_soon_threadsafe(self, fn: Callable[..., Any], *args: Any) -> None:
        self.reports.put((fn, args))

    def iteration(self, seconds: float) -> None:
        """One loop iteration that took ``seconds``."""
        self.now += seconds
        while not self.reports.empty():
            fn, args = self.reports.get()
            fn(*args)
        ready = list(self.soon)
        self.soon.clear()  # (the store holds this list's append)
        for fn in ready:
            fn()

    def report(self, timeout: float = 10.0) -> None:
        """Wait for the writer thread's next report and run it."""
        fn, args = self.reports.get(timeout=timeout)
        fn(*args)


def loaded_store(open_journal: Callable[..., Any]) -> tuple[Store, HandLoop]:
    """A store whose recent group commits held 20 records each (a loaded broker)."""
    opened = open_journal(start=False, segment_bytes=4 << 20)
    loop = HandLoop()
    store = Store(opened.journal, loop.soon.append, clock=loop.clock)
    store.start(loop.call_soon_threadsafe)
    for _ in range(3):
        last = append(store, 20)
        while store.durable_seq < last:
            loop.iteration(0.001)  # busy iterations: each batch goes to the writer
            if store.durable_seq < last and not loop.soon:
                loop.report()
    assert store.journal.loaded
    return store, loop


def append(store: Store, count: int, size: int = 1024) -> int:
    for _ in range(count):
        store.append_message("q", store.appended_seq + 1, 0, 0, 4, {}, b"x" * size)
    return store.appended_seq


def test_a_loaded_batch_fills_then_is_synced_in_place_once_an_iteration_is_quiet(
        open_journal) -> None:
    store, loop = loaded_store(open_journal)
    journal = store.journal
    batches = journal.stats.batches
    append(store, 8)
    loop.iteration(0.0002)  # the turn that parsed the first SENDs
    assert journal.pending_records == 8 and journal.writer_idle  # waits: more may come
    last = append(store, 56)
    loop.iteration(0.001)  # a busy iteration added to it
    assert journal.pending_records == 64 and store.durable_seq < last
    loop.iteration(0.00001)  # nothing added, little done: the loop would idle
    assert store.durable_seq == journal.durable_seq == last  # synced before it returned
    assert journal.stats.batches == batches + 1 and journal.stats.last_batch == 64
    assert loop.reports.empty()  # no hop through the writer thread


def test_a_batch_whose_last_iteration_was_busy_goes_to_the_writer(open_journal) -> None:
    store, loop = loaded_store(open_journal)
    last = append(store, 8)
    loop.iteration(0.0002)
    loop.iteration(0.001)  # nothing added, but the loop was busy with other work
    assert store.durable_seq < last
    loop.report()  # the writer thread committed it
    assert store.durable_seq == last


def test_a_batch_fills_for_a_bounded_number_of_iterations(open_journal) -> None:
    store, loop = loaded_store(open_journal)
    journal = store.journal
    first = append(store, 4)
    loop.iteration(0.0002)
    for _ in range(FILL_LOOKS):
        append(store, 4)
        loop.iteration(0.001)  # records keep coming, the loop stays busy
    assert store.durable_seq < first  # waited FILL_LOOKS iterations after the first look
    assert not journal.writer_idle or journal.pending_records == 0  # then handed over
    while store.durable_seq < store.appended_seq:
        loop.report()


def test_a_streams_chunks_go_to_the_writer_at_once(open_journal) -> None:
    store, loop = loaded_store(open_journal)
    last = append(store, 2, size=INLINE_BYTES)
    loop.iteration(0.00001)
    assert store.durable_seq < last
    loop.report()
    assert store.durable_seq == last
