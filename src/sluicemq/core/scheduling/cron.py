"""Cron expressions as ActiveMQ's ``AMQ_SCHEDULED_CRON`` takes them.

Five fields - minute (0-59), hour (0-23), day of month (1-31), month (1-12), day of week
(0-6, 0 is Sunday; 7 is taken as Sunday too) - each ``*``, a number, a range ``a-b``, a list
``a,b-c`` or a step ``x/n``. A step keeps the values of ``x`` that ``n`` divides, as ActiveMQ
reads it (``*/15`` minutes: 0, 15, 30, 45; day of month ``*/2``: 2, 4, ... 30), so a schedule
written for ActiveMQ fires on the same minutes here. Names (``MON``, ``JAN``) are refused,
as ActiveMQ refuses them. When both day fields are restricted a day matching either fires,
as in Unix cron. Times are the broker's local time, minute resolution, like ActiveMQ's.

Pure functions of (expression, time): the scheduler keeps the clock.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timedelta

_FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day of month", 1, 31), ("month", 1, 12),
           ("day of week", 0, 7))
_SEARCH_DAYS = 366 * 8  # 29 February on a Monday recurs within 28 years; 8 covers leap days


@dataclass(frozen=True, slots=True)
class Cron:
    """A parsed expression: the allowed values of each field."""

    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 Sunday .. 6 Saturday
    any_day: bool  # day of month is *
    any_weekday: bool  # day of week is *

    def day_matches(self, day: datetime) -> bool:
        if day.month not in self.months:
            return False
        in_month = day.day in self.days
        in_week = (day.isoweekday() % 7) in self.weekdays
        if self.any_day or self.any_weekday:
            return in_month and in_week
        return in_month or in_week


def parse(text: str) -> Cron:
    """ValueError, saying which field is wrong, for anything ActiveMQ would not take."""
    parts = text.split()
    if len(parts) != 5:
        raise ValueError(f"a cron entry has 5 fields (minute hour day-of-month month "
                         f"day-of-week), not {len(parts)}")
    values = [_field(part, *spec) for part, spec in zip(parts, _FIELDS, strict=True)]
    weekdays = frozenset(v % 7 for v in values[4])
    return Cron(tuple(sorted(values[0])), tuple(sorted(values[1])), frozenset(values[2]),
                frozenset(values[3]), weekdays, parts[2] == "*", parts[4] == "*")


def _field(token: str, name: str, low: int, high: int) -> set[int]:
    out: set[int] = set()
    for item in token.split(","):
        base, slash, step_text = item.partition("/")
        if base == "*":
            values = set(range(low, high + 1))
        else:
            first, dash, last = base.partition("-")
            a, b = _number(first, name), _number(last, name) if dash else None
            b = a if b is None else b
            if not low <= a <= b <= high:
                raise ValueError(f"cron {name} {item!r}: values {low}-{high}, low to high")
            values = set(range(a, b + 1))
        if slash:
            step = _number(step_text, name)
            if step < 1:
                raise ValueError(f"cron {name} {item!r}: a step is at least 1")
            values = {v for v in values if v % step == 0}
        if not values:
            raise ValueError(f"cron {name} {item!r} matches no {name}")
        out |= values
    return out


def _number(text: str, name: str) -> int:
    if not (text.isascii() and text.isdigit()):
        raise ValueError(f"cron {name} {text!r}: a number is needed")
    return int(text)


def next_after(cron: Cron, after_ms: int) -> int:
    """The first minute strictly after ``after_ms`` (ms since the epoch) that ``cron``
    names, in ms; ValueError if none comes within eight years (31 February)."""
    start = datetime.fromtimestamp(after_ms // 60_000 * 60 + 60)  # local, next whole minute
    day = start.replace(hour=0, minute=0)
    for n in range(_SEARCH_DAYS):
        if cron.day_matches(day):
            for hour in cron.hours:
                for minute in cron.minutes:
                    at = day.replace(hour=hour, minute=minute)
                    if at >= start:
                        return int(time.mktime(at.timetuple())) * 1000
        day = (start + timedelta(days=n + 1)).replace(hour=0, minute=0)
    raise ValueError("cron entry names no date that exists")
