"""Spec of the reconnect schedule both clients follow (sans-IO, on a fake clock): which broker
of a failover URL to dial next, and how long to back off between rounds."""

from __future__ import annotations

from sluicemq.client.reconnect import Dial, GiveUp, Pause, Reconnect
from sluicemq.client.url import parse_brokers

A, B = "stomp://a:61613", "stomp://b:61613"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def hosts(steps: list[object]) -> list[object]:
    return [s.address[1] if isinstance(s, Dial) else s for s in steps]


def take(plan: Reconnect, n: int) -> list[object]:
    return [plan.next() for _ in range(n)]


def test_a_plain_url_is_dialled_once() -> None:
    plan = Reconnect(parse_brokers(A), timeout=30, startup=True, clock=Clock())
    assert hosts(take(plan, 2)) == ["a", GiveUp()]


def test_rounds_try_every_broker_then_back_off_doubling_up_to_the_cap() -> None:
    url = f"failover:({A},{B})?randomize=false&initialReconnectDelay=100&maxReconnectDelay=300"
    plan = Reconnect(parse_brokers(url), timeout=30, startup=False)
    assert hosts(take(plan, 9)) == ["a", "b", Pause(0.2), "a", "b", Pause(0.3), "a", "b",
                                    Pause(0.3)]  # 100 ms x 2^(attempts-1), capped at 300 ms


def test_without_exponential_back_off_the_delay_stays_initial() -> None:
    url = f"failover:({A})?initialReconnectDelay=50&useExponentialBackOff=false"
    plan = Reconnect(parse_brokers(url), timeout=30, startup=False)
    assert hosts(take(plan, 6)) == ["a", Pause(0.05), "a", Pause(0.05), "a", Pause(0.05)]


def test_a_failover_gives_up_after_max_reconnect_attempts() -> None:
    url = f"failover:({A},{B})?randomize=false&maxReconnectAttempts=3"
    plan = Reconnect(parse_brokers(url), timeout=30, startup=False)
    steps = take(plan, 5)
    assert hosts(steps) == ["a", "b", Pause(0.02), "a", GiveUp()]


def test_zero_max_reconnect_attempts_means_no_failover() -> None:
    plan = Reconnect(parse_brokers(f"failover:({A})?maxReconnectAttempts=0"), timeout=30,
                     startup=False)
    assert plan.next() == GiveUp()


def test_the_first_connection_is_bounded_by_the_client_timeout() -> None:
    clock = Clock()
    url = f"failover:({A})?initialReconnectDelay=1000&useExponentialBackOff=false"
    plan = Reconnect(parse_brokers(url), timeout=2.5, startup=True, clock=clock)
    first = plan.next()
    assert isinstance(first, Dial) and first.timeout == 2.5  # a dial never outlives it
    clock.now = 1.0
    assert plan.next() == Pause(1.0)
    clock.now = 2.0
    assert isinstance(plan.next(), Dial)
    assert plan.next() == Pause(0.5)  # only what is left of the timeout
    clock.now = 2.5
    assert plan.next() == GiveUp()


def test_startup_max_reconnect_attempts_bounds_the_first_connection() -> None:
    url = f"failover:({A},{B})?randomize=false&startupMaxReconnectAttempts=2"
    plan = Reconnect(parse_brokers(url), timeout=30, startup=True, clock=Clock())
    assert hosts(take(plan, 6)) == ["a", "b", Pause(0.02), "a", "b", GiveUp()]


def test_randomize_shuffles_each_round_over_all_brokers() -> None:
    url = f"failover:({A},{B},stomp://c:61613)?randomize=true"
    plan = Reconnect(parse_brokers(url), timeout=30, startup=False)
    rounds = [hosts(take(plan, 4))[:3] for _ in range(20)]
    assert all(sorted(r) == ["a", "b", "c"] for r in rounds)
    assert len({tuple(r) for r in rounds}) > 1
