"""How many destinations clients may create, and reclaiming the ones nobody uses any more.

Why: queues and topics are created on first use, and each costs RAM that no message limit
sees (its cursor, stats, policy). Without a cap one client naming 100,000 queues grows the
broker past any memory limit; without reclaiming, 50,000 SUBSCRIBE + UNSUBSCRIBE cycles leave
50,000 empty queues behind for good. So a new destination is admitted against
``max_destinations`` (broker-wide) and ``max_destinations_per_user`` (the creating user, or
the client address for anonymous connections), and a destination that has been empty, without
consumers or subscribers, for ``idle_destination_seconds`` is dropped (it comes back, empty,
on next use). At a cap, idle destinations are reclaimed at once before anything is refused.

Each destination and durable subscription is also charged ``DESTINATION_BYTES`` to the memory
account (``MemoryAccount.destinations``), which it shares with connections' own state within
the part of ``memory_limit`` store cursors leave: the caps bound how many, the charge makes
what they hold count (10,000 queues are ~50 MiB), and a new one past that part is refused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from sluicemq.core.routing import keys
from sluicemq.core.routing.names import QUEUE, TOPIC
from sluicemq.errors import ProtocolError

if TYPE_CHECKING:
    from collections.abc import Sized

    from sluicemq.config import BrokerConfig
    from sluicemq.core.paging.flow import MemoryAccount
    from sluicemq.core.routing.advisories import Advisories
    from sluicemq.core.routing.queue import Queue
    from sluicemq.core.routing.topic import Topic
    from sluicemq.core.routing.virtual import VirtualTopicIndex
    from sluicemq.core.streams.chunks import StreamKey, StreamState

Key = tuple[str, str]  # (kind, name)
SWEEP_LOOK = 4096  # destinations looked at per sweep (see DestinationBudget.sweep)
SWEEP_DROP = 256  # and dropped, at most
FORCED_DROP = 64  # when a cap is reached
# A destination's own state, whatever it holds: measured (bench/hostile.py, session 12-14
# censuses) ~5 KiB for an auto-created queue holding one message (its cursor and lanes, stats,
# policy, owner entries: 2,000 queues left +10 MiB), ~4 KiB for a durable subscription.
DESTINATION_BYTES = 5 << 10


class DestinationHost(Protocol):
    """What the budget needs of the broker: its destinations and what keeps one alive."""

    config: BrokerConfig
    queues: dict[str, Queue]
    topics: dict[str, Topic]
    streams: dict[StreamKey, StreamState]
    virtual: VirtualTopicIndex
    advisories: Advisories
    memory: MemoryAccount

    @property
    def durables(self) -> Sized: ...

    def now_ms(self) -> int: ...

    def is_dirty(self, queue: Queue) -> bool: ...

    def forget_policies(self) -> None: ...


class DestinationBudget:
    """Who created which destination, and the sweep that drops idle empty ones."""

    def __init__(self, broker: DestinationHost) -> None:
        self.broker = broker
        self.owners: dict[Key, str] = {}
        self.per_owner: dict[str, int] = {}
        self._idle_since: dict[Key, float] = {}
        self.reclaimed_total = 0
        self.refused_total = 0
        self._fruitless: tuple[float, int] | None = None  # when a forced sweep found nothing
        self._round: list[Key] = []  # destinations still to be looked at in this sweep round

    @property
    def count(self) -> int:
        return len(self.broker.queues) + len(self.broker.topics)

    def charge(self) -> None:
        """Charge every destination and durable subscription to the memory account now (the
        broker calls it as one is created and once a tick; drops are counted at the tick)."""
        broker = self.broker
        broker.memory.destinations(self.count + len(broker.durables), DESTINATION_BYTES)

    def exists(self, kind: str, name: str) -> bool:
        return name in (self.broker.queues if kind == QUEUE else self.broker.topics)

    def admit(self, kind: str, name: str, owner: str) -> None:
        """Allow ``owner`` to use ``kind/name``, creating it; ProtocolError names the limit."""
        if self.exists(kind, name) or (kind, name) in self.owners:
            return
        limits = self.broker.config.limits
        held = self.per_owner.get(owner, 0)
        per_user = limits.max_destinations_per_user
        memory = self.broker.memory
        if (self.count >= limits.max_destinations or (per_user and held >= per_user)
                or memory.refusal(DESTINATION_BYTES, "destination")):
            self._forced_sweep()
            held = self.per_owner.get(owner, 0)
            self.charge()
        if self.count >= limits.max_destinations:
            self.refused_total += 1
            raise ProtocolError(f"cannot create /{kind}/{name}: too many destinations (limit "
                                f"{limits.max_destinations}, max_destinations)", fatal=False)
        if per_user and held >= per_user:
            self.refused_total += 1
            raise ProtocolError(f"cannot create /{kind}/{name}: {owner} created too many "
                                f"destinations (limit {per_user}, max_destinations_per_user)",
                                fatal=False)
        refused = memory.refusal(DESTINATION_BYTES, "destination")
        if refused is not None:
            self.refused_total += 1
            raise ProtocolError(f"cannot create /{kind}/{name}: {refused}", fatal=False)
        self.owners[(kind, name)] = owner
        self.per_owner[owner] = held + 1

    def _forced_sweep(self) -> None:
        """Reclaim idle destinations now, unless that found nothing within the last second
        and no destination came or went since (a client hammering a cap must not make each
        refusal scan every destination)."""
        now = self.broker.now_ms() / 1000
        if self._fruitless is not None:
            at, count = self._fruitless
            if now - at < 1.0 and count == self.count:
                return
        self._fruitless = None if self.sweep(now, force=True) else (now, self.count)

    def sweep(self, now: float, *, force: bool = False) -> int:
        """Look at the next destinations, round-robin, and drop those idle for
        ``idle_destination_seconds`` (any idle one with ``force``); returns how many were
        dropped. At most ``SWEEP_LOOK`` are looked at and ``SWEEP_DROP`` dropped (a forced
        sweep stops at ``FORCED_DROP``: it needs room for one).

        Why bounded: a client cycling SUBSCRIBE/UNSUBSCRIBE at the cap made every 2,000th
        SUBSCRIBE drop 2,000 queues in one go (~50 ms of the loop everyone shares).
        """
        broker = self.broker
        grace = broker.config.limits.idle_destination_seconds
        busy_keys = {st.queue_key for st in broker.streams.values()}
        dropped: list[Key] = []
        looked = 0
        most = FORCED_DROP if force else SWEEP_DROP
        while looked < SWEEP_LOOK and len(dropped) < most:
            if not self._round:
                if looked:  # every destination was seen once in this call
                    break
                self._new_round()
                if not self._round:
                    break
            key = self._round.pop()
            looked += 1
            if not self.exists(*key):
                self._idle_since.pop(key, None)
                continue
            if not self._idle(key, busy_keys):
                self._idle_since.pop(key, None)
                continue
            if force or now - self._idle_since.setdefault(key, now) >= grace:
                self._drop(key)
                dropped.append(key)
        for key in dropped:
            owner = self.owners.pop(key, None)
            if owner is not None:
                self._uncount(owner)
        if dropped:
            broker.forget_policies()
        self.reclaimed_total += len(dropped)
        return len(dropped)

    def _new_round(self) -> None:
        """Every destination, to be looked at once; owners of names never created (their
        creation failed after admission) are let go of here."""
        broker = self.broker
        self._round = [(TOPIC, n) for n in broker.topics]
        self._round += [(QUEUE, n) for n in broker.queues]
        for key, owner in list(self.owners.items()):
            if not self.exists(*key):
                del self.owners[key]
                self._uncount(owner)

    def _idle(self, key: Key, busy_keys: set[str]) -> bool:
        kind, name = key
        broker = self.broker
        if kind == QUEUE:
            q = broker.queues[name]
            return (_queue_idle(q) and q.key not in busy_keys and not broker.is_dirty(q)
                    and broker.virtual.topic_of(name) is None)  # a group's copy must stay
        return not broker.topics[name].subscribers and keys.topic_key(name) not in busy_keys

    def _drop(self, key: Key) -> None:
        kind, name = key
        self._idle_since.pop(key, None)
        del (self.broker.queues if kind == QUEUE else self.broker.topics)[name]
        self.broker.advisories.destination("removed", kind, name)

    def _uncount(self, owner: str) -> None:
        left = self.per_owner[owner] - 1
        if left:
            self.per_owner[owner] = left
        else:
            del self.per_owner[owner]


def _queue_idle(q: Queue) -> bool:
    return not q.consumers and not q.pending and not q.groups


def owner_of(user_name: str | None, peer: str) -> str:
    """Whom a new destination is counted against: the user, or for anonymous the address."""
    if user_name is not None:
        return f"user {user_name!r}"
    return f"address {peer.rsplit(':', 1)[0]}"
