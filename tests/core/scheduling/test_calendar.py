"""Spec of the scheduler's calendar: where a scheduled message is filed by its due time, and
when each bucket is read, each held message is due and each far one is refiled."""

from __future__ import annotations

import tracemalloc

from sluicemq.core.scheduling.calendar import (
    AHEAD_MS,
    NAME,
    Calendar,
    bucket_name,
    bucket_of_name,
)

NOW = 1_800_000_000_000  # a whole second, ms


def test_near_messages_go_to_the_bucket_of_their_second_far_ones_to_the_far_queue() -> None:
    cal = Calendar(horizon_ms=60_000)
    assert cal.place(NOW + 1500, NOW) == f"{NAME}.{(NOW + 1500) // 1000}"
    assert cal.place(NOW + 59_999, NOW) == bucket_name((NOW + 59_999) // 1000)
    assert cal.place(NOW + 60_000, NOW) == NAME
    assert bucket_of_name(bucket_name(123)) == 123
    assert bucket_of_name(NAME) is None and bucket_of_name("orders.5") is None


def test_a_bucket_is_read_shortly_before_its_second_and_only_once_listed() -> None:
    cal = Calendar()
    second = (NOW + 5000) // 1000
    cal.filed(bucket_name(second), NOW + 5000, 1)
    cal.filed(bucket_name(second), NOW + 5700, 2)  # the same bucket: listed once
    assert cal.wake_at() == second * 1000 - AHEAD_MS
    assert cal.bucket_to_read(second * 1000 - AHEAD_MS - 1) is None
    assert cal.bucket_to_read(second * 1000 - AHEAD_MS) == second
    cal.bucket_read(second)
    assert cal.bucket_to_read(NOW + 10_000) is None and cal.wake_at() is None


def test_held_messages_come_out_in_due_order_when_due() -> None:
    cal = Calendar()
    for mid, due in enumerate((NOW + 300, NOW + 100, NOW + 200), start=1):
        cal.hold(due, mid, "q")
    assert cal.wake_at() == NOW + 100
    assert cal.due(NOW + 250, limit=10) == [(NOW + 100, 2, "q"), (NOW + 200, 3, "q")]
    assert cal.due(NOW + 250, limit=10) == []
    assert cal.due(NOW + 300, limit=10) == [(NOW + 300, 1, "q")]


def test_far_messages_are_refiled_half_the_horizon_before_they_are_due() -> None:
    cal = Calendar(horizon_ms=60_000)
    cal.filed(NAME, NOW + 90_000, 7)
    cal.filed(NAME, NOW + 100_000, 8)
    assert cal.wake_at() == NOW + 60_000
    assert cal.to_refile(NOW + 59_999, limit=10) == []
    assert cal.to_refile(NOW + 70_000, limit=10) == [7, 8]


def test_each_far_message_is_refiled_between_a_horizon_and_half_a_horizon_before_due() -> None:
    """Far messages are refiled a slice (half a horizon of due times) at a time: early
    enough that each is filed in its bucket before the bucket is read, late enough that
    ``place`` puts it there (due within the horizon); within a slice in id order, so those
    due at the same moment keep the order they came in; at most ``limit`` a turn."""
    cal = Calendar(horizon_ms=60_000)
    dues = {mid: NOW + 60_000 + (mid * 7919) % 90_000 for mid in range(1, 301)}
    for mid, due in dues.items():
        cal.filed(NAME, due, mid)
    moved: dict[int, int] = {}
    while (wake := cal.wake_at()) is not None:
        turn = cal.to_refile(wake, limit=64)
        assert 0 < len(turn) <= 64 and turn == sorted(turn)
        for mid in turn:
            moved[mid] = wake
            assert cal.place(dues[mid], wake) != NAME
    assert moved.keys() == dues.keys()
    assert all(30_000 <= dues[mid] - at < 60_000 for mid, at in moved.items())


def test_far_messages_cost_about_8_bytes_each_in_ram() -> None:
    """Their bodies and headers wait in the far queue (paged); the calendar keeps ids only."""
    cal = Calendar(horizon_ms=60_000)
    tracemalloc.start()
    try:
        for mid in range(200_000):
            cal.filed(NAME, NOW + 120_000 + mid * 17 % 3_600_000, mid)
        used, _peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert used < 4 * 2**20  # (a (due, id) tuple each took 25 MiB)


def test_the_horizon_never_shrinks_below_what_refiling_before_reading_needs() -> None:
    cal = Calendar(horizon_ms=10)
    assert cal.horizon == 2000
    assert cal.place(NOW + 1999, NOW) != NAME


def test_a_name_is_a_bucket_only_when_its_tail_is_a_plain_number() -> None:
    """A queue named like a bucket but with digits ``int`` refuses ("²") or more of them
    than it converts (4,300) is no bucket (was: ValueError while recovering the queues)."""
    assert bucket_of_name(bucket_name(1_800_000_000)) == 1_800_000_000
    for tail in ("\u00b2", "9" * 5000, "", "-1", "1_0"):
        assert bucket_of_name(f"{NAME}.{tail}") is None
