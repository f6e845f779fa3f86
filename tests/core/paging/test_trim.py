"""Spec of the heap trimmer: when the broker gives freed heap back to the operating system.

Trimming walks the whole heap, so it must happen once per drained burst, never on every tick
and never while the broker still holds most of what it held.
"""

from __future__ import annotations

from sluicemq.core.paging.trim import HeapTrimmer, heap_free, malloc_trim

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


def test_a_drained_burst_is_collected_before_the_heap_is_trimmed() -> None:
    """A full collection clears the interpreter's free lists, whose blocks keep CPython's
    small-object arenas (not glibc's heap) alive after a burst; then the trim."""
    order: list[str] = []
    t = HeapTrimmer(lambda: order.append("trim"), collect=lambda: order.append("collect"))
    for used in (200 * MIB, 10 * MIB, 10 * MIB, 10 * MIB):
        t.observe(used)
    assert order == ["collect", "trim"]
    for _ in range(5):
        t.observe(10 * MIB)
    assert order == ["collect", "trim"]  # quiet ticks neither collect nor trim


def test_the_end_of_recovery_is_collected_and_trimmed_once_where_the_c_library_trims() -> None:
    order: list[str] = []
    t = HeapTrimmer(lambda: order.append("trim"), collect=lambda: order.append("collect"))
    assert t.after_recovery()
    assert order == ["collect", "trim"] and t.trims == 1
    without = HeapTrimmer(None, collect=lambda: order.append("collect"))
    assert not without.after_recovery()
    assert order == ["collect", "trim"]


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
    calls, collections = Calls(), Calls()
    t = HeapTrimmer(calls, collect=collections)
    for count in (3, 500, 11_000, 4_000, 10):
        assert not t.observe_connections(count)  # rising, or still falling
    assert not t.observe_connections(10)
    assert t.observe_connections(10)  # held still: the storm is over
    assert (calls.n, collections.n) == (1, 1)  # its connections' cycles collected first
    for count in (10, 200, 10, 10, 10, 10):
        assert not t.observe_connections(count)  # a small wave is not worth it
    assert (calls.n, collections.n) == (1, 1)


class Heap:
    """The heap's free bytes as a spec sets them (mallinfo2's fordblks)."""

    def __init__(self) -> None:
        self.free = 0

    def __call__(self) -> int:
        return self.free


def test_freed_heap_is_trimmed_once_it_stopped_growing() -> None:
    """Frames a stuck subscriber's transport held are neither queued bytes nor a storm of
    connections: the heap's own free bytes tell that they went."""
    calls, heap = Calls(), Heap()
    t = HeapTrimmer(calls, free=heap)
    for free in (5 * MIB, 5 * MIB, 40 * MIB, 70 * MIB):
        heap.free = free
        assert not t.observe_heap()  # little free, or still growing: the frees go on
    assert t.observe_heap()  # held still, 65 MiB above the least seen
    assert calls.n == 1
    for _ in range(3):
        assert not t.observe_heap()  # what lies free was given back: nothing new
    assert calls.n == 1


def test_heap_reused_and_freed_again_is_trimmed_again() -> None:
    calls, heap = Calls(), Heap()
    t = HeapTrimmer(calls, free=heap)
    for free in (0, 70 * MIB, 70 * MIB, 10 * MIB, 70 * MIB, 70 * MIB):
        heap.free = free
        t.observe_heap()
    assert calls.n == 1  # trimmed at most once in HEAP_LOOKS looks: churn is not walked
    assert not t.observe_heap()
    assert t.observe_heap()  # the fifth look since the trim
    assert calls.n == 2  # the second burst made 60 MiB resident again, then freed it
    for free in (60 * MIB, 70 * MIB, 70 * MIB):
        heap.free = free
        assert not t.observe_heap()  # 10 MiB reused and freed: not worth a walk
    assert calls.n == 2


def test_without_mallinfo2_the_free_heap_is_not_watched() -> None:
    calls = Calls()
    t = HeapTrimmer(calls)
    assert not t.observe_heap()
    free = heap_free()
    assert free is not None  # glibc >= 2.33, the broker's platform
    assert free() >= 0
