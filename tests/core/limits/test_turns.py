"""Spec of the loop turns' input budget (core/limits/turns.py), with a hand-moved clock and a
hand-run scheduler: who may run in a turn, who waits, and who goes first when a turn starts."""

from __future__ import annotations

from collections.abc import Callable

from sluicemq.core.limits.turns import (
    BUDGET,
    DELIVERY,
    HALF_LIFE,
    LIGHT,
    LIGHT_CAP,
    Spender,
    Turns,
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Conn:
    def __init__(self, name: str) -> None:
        self.name = name
        self.used = self.used_at = 0.0


def make() -> tuple[Turns, Clock, list[Callable[[], None]]]:
    clock, ready = Clock(), []
    return Turns(clock, ready.append), clock, ready


def spend(turns: Turns, clock: Clock, who: Spender, seconds: float) -> None:
    started = clock()
    clock.now += seconds
    turns.charge(who, started)


def next_turn(ready: list[Callable[[], None]]) -> None:
    """Run what was scheduled for the next loop turn (not what that schedules in turn)."""
    due, ready[:] = list(ready), []
    for fn in due:
        fn()


def busy(clock: Clock, name: str) -> Conn:
    """A connection that used a whole core in the last second."""
    conn = Conn(name)
    conn.used, conn.used_at = 1.0, clock.now
    return conn


def test_input_runs_until_the_turn_budget_is_spent() -> None:
    turns, clock, _ = make()
    heavy = busy(clock, "heavy")
    assert turns.allowance(heavy) == BUDGET
    spend(turns, clock, heavy, BUDGET * 0.75)
    assert abs(turns.allowance(heavy) - BUDGET * 0.25) < 1e-9
    spend(turns, clock, heavy, BUDGET * 0.25)
    assert turns.allowance(heavy) <= 0  # it waits for a later turn


def test_a_light_connection_runs_past_the_budget_but_not_far() -> None:
    turns, clock, _ = make()
    heavy, light = busy(clock, "heavy"), Conn("light")
    spend(turns, clock, heavy, BUDGET * 2)
    assert turns.allowance(heavy) <= 0
    assert abs(turns.allowance(light) - (LIGHT_CAP - 2) * BUDGET) < 1e-9
    spend(turns, clock, heavy, BUDGET * LIGHT_CAP)
    assert turns.allowance(light) <= 0  # far over budget: everybody waits


def test_a_new_turn_resumes_waiting_connections_lightest_first_within_its_budget() -> None:
    turns, clock, ready = make()
    conns = {name: Conn(name) for name in ("a", "b", "c")}
    for name, seconds in (("a", 0.3), ("b", 0.01), ("c", 0.1)):
        spend(turns, clock, conns[name], seconds)  # what each used recently
    order: list[str] = []

    def resume(name: str) -> Callable[[], None]:
        def run() -> None:
            order.append(name)
            spend(turns, clock, conns[name], BUDGET * 0.6)
        return run

    for name in ("a", "b", "c"):
        turns.wait(conns[name], resume(name))
    next_turn(ready)
    assert order == ["b", "c"]  # the budget is spent after two; a waits on
    assert len(turns) == 1
    next_turn(ready)
    assert order == ["b", "c", "a"]
    assert turns.deferred_total == 3


def test_recent_use_halves_every_half_life() -> None:
    turns, clock, _ = make()
    conn = Conn("c")
    spend(turns, clock, conn, LIGHT * 4)
    clock.now += 2 * HALF_LIFE
    assert abs(turns.recent(conn) - LIGHT) < 1e-9
    clock.now += HALF_LIFE
    assert turns.recent(conn) < LIGHT  # light again: it may run past a spent budget


def test_a_reserve_counts_against_the_turn_that_wakes_it() -> None:
    """Work woken for later in the turn (a coroutine) reserves its cost, so one turn does
    not wake every waiter at once."""
    turns, clock, ready = make()
    woken: list[int] = []
    spend(turns, clock, Conn("x"), BUDGET)
    for i in range(10):
        turns.wait(Conn(str(i)), lambda i=i: woken.append(i), reserve=BUDGET / 4)
    next_turn(ready)
    assert woken == [0, 1, 2, 3]


def test_the_connections_of_one_address_share_one_use() -> None:
    """Five hundred connections of one client are one heavy client, not five hundred light
    ones that each run past the budget; another address stays light."""
    turns, clock, ready = make()
    storm = [turns.use_of("10.0.0.9") for _ in range(500)]
    assert all(use is storm[0] for use in storm)
    for i, use in enumerate(storm[:100]):
        if i and i % 10 == 0:
            next_turn(ready)
        spend(turns, clock, use, BUDGET / 10)  # each connection did a little, a turn's worth
    assert turns.recent(storm[0]) >= LIGHT
    assert turns.allowance(storm[-1]) < 1e-9  # it waits for a later turn
    probe = turns.use_of("10.0.0.1")
    assert probe is not storm[0] and turns.allowance(probe) > 0


def test_an_address_use_is_forgotten_with_its_last_connection() -> None:
    turns, clock, _ = make()
    use = turns.use_of("10.0.0.9")
    spend(turns, clock, use, 1.0)
    del use
    assert turns.recent(turns.use_of("10.0.0.9")) == 0.0


def test_deliveries_a_fan_out_owes_are_charged_with_the_input_that_caused_them() -> None:
    turns, clock, ready = make()
    publisher = Conn("publisher")
    turns.dispatched(0.001, 10)  # dispatch measured 100 us a delivery
    assert DELIVERY < turns.delivery < 100e-6  # it moves towards what it measures
    turns.delivery = 100e-6
    turns.fan_out(199)  # one SEND to 200 ready subscribers
    spend(turns, clock, publisher, 0.001)
    assert abs(turns.recent(publisher) - (0.001 + 0.0199)) < 1e-9
    assert turns.owed == 0 and turns.spent > LIGHT_CAP * BUDGET
    turns.fan_out(10)
    next_turn(ready)
    assert turns.owed == 0.0  # what nobody's input caused is not carried into a new turn
