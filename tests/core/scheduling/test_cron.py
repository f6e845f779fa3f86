"""Spec of AMQ_SCHEDULED_CRON entries: which minute comes next, read as ActiveMQ reads them
(local time, minute resolution, steps keep the values the step divides)."""

from __future__ import annotations

import time
from datetime import datetime

import pytest

from sluicemq.core.scheduling.cron import next_after, parse


def ms(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> int:
    """Local time in ms since the epoch."""
    return int(time.mktime(datetime(year, month, day, hour, minute, second).timetuple())) * 1000


def following(entry: str, *when: int) -> datetime:
    return datetime.fromtimestamp(next_after(parse(entry), ms(*when)) / 1000)


def test_every_minute_fires_at_the_top_of_the_next_minute() -> None:
    assert following("* * * * *", 2026, 11, 24, 10, 7, 30) == datetime(2026, 11, 24, 10, 8)
    assert following("* * * * *", 2026, 11, 24, 10, 7, 0) == datetime(2026, 11, 24, 10, 8)


def test_a_step_keeps_the_values_it_divides() -> None:
    assert following("*/15 * * * *", 2026, 11, 24, 10, 7) == datetime(2026, 11, 24, 10, 15)
    assert following("*/15 * * * *", 2026, 11, 24, 10, 50) == datetime(2026, 11, 24, 11, 0)
    assert following("0 0 */2 * *", 2026, 11, 1, 12, 0) == datetime(2026, 11, 2)  # even days
    assert following("0 0 1-10/3 * *", 2026, 11, 1, 0, 0) == datetime(2026, 11, 3)


def test_ranges_lists_and_weekdays() -> None:
    # Friday 27 November 2026, 10:00: the next weekday 09:00 is Monday the 30th
    assert following("0 9 * * 1-5", 2026, 11, 27, 10, 0) == datetime(2026, 11, 30, 9, 0)
    assert following("30 8,17 * * *", 2026, 11, 24, 9, 0) == datetime(2026, 11, 24, 17, 30)
    assert following("0 12 * * 7", 2026, 11, 24, 0, 0) == datetime(2026, 11, 29, 12, 0)  # Sun
    assert following("0 12 * * 0", 2026, 11, 24, 0, 0) == datetime(2026, 11, 29, 12, 0)


def test_months_and_short_months() -> None:
    assert following("0 0 31 * *", 2026, 4, 1, 0, 0) == datetime(2026, 5, 31)
    assert following("15 6 1 1 *", 2026, 11, 24, 0, 0) == datetime(2027, 1, 1, 6, 15)
    assert following("0 0 29 2 *", 2026, 3, 1, 0, 0) == datetime(2028, 2, 29)


def test_both_day_fields_restricted_fire_on_either() -> None:
    # the 13th or any Friday: Friday 27 November comes before 13 December
    assert following("0 0 13 * 5", 2026, 11, 24, 0, 0) == datetime(2026, 11, 27)
    assert following("0 0 25 * 5", 2026, 11, 24, 0, 0) == datetime(2026, 11, 25)


@pytest.mark.parametrize("entry, says", [
    ("* * * *", "5 fields"),
    ("* * * * * *", "5 fields"),
    ("60 * * * *", "minute"),
    ("* 24 * * *", "hour"),
    ("* * 0 * *", "day of month"),
    ("* * * 13 *", "month"),
    ("* * * * 8", "day of week"),
    ("* * * * MON", "number"),
    ("*/0 * * * *", "step"),
    ("5-1 * * * *", "low to high"),
    ("1-3/5 * * * *", "matches no"),
])
def test_entries_activemq_would_not_take_are_refused_with_the_field(entry: str,
                                                                    says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse(entry)


def test_a_date_that_never_exists_is_refused() -> None:
    with pytest.raises(ValueError, match="no date"):
        next_after(parse("0 0 31 2 *"), ms(2026, 1, 1, 0, 0))
