"""Spec of the redelivery back-off (ActiveMQ's redeliveryPolicy): the wait before each
redelivery, as a function of how many came before."""

from __future__ import annotations

from dataclasses import replace

from sluicemq.config import Policy
from sluicemq.core.scheduling.redelivery import redelivery_delay

BASE = replace(Policy(), initial_redelivery_delay=1000, redelivery_delay=2000)


def waits(policy: Policy, n: int = 6) -> list[int]:
    return [redelivery_delay(policy, i) for i in range(1, n + 1)]


def test_the_first_wait_is_the_initial_delay_then_the_fixed_one() -> None:
    assert waits(BASE) == [1000, 2000, 2000, 2000, 2000, 2000]


def test_exponential_back_off_multiplies_the_previous_wait_up_to_the_cap() -> None:
    policy = replace(BASE, use_exponential_backoff=True, backoff_multiplier=2.0,
                     maximum_redelivery_delay=10_000)
    assert waits(policy) == [1000, 2000, 4000, 8000, 10_000, 10_000]


def test_a_cap_below_the_fixed_delay_gives_way_to_it() -> None:
    policy = replace(BASE, use_exponential_backoff=True, maximum_redelivery_delay=500)
    assert waits(policy, 3) == [1000, 2000, 2000]


def test_no_delay_configured_or_nothing_delivered_yet_means_at_once() -> None:
    assert waits(Policy(), 3) == [0, 0, 0]
    assert redelivery_delay(BASE, 0) == 0


def test_a_long_history_neither_overflows_nor_loops_for_ever() -> None:
    policy = replace(BASE, use_exponential_backoff=True, backoff_multiplier=10.0)
    assert 0 < redelivery_delay(policy, 10**9) <= 10 * 365 * 24 * 3600 * 1000
