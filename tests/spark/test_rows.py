"""Spec of a message row's timestamp column (``spark/rows.py``) when the stored ``timestamp``
header is not one: no row's column raises, whatever a producer wrote."""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace

import pytest

from sluicemq.spark.rows import message_row
from sluicemq.spark.schema import Shape


def row_time(timestamp: str) -> dt.datetime | None:
    msg = SimpleNamespace(message_id="ID:sluice-1", destination="/queue/q",
                          headers={"timestamp": timestamp}, body=b"", redelivered=False, seq=1)
    return message_row(msg, Shape())[4]


def test_a_timestamp_in_ms_is_the_row_s_time() -> None:
    assert row_time("1800000000000") == dt.datetime(2027, 1, 15, 8, 0, tzinfo=dt.UTC)


@pytest.mark.parametrize("timestamp", ["9" * 5000, "\u00b2", "99999999999999999", "-5", ""])
def test_a_timestamp_that_is_no_time_is_null(timestamp: str) -> None:
    """Thousands of digits or "²" (``int`` refuses both), a year past 9999, a sign: null
    (was: ValueError / OverflowError in the reading task)."""
    assert row_time(timestamp) is None
