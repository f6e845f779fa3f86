"""Memory, store and temp accounting, and producer flow control.

Why limits rather than "as much as fits": a broker that grows until the kernel kills it loses
every non-persistent message and stalls every client. So RAM held by queued messages is
budgeted (store cursors page persistent backlog out at ``CURSOR_HIGH_WATER`` of the memory
limit, non-persistent overflow goes to temp files), and when a destination cannot take more -
journal disk at its store limit, temp files at their limit, a VM-cursor destination at its
memory limit - its producers are slowed: the SEND waits (its connection stops being read, so
its receipt is late) until there is room again, or, with ``fail_if_no_space``, is refused with
an ERROR. Other destinations, and the waiting producer's consumers elsewhere, are not held up.

Defaults, when a limit is 0 in the config, come from the machine (``resolve_limits``):
memory: 1/8 of physical RAM, between 64 MiB and 2 GiB; store: 90 % of the space the journal
could use (free disk plus what it holds), at most 1 TiB; temp: half the free disk, at most
100 GiB; max message size: the frame limit. A filesystem that reports no size at all (ramfs:
its files take RAM until there is none) would make both 0 - every persistent SEND waiting for
room forever - so there "free disk" is half the physical memory, and the start says so.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from sluicemq.config import Limits, Policy, percent
from sluicemq.core.paging.trim import HeapTrimmer

log = logging.getLogger("sluicemq.flow")

MiB, GiB = 1 << 20, 1 << 30
MAX_POLICY_SIZES = 1024  # resolved policies kept (FlowControl.sizes_of)
CURSOR_HIGH_WATER = 0.7  # fraction of the memory limit store cursors may fill before paging
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1000, "kib": 1 << 10, "m": MiB, "mb": 10**6,
          "mib": MiB, "g": GiB, "gb": 10**9, "gib": GiB, "t": 1 << 40, "tb": 10**12,
          "tib": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(value: int | str) -> int:
    """Bytes from an int or a string such as "512 MiB", "2GB", "100k"."""
    if isinstance(value, int):
        return value
    return _parse_text(value)


@functools.lru_cache(maxsize=256)
def _parse_text(value: str) -> int:
    """Cached: policies keep their sizes as written and every SEND reads some of them
    (max_consumer_lag, memory_limit), ~1 us a regex match each time otherwise."""
    m = _SIZE.match(value)
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS:
        raise ValueError(f"not a size: {value!r} (use bytes or e.g. '512 MiB')")
    return int(float(m.group(1)) * _UNITS[unit])


@dataclass(frozen=True, slots=True)
class ResolvedLimits:
    """The broker-wide limits in bytes, defaults filled in."""

    memory: int
    store: int
    temp: int
    max_message: int
    journal_backlog: int = 64 * MiB


def physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 4 * GiB


def resolve_limits(limits: Limits, data_dir: Path, journal_bytes: int = 0) -> ResolvedLimits:
    """Fill in the machine-derived defaults (see the module docstring)."""
    memory = parse_size(limits.memory_limit)
    if memory <= 0:
        memory = min(2 * GiB, max(64 * MiB, physical_memory() // 8))
    free = _free_disk(data_dir)
    store = parse_size(limits.store_limit)
    if store <= 0:
        store = min(1 << 40, int((free + journal_bytes) * 0.9))
    temp = parse_size(limits.temp_limit)
    if temp <= 0:
        temp = min(100 * GiB, free // 2)
    max_message = parse_size(limits.max_message_bytes) or limits.max_frame_bytes
    return ResolvedLimits(memory, store, temp, max_message,
                          parse_size(limits.journal_backlog) or 64 * MiB)


def _free_disk(path: Path) -> int:
    probe = Path(path)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    usage = shutil.disk_usage(probe)
    if usage.total == 0:  # ramfs: no size, nothing free by its count, and RAM behind it
        free = physical_memory() // 2
        log.warning("flow: the filesystem of %s reports no size (ramfs?); default store and "
                    "temp limits are reckoned from half the RAM (%d MiB): set [limits] "
                    "store_limit and temp_limit", probe, free // MiB)
        return free
    return usage.free


class Buffered(Protocol):
    """A connection's output side: what it has written that its socket has not taken yet."""

    @property
    def buffered(self) -> int: ...


class MemoryAccount:
    """RAM held for clients across the broker: queued messages (cursors add and subtract)
    and output written to connections that their sockets have not taken yet.

    Why output counts: a peer that stops reading holds what was written to it, up to its share
    of ``output_buffer_bytes``; 200 stuck subscribers held the whole 64 MiB of it on top of a
    full memory limit. ``memory_limit`` is the promise of what clients can make the broker
    hold, so the two share it: output is charged here, cursors page out sooner while it is
    high, and connections' shares are carved from what queued messages leave (``room``).
    Transports report their backlog when it changes (``charge``); since a socket drains
    without telling anyone, ``recount`` re-reads the charged ones once a tick.

    Connections' own state counts too (``open``/``close``: a WebSocket's parsed upgrade
    request, reader, writer and tasks, ~23 KiB measured; a TCP connection's protocol, session
    and parser, a few KiB), and so do destinations' (``destinations``: a queue's cursor,
    stats and policy, a topic, a durable subscription, a few KiB each whatever they hold).
    Unlike messages neither can be paged out, so together they may take at most the part of
    the limit store cursors leave free (``limit - high_water``): a connection or a new
    destination past it is refused (``refusal``). Without it 5,000 WebSockets from five
    addresses filled the connections' part while 2,000 queues and 1,000 durable subscriptions
    earlier attacks left held ~14 MiB more that nothing counted.
    """

    __slots__ = ("_charged", "connections", "high_water", "limit", "objects", "output", "peak",
                 "used")

    def __init__(self, limit: int, high_water: float = CURSOR_HIGH_WATER) -> None:
        self.limit = limit
        self.high_water = int(limit * high_water)
        self.used = 0  # queued messages
        self.output = 0  # written to connections, not yet taken by their sockets
        self.connections = 0  # open connections' own state (``open``)
        self.objects = 0  # destinations' own state (``destinations``)
        self.peak = 0  # the most ``used`` reached since the heap trimmer last looked
        self._charged: dict[Buffered, int] = {}  # connections with output charged

    def cursor_room(self) -> bool:
        """May a store cursor keep one more message in memory?"""
        return self.used + self.output + self.connections + self.objects < self.high_water

    @property
    def full(self) -> bool:
        return self.used + self.output + self.connections + self.objects >= self.limit

    @property
    def held(self) -> int:
        """All that counts against the limit now."""
        return self.used + self.output + self.connections + self.objects

    def room(self) -> int:
        """What queued messages and connections leave of the limit: the most output may take."""
        return max(0, self.limit - self.used - self.connections - self.objects)

    def refusal(self, cost: int, kind: str) -> str | None:
        """Why one more ``kind`` of ``cost`` bytes of its own state is refused, or None:
        connections and destinations together may hold at most what store cursors leave."""
        most = self.limit - self.high_water
        fixed = self.connections + self.objects
        if fixed + cost <= most:
            return None
        return (f"memory limit reached: connections and destinations hold {fixed} bytes, "
                f"at most {most} (the {most * 100 // max(1, self.limit)}% of memory_limit "
                f"{self.limit} not given to queued messages; a {kind} takes {cost})")

    def open(self, cost: int, kind: str = "connection") -> str | None:
        """Charge a new connection's own state (``cost`` bytes), or say why it is refused."""
        refused = self.refusal(cost, kind)
        if refused is None:
            self.connections += cost
        return refused

    def destinations(self, count: int, cost: int) -> None:
        """``count`` destinations of ``cost`` bytes each exist now (set, not added: the broker
        counts its own tables, so no removal path can leave a charge behind)."""
        self.objects = count * cost

    def close(self, cost: int) -> None:
        """A connection charged with ``open`` is gone."""
        self.connections -= cost

    def charge(self, conn: Buffered, held: int) -> None:
        """``conn`` holds ``held`` bytes of output now (0 when it drained or is gone)."""
        before = self._charged.pop(conn, 0)
        if held > 0:
            self._charged[conn] = held
        self.output += held - before

    def recount(self) -> None:
        """Re-read what each charged connection still holds (once a tick)."""
        for conn in list(self._charged):
            self.charge(conn, conn.buffered)


Waiter = tuple[Callable[[], str | None], Callable[[], None]]


class Pacing(str):
    """A reason to wait that is producer pacing (consumers behind), not a full limit: routine
    at full speed, so it is counted apart and not logged at INFO."""

    __slots__ = ()


class TooLarge(str):
    """A reason no wait can cure: the message is larger than its destination takes, so the
    SEND gets an ERROR at once."""

    __slots__ = ()


def _too_large(size: int, limit: int) -> TooLarge:
    return TooLarge(f"message of {size} bytes exceeds the limit of {limit} bytes")


class Credit:
    """The room a transaction's COMMIT makes itself, as producer flow control counts it.

    Why: a transaction that consumes and produces (ACKs and SENDs) applies its ACKs only at
    COMMIT, so the prefetch they give back cannot take anything out of a full destination
    before; COMMIT asking for room as it stands would wait for room its own ACKs make. So a
    COMMIT's ``store_limit`` checks see its ACKed messages as gone: a destination it stores
    no more body bytes in than its ACKs free there is not held back by its cap, and one it
    stores more in is looked at with those bytes taken out; likewise the broker-wide store
    with the persistent bytes its ACKs free anywhere, and its sender's share of the store
    (``user_store_limit``) with the persistent bytes its ACKs free of her own messages.
    """

    __slots__ = ("added", "added_store", "freed", "freed_by", "freed_store", "sends")

    def __init__(self) -> None:
        self.added: dict[tuple[str, str], int] = {}  # (kind, name) -> body bytes stored there
        self.freed: dict[int, int] = {}  # id(queue) -> body bytes the ACKs take out of it
        self.added_store = 0  # persistent body bytes the SENDs store
        self.freed_store = 0  # persistent body bytes of the records the ACKs remove, anywhere
        self.freed_by: dict[bytes, int] = {}  # sender (Message.owner) -> persistent bytes
        self.sends = 0  # persistent SENDs (one is let past an empty share, as a SEND is)

    def held(self, kind: str, name: str, queue: object, held: int) -> int:
        """``held`` (ready body bytes of ``queue``, a queue or subscription of ``kind/name``)
        as that destination's ``store_limit`` sees it at this COMMIT."""
        freed = self.freed.get(id(queue), 0)
        if not freed:
            return held
        return 0 if self.added.get((kind, name), 0) <= freed else held - freed

    def store(self, used: int) -> int:
        """The broker-wide store's ``used`` bytes as this COMMIT sees them."""
        freed = self.freed_store
        if not freed:
            return used
        return 0 if self.added_store <= freed else used - freed


class FlowControl:
    """Decides whether a destination can take a message now, and resumes waiting producers.

    Sans-IO: usage comes from callables (the journal's and temp store's sizes), and resuming
    a producer is a callback; the transport does the actual pausing.
    """

    def __init__(self, limits: ResolvedLimits, memory: MemoryAccount,
                 store_used: Callable[[], int], temp_used: Callable[[], int],
                 trimmer: HeapTrimmer | None = None,
                 unwritten: Callable[[], int] = lambda: 0) -> None:
        self.limits = limits
        self.memory = memory
        self._unwritten = unwritten
        self.trimmer = trimmer or HeapTrimmer(None)
        self._store_used = store_used
        self._temp_used = temp_used
        self._waiters: list[Waiter] = []
        self._own: list[Waiter] = []  # the broker's own (the scheduler's due messages)
        self._sizes: dict[int, tuple[Policy, int, int, int, int]] = {}  # id(policy) -> sizes_of
        self.blocked_total = 0  # lifetime count of SENDs that had to wait
        self.failed_total = 0  # lifetime count of SENDs refused (fail_if_no_space)
        self.paced_total = 0  # lifetime count of SENDs held because consumers were behind

    def sizes_of(self, policy: Policy) -> tuple[Policy, int, int, int, int]:
        """``policy`` with its largest message, pacing lag, memory limit and store limit in
        bytes (a store limit given as a share, "25%", is that part of the broker's).

        Why: a policy keeps its sizes as written ("1 MiB") and every SEND reads all three;
        resolved once per policy object (destinations share the default one), keyed by id
        and held, so the id cannot be reused while the entry lives.
        """
        entry = self._sizes.get(id(policy))
        if entry is None or entry[0] is not policy:
            if len(self._sizes) >= MAX_POLICY_SIZES:
                self._sizes.clear()
            entry = (policy, parse_size(policy.max_message_bytes) or self.limits.max_message,
                     parse_size(policy.max_consumer_lag), parse_size(policy.memory_limit),
                     self._store_share(policy.store_limit))
            self._sizes[id(policy)] = entry
        return entry

    def _store_share(self, value: int | str) -> int:
        share = percent(value)
        return parse_size(value) if share is None else int(self.limits.store * share / 100)

    def too_large(self, policy: Policy, size: int) -> str | None:
        limit = self.sizes_of(policy)[1]
        return _too_large(size, limit) if size > limit else None

    def full(self, policy: Policy, persistent: bool, dest_memory: int,
             lag: int | None = None) -> str | None:
        """Why a destination with this policy cannot take a message now, or None. ``lag``:
        the body bytes its consumers are behind (None when it has no consumer: a producer
        filling a backlog is never paced)."""
        return self.refusal(policy, 0, persistent, dest_memory, lag)

    def refusal(self, policy: Policy, size: int, persistent: bool, dest_memory: int,
                lag: int | None = None, held: int = 0,
                credit: Credit | None = None) -> str | None:
        """``too_large`` and ``full`` in one look at the policy's sizes, as a SEND of ``size``
        body bytes asks (once per message: two lookups were a tenth of the plain SEND path).
        ``held``: the body bytes of the destination's ready messages and of those the
        scheduler holds for it (its policy's ``store_limit``); ``credit``: a COMMIT's own
        ACKs, for the broker-wide store. A ``TooLarge`` reason is final; any other is waited
        out."""
        entry = self._sizes.get(id(policy))
        if entry is None or entry[0] is not policy:
            entry = self.sizes_of(policy)
        _, largest, most, dest_limit, dest_store = entry  # (``sizes_of``'s look-up, written out)
        if size > largest:
            return _too_large(size, largest)
        if (lag is not None and most and lag >= most
                and (policy.pace_persistent or not persistent)):
            return Pacing(f"consumers are {lag} bytes behind (max_consumer_lag {most})")
        if persistent and self._unwritten() >= self.limits.journal_backlog:
            return (f"journal writes behind ({self._unwritten()} bytes not yet on disk, "
                    f"journal_backlog {self.limits.journal_backlog})")
        if (persistent and self._store_used() >= self.limits.store
                and (credit is None or credit.store(self._store_used()) >= self.limits.store)):
            return f"store limit reached ({self.limits.store} bytes of journal)"
        if persistent and dest_store and held >= dest_store:
            return (f"destination store limit reached ({held} bytes of ready and scheduled "
                    f"messages, store_limit {dest_store} of its policy)")
        if dest_limit and dest_memory >= dest_limit:
            return f"destination memory limit reached ({dest_limit} bytes)"
        if policy.cursor == "vm" and self.memory.full:
            return f"memory limit reached ({self.limits.memory} bytes)"
        # A store cursor pages a non-persistent message to a temp file when memory is short,
        # so a full memory budget (held by other destinations, say a durable subscription's
        # backlog) does not stop it; only the temp files' own limit does.
        memory = self.memory  # (``cursor_room``, written out: once per SEND)
        if (not persistent and memory.used + memory.output + memory.connections
                + memory.objects >= memory.high_water
                and self._temp_used() >= self.limits.temp):
            return f"temp limit reached ({self.limits.temp} bytes)"
        return None

    def store_refusal(self, policy: Policy, held: int, whole: bool) -> str | None:
        """Why a destination holding ``held`` body bytes of ready messages cannot take one
        more stored: its policy's ``store_limit`` and, with ``whole``, the broker's (a due
        scheduled message asks this, as a persistent SEND meets ``refusal``), or None."""
        if whole and self._store_used() >= self.limits.store:
            return f"store limit reached ({self.limits.store} bytes of journal)"
        dest_store = self.sizes_of(policy)[4]
        if dest_store and held >= dest_store:
            return (f"destination store limit reached ({held} bytes of ready messages, "
                    f"store_limit {dest_store} of its policy)")
        return None

    def wait(self, recheck: Callable[[], str | None], resume: Callable[[], None],
             reason: str = "", *, producer: bool = True) -> None:
        """Call ``resume`` once ``recheck`` finds room (checked on every ``poll``: after each
        dispatch pass, so a paced producer resumes as soon as its consumers caught up).
        ``producer=False``: the broker's own waiter (the scheduler), not counted as a SEND."""
        if not producer:
            self._own.append((recheck, resume))
            return
        if isinstance(reason, Pacing):
            self.paced_total += 1
        else:
            self.blocked_total += 1
        self._waiters.append((recheck, resume))

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def usage(self) -> dict[str, dict[str, int]]:
        """Each broker-wide limit with what is used of it now (console, API, metrics)."""
        return {
            "memory": {"used": self.memory.held, "limit": self.limits.memory},
            "store": {"used": self._store_used(), "limit": self.limits.store},
            "temp": {"used": self._temp_used(), "limit": self.limits.temp},
            "journal_backlog": {"used": self._unwritten(),
                                "limit": self.limits.journal_backlog},
        }

    def tick(self) -> None:
        """Once a second: re-read the output charged to the memory account; give the heap back
        once queued bytes fell far below their peak and held still (``trim.py`` counts looks,
        so this must not run per dispatch pass)."""
        memory = self.memory
        memory.recount()
        self.trimmer.observe(memory.used, memory.peak)
        memory.peak = memory.used  # a burst filled and drained between two looks still counts
        self.poll()

    def poll(self) -> None:
        """Resume, in arrival order, every waiter whose destination has room now (a resumed
        one may wait again: it joins the fresh list)."""
        if self._waiters:
            waiters, self._waiters = self._waiters, []
            self._waiters[:0] = self._resume(waiters)
        if self._own:
            own, self._own = self._own, []
            self._own[:0] = self._resume(own)

    @staticmethod
    def _resume(waiters: list[Waiter]) -> list[Waiter]:
        """Resume the ``waiters`` with room, in order; returns those still waiting."""
        still: list[Waiter] = []
        ready = []
        for recheck, resume in waiters:
            if recheck() is None:
                ready.append(resume)
            else:
                still.append((recheck, resume))
        for resume in ready:
            resume()
        return still


def user_store_limit(value: int | str, store: int) -> int:
    """``[limits] user_store_limit`` in bytes: a size, or a share of the broker's resolved
    ``store_limit`` ("25%"); 0: none."""
    share = percent(value)
    return parse_size(value) if share is None else int(store * share / 100)
