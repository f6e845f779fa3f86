"""Spec of the heap trimmer: when the broker gives freed heap back to the operating system.

Trimming walks the whole heap, so it must happen once per drained burst, never on every tick
and never while the broker still holds most of what it held.
"""

from __future__ import annotations

from sluicemq.core.paging.trim import HeapTrimmer, malloc_trim

MIB = 1 << 20


class Calls:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> None:
        self.n += 1


def test_a_drained_burst_is_trimmed_once_the_drain_is_over() -> None:
    calls = Calls()
    t = HeapTrimmer(calls)
    for used in (0, 50 * MIB, 200 * MIB, 120 * MIB, 60 * MIB):
        assert not t.observe(used)  # still holding more than a quarter of the peak
    assert not t.observe(10 * MIB)  # still falling: the drain may not be over
    assert not t.observe(10 * MIB)  # frames may still sit in socket buffers
    assert t.observe(10 * MIB)
    assert (calls.n, t.trims) == (1, 1)
    for _ in range(5):
        assert not t.observe(10 * MIB)  # the peak was reset: quiet ticks do nothing
    assert calls.n == 1


def test_a_small_burst_is_not_worth_a_trim() -> None:
    calls = Calls()
    t = HeapTrimmer(calls)
    t.observe(20 * MIB)
    assert not t.observe(0)
    assert calls.n == 0


def test_each_new_burst_is_trimmed_after_it_drains() -> None:
    calls = Calls()
    t = HeapTrimmer(calls)
    for used in (100 * MIB, 0, 0, 0, 100 * MIB, 0, 0, 0):
        t.observe(used)
    assert calls.n == 2


def test_without_a_c_library_trim_nothing_is_called_and_nothing_breaks() -> None:
    t = HeapTrimmer(None)
    t.observe(100 * MIB)
    t.observe(0)
    t.observe(0)
    assert not t.observe(0)
    assert not t.available


def test_glibc_trim_is_found_and_runs() -> None:
    trim = malloc_trim()
    assert trim is not None  # the broker's supported platform is glibc Linux
    trim()


def test_a_burst_between_two_looks_is_seen_through_the_peak() -> None:
    """The account remembers its peak since the last look: a burst that filled and drained
    between two ticks is trimmed after too."""
    calls = Calls()
    t = HeapTrimmer(calls)
    t.observe(0)
    t.observe(0, peak=100 * MIB)  # the burst came and went between these two looks
    for _ in range(3):
        t.observe(0)  # (the account's peak restarts from what is used at each look)
    assert calls.n == 1


def test_the_heap_is_trimmed_once_after_a_storm_of_connections_went() -> None:
    calls = Calls()
    t = HeapTrimmer(calls)
    for count in (3, 500, 11_000, 4_000, 10):
        assert not t.observe_connections(count)  # rising, or still falling
    assert not t.observe_connections(10)
    assert t.observe_connections(10)  # held still: the storm is over
    assert calls.n == 1
    for count in (10, 200, 10, 10, 10, 10):
        assert not t.observe_connections(count)  # a small wave is not worth it
    assert calls.n == 1
