"""Spec of anchored memo tables against a real journal: an anchor that is what
keeps the oldest segment on disk moves to the head of the log as soon as releases leave that
segment to it - not on the next once-a-second tick - so the empty segments behind it go too."""

from __future__ import annotations

from pathlib import Path

from journal_harness import JournalHarness
from sluicemq.core.persistence.anchor import Anchor
from sluicemq.storage.staging_records import MEMO_PUBLISHED


class Harness(JournalHarness):
    def __init__(self, directory: Path) -> None:
        super().__init__(directory, segment_bytes=64 << 10)


def test_an_anchor_keeping_the_oldest_segment_moves_once_the_rest_is_released(
        tmp_path: Path) -> None:
    h = Harness(tmp_path)
    anchor = Anchor(h.store, MEMO_PUBLISHED, "published", lambda: [["sink", "b1", 1, 1]])
    h.store.reclaim_watchers.append(anchor.move_if_oldest)
    anchor.ensure()
    first = anchor.loc
    assert first is not None
    tickets = [h.store.append_message("q:q", mid, 0, 0, 4, {}, b"x" * 1000)
               for mid in range(1, 301)]  # ~300 KB: several 64 KiB segments after the anchor
    for t in tickets:
        h.store.hold(t)
    h.settle()
    assert len(h.journal.live_segments()) >= 5
    for mid, t in enumerate(tickets, 1):
        h.store.remove("q:q", mid, t)  # consumed: one ACK record, released once durable
    h.settle()  # no tick anywhere: only the release -> watcher -> move -> release chain
    assert anchor.rewrites == 2 and anchor.loc is not None
    assert anchor.loc.segment > first.segment
    assert first.segment not in h.journal.live_segments()
    assert len(h.journal.live_segments()) <= 2, h.journal.live_counts()


def test_an_anchor_that_is_not_the_oldest_holder_stays(tmp_path: Path) -> None:
    """A segment kept by live messages as well is not the anchor's doing: nothing is rewritten."""
    h = Harness(tmp_path)
    anchor = Anchor(h.store, MEMO_PUBLISHED, "published", lambda: [["sink", "b1", 1, 1]])
    h.store.reclaim_watchers.append(anchor.move_if_oldest)
    kept = [h.store.append_message("q:q", mid, 0, 0, 4, {}, b"x" * 1000) for mid in (1, 2, 3, 4)]
    for t in kept:
        h.store.hold(t)
    anchor.ensure()
    later = [h.store.append_message("q:q", mid, 0, 0, 4, {}, b"x" * 1000)
             for mid in range(5, 300)]
    for t in later:
        h.store.hold(t)
    h.settle()
    for mid, t in enumerate(later, 5):
        h.store.remove("q:q", mid, t)
    h.settle()
    assert anchor.rewrites == 1
