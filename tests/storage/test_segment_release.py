"""A run of removed records (a ledger commit of a backlog) is let go of as counts per segment
and the newest (segment, offset) among them: the journal unpins exactly those records."""

from __future__ import annotations

from array import array
from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from sluicemq.storage.release import segment_release

records = st.lists(st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 2**63 - 1)),
                   min_size=1, max_size=300)


def test_counts_per_segment_and_the_newest_record() -> None:
    release = segment_release(array("I", [3, 1, 3, 2, 3]), array("Q", [10, 99, 50, 7, 20]))
    assert release.counts == {1: 1, 2: 1, 3: 3}
    assert release.newest == (3, 50)


@given(st.integers(0, 2**32 - 400), records)
def test_the_same_as_counting_one_record_at_a_time(base: int,
                                                   run: list[tuple[int, int]]) -> None:
    run = [(base + seg % 300, off) for seg, off in run]  # a run spans few, close segments
    segments = array("I", [s for s, _ in run])
    offsets = array("Q", [o for _, o in run])
    release = segment_release(segments, offsets)
    assert release.counts == dict(Counter(segments))
    assert release.newest == max(run)
