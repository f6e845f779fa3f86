"""How much of each event-loop turn connections' input may take, and whose input waits.

Why: every frame of every client is parsed and handled on the one event loop. Twenty
connections pipelining transactions, or one sending a frame of megabytes every few
milliseconds, would fill every turn, and a light client's frame - its receipt, its message -
would wait behind all of them. So the input work of a turn is budgeted in seconds of loop
time, shared by all connections. Each client address carries what its connections used
recently (loop seconds, halving every ``HALF_LIFE`` seconds; ``Use``). Once a turn's budget is
spent, the input of a client that used more than a light share waits (its transports stop
reading, so TCP holds the sender back), and waiting connections are resumed at the start of a
later turn in order of what their client used recently, least first. A light client (a few
frames a second) is never held unless the turn is far over budget, and then it goes first.

Sans-IO: the clock and the scheduler (``call_soon``) are passed in.
"""

from __future__ import annotations

import heapq
import itertools
import math
import weakref
from collections.abc import Callable
from typing import Protocol

BUDGET = 0.004  # seconds of input work per loop turn, all connections together
LIGHT = 0.02  # recent loop seconds (~1.4% of a core) under which a connection is light
LIGHT_CAP = 4  # light connections run past the budget until the turn is this many budgets
HALF_LIFE = 1.0  # seconds for a connection's recent use to halve
DELIVERY = 20e-6  # first guess of a delivery's loop seconds, until dispatch measured some


class Spender(Protocol):
    """A connection as the turns see it: what it used recently, and when that was noted."""

    used: float
    used_at: float


class Use:
    """The recent loop use of one client address, shared by all its connections (a Spender).

    Why per address and not per connection: a client opening 500 connections at a time, each
    of a few frames, made each of them light, and a light probe from elsewhere waited behind
    all of them; counted together they are one heavy client whose input waits its turn."""

    __slots__ = ("__weakref__", "used", "used_at")

    def __init__(self) -> None:
        self.used = self.used_at = 0.0


class Turns:
    """The input budget of the current loop turn and the connections waiting for a turn."""

    def __init__(self, clock: Callable[[], float],
                 schedule: Callable[[Callable[[], None]], object], *,
                 budget: float = BUDGET, light: float = LIGHT) -> None:
        self.clock = clock
        self._schedule = schedule
        self.budget = budget
        self.light = light
        self.spent = 0.0  # input seconds of this turn so far
        self._armed = False  # a new-turn callback is scheduled
        self._waiting: list[tuple[float, int, float, Callable[[], None]]] = []
        self._order = itertools.count()
        self.deferred_total = 0  # inputs made to wait for a later turn (console, /metrics)
        self._uses: weakref.WeakValueDictionary[str, Use] = weakref.WeakValueDictionary()
        # loop seconds the input running now has caused to come later in this turn (a topic
        # SEND's deliveries): charged with that input, counted against the turn's budget
        self.owed = 0.0
        self.delivery = DELIVERY  # recent loop seconds a delivery took (dispatch measures)

    def use_of(self, address: str) -> Use:
        """The shared ``Use`` of a client address (kept while a connection holds it)."""
        use = self._uses.get(address)
        if use is None:
            use = self._uses[address] = Use()
        return use

    def __len__(self) -> int:
        return len(self._waiting)

    def allowance(self, who: Spender) -> float:
        """Seconds of input ``who`` may run now in this turn; 0 or less: wait for a turn."""
        left = self.budget - self.spent
        if left > 0:
            return left
        if self.recent(who) < self.light:
            return LIGHT_CAP * self.budget - self.spent
        return 0.0

    def charge(self, who: Spender, started: float) -> None:
        """``who``'s input ran from ``started`` (a ``clock()`` reading) until now."""
        now = self.clock()
        cost = now - started + self.owed
        self.owed = 0.0
        who.used = self._decayed(who, now) + cost
        who.used_at = now
        self.spent += cost
        self._arm()

    def fan_out(self, deliveries: int) -> None:
        """The input running now made ``deliveries`` more deliveries due in this turn than
        its own one (a SEND to a topic with that many ready subscribers).

        Why: dispatch runs after the input that caused it, outside its budget, so one client
        publishing 16 KiB messages to 200 subscribers had three or four SENDs handled in a
        turn and ~30 ms of deliveries after them; counted now, its next frames wait."""
        if deliveries > 0:
            self.owed += deliveries * self.delivery

    def dispatched(self, seconds: float, deliveries: int) -> None:
        """A dispatch pass took ``seconds`` for ``deliveries``: what ``fan_out`` expects."""
        if deliveries:
            self.delivery += (seconds / deliveries - self.delivery) / 8

    def wait(self, who: Spender, resume: Callable[[], None], reserve: float = 0.0) -> None:
        """Run ``resume`` at the start of a later turn, lighter connections first.

        ``reserve``: seconds to count against that turn when ``resume`` only wakes work
        that runs later in it (a coroutine), so that one turn does not wake all of them.
        """
        self.deferred_total += 1
        heapq.heappush(self._waiting, (self.recent(who), next(self._order), reserve, resume))
        self._arm()

    def recent(self, who: Spender) -> float:
        return self._decayed(who, self.clock())

    def _decayed(self, who: Spender, now: float) -> float:
        if not who.used:
            return 0.0
        return who.used * math.pow(0.5, max(0.0, now - who.used_at) / HALF_LIFE)

    def _arm(self) -> None:
        if not self._armed:
            self._armed = True
            self._schedule(self._new_turn)

    def _new_turn(self) -> None:
        """A new loop turn: its budget goes to waiting connections, lightest first; whoever
        does not fit waits on (their input charges ``spent`` as it runs)."""
        self._armed = False
        self.spent = self.owed = 0.0
        waiting = self._waiting
        while waiting and self.spent < self.budget:
            _used, _n, reserve, resume = heapq.heappop(waiting)
            self.spent += reserve
            resume()
        if waiting or self.spent:
            self._arm()
