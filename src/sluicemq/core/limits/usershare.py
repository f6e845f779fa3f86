"""The per-user share of the store: body bytes of persistent messages each login has stored.

Why: a destination's ``store_limit`` bounds what one destination holds, but one user could
still fill the store through many destinations. ``[limits] user_store_limit`` bounds what one
login has in the store, ready or delivered and unacknowledged, in any destination; a SEND past
it waits like any flow-control wait (or is refused with ``fail_if_no_space``), and other users
are not held up (docs/user-store-share.md).

Who sent a message is in its record (``records.OWNER_FLAG``), so the tally is rebuilt from the
journal at start-up (``recount``); while running, the store charges each message record it
appends and gives the bytes back when the record's last holder lets go (``Store.remove``,
``remove_run``, transactions), counted by message id: a topic record held by several durable
subscriptions is charged once. The book exists only while a limit is set: without one the
store pays nothing per message.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable

from sluicemq.core.paging.spill import JOURNAL
from sluicemq.core.routing.holders import held_objects
from sluicemq.core.routing.queue import Queue
from sluicemq.core.routing.streams import StreamTable
from sluicemq.storage import records
from sluicemq.storage.segment import Location

# A held record's entry: body size, holders and the owner's number in one int (no tuple a
# message): size << _SIZE_AT | holds << _HOLDS_AT | number.
_HOLDS_AT, _SIZE_AT = 20, 40
_FIELD = (1 << 20) - 1
_PEEK = records.MSG_HEAD.size + 2 + 62  # a record's head and an owner of up to 62 bytes


class UserShares:
    """Stored body bytes by login, kept by the store (``storage.store.ShareBook``)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._numbers: dict[bytes, int] = {}  # owner (records.encode_owner) -> number
        self._owners: list[bytes] = []
        self._used: list[int] = []  # body bytes by number
        self._held: dict[int, int] = {}  # message id -> packed entry (above)
        # A dict keeps its table when entries go: once a drained backlog left it an eighth
        # full it is copied into one its size (200k x 1 KiB drained kept +29 MiB otherwise).
        self._low = 0

    def _number(self, owner: bytes) -> int:
        n = self._numbers.get(owner)
        if n is None:
            n = self._numbers[owner] = len(self._owners)
            self._owners.append(owner)
            self._used.append(0)
        return n

    def charge(self, owner: bytes, mid: int, size: int, holds: int) -> None:
        """Message ``mid`` of ``size`` body bytes from ``owner`` is stored, held by ``holds``
        queues; a message already charged only gains the holders."""
        entry = self._held.get(mid)
        if entry is not None:
            self._held[mid] = entry + (holds << _HOLDS_AT)
            return
        n = self._number(owner)
        held = self._held
        held[mid] = size << _SIZE_AT | holds << _HOLDS_AT | n
        self._used[n] += size
        if len(held) >> 3 > self._low:
            self._low = len(held) >> 3

    def release(self, mid: int) -> None:
        """One holder of ``mid`` let go; the last gives its bytes back. A message never
        charged (non-persistent, or stored by staged publishing) is ignored."""
        entry = self._held.get(mid)
        if entry is None:
            return
        if (entry >> _HOLDS_AT) & _FIELD > 1:
            self._held[mid] = entry - (1 << _HOLDS_AT)
            return
        held = self._held
        del held[mid]
        self._used[entry & _FIELD] -= entry >> _SIZE_AT
        if len(held) < self._low:
            self._held = dict(held)
            self._low = len(held) >> 3

    def release_run(self, mids: array) -> None:
        release = self.release
        for mid in mids:
            release(mid)

    def used(self, owner: bytes) -> int:
        n = self._numbers.get(owner)
        return 0 if n is None else self._used[n]

    def refusal(self, owner: bytes, size: int) -> str | None:
        """Why ``owner`` may not store ``size`` more body bytes now, or None. A message larger
        than the whole share is taken while the user has nothing stored (it could never be
        sent otherwise)."""
        used = self.used(owner)
        if used and used + size > self.limit:
            return (f"user store limit reached ({used} bytes of persistent messages of user "
                    f"{records.owner_name(owner)!r}, user_store_limit {self.limit})")
        return None

    def by_user(self) -> dict[str, dict[str, int]]:
        """Per login: stored body bytes and messages (the admin API and /metrics)."""
        counts = [0] * len(self._owners)
        for entry in self._held.values():
            counts[entry & _FIELD] += 1
        return {records.owner_name(owner): {"bytes": self._used[n], "messages": counts[n]}
                for n, owner in enumerate(self._owners)}


def recount(shares: UserShares, queues: Iterable[Queue], streams: StreamTable,
            peek: Callable[[Location, int, int], bytes]) -> int:
    """Charge every stored message the queues hold to its sender, read from its record's
    head (start-up: replay keeps no owner); returns the messages counted. ``peek(loc, start,
    length)``: bytes of a record without verifying it (``Journal.peek``)."""

    def owner_at(loc: Location, inner: int) -> bytes:
        head = peek(loc, inner, _PEEK)
        flags = records.MSG_HEAD.unpack_from(head, 0)[4]
        need = records.MSG_HEAD.size + records.owner_prefix(head, flags)
        if need > len(head):
            head = peek(loc, inner, need)
        return records.message_owner(head)

    n = 0
    for q in queues:
        for m in held_objects(q, streams, {}):
            loc = m.ticket.loc if m.persistent and m.ticket is not None else None
            if loc is None or m.inner < 0:
                continue
            m.owner = owner_at(loc, m.inner)
            shares.charge(m.owner, m.mid, m.size, 1)
            n += 1
        for _prio, _head, tail in q.pending.lanes():
            if not tail:
                continue
            mids, srcs, segs, offs, lengths, inners, sizes = tail.columns(
                tail.indexes().start, tail.end)
            for x, src in enumerate(srcs):
                if src == JOURNAL:
                    owner = owner_at(Location(segs[x], offs[x], lengths[x]), inners[x])
                    shares.charge(owner, mids[x], sizes[x], 1)
                    n += 1
    return n
