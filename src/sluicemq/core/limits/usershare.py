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

import struct
from array import array
from collections.abc import Iterable
from operator import lt
from typing import Protocol

from sluicemq.core.limits.heldbook import HeldBook
from sluicemq.core.limits.sharestate import ShareSeed
from sluicemq.core.paging.spill import JOURNAL, SpillFifo
from sluicemq.core.routing.holders import held_objects
from sluicemq.core.routing.queue import Queue
from sluicemq.core.routing.streams import StreamTable
from sluicemq.storage import records, slotpack
from sluicemq.storage.segment import HEADER_SIZE, Location

_PEEK = records.MSG_HEAD.size + 2 + 62  # a record's head and an owner of up to 62 bytes
_FLAGS_AT = struct.calcsize("<QqqB")  # where records.MSG_HEAD ("<QqqBBHI") has the flags
_SMALL = 16 << 10  # records up to this are read with their neighbours, larger ones peeked
# other bytes bridged inside one read; the most one covers (the journal keeps the buffer for
# its next read_extent: 16 MiB spans, as runread's, left 16 MiB of RSS after the recount)
_GAP, _SPAN = 64 << 10, 1 << 20


class UserShares:
    """Stored body bytes by login, kept by the store (``storage.store.ShareBook``)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._numbers: dict[bytes, int] = {}  # owner (records.encode_owner) -> number
        self._owners: list[bytes] = []
        self._used: list[int] = []  # body bytes by number
        self._staged: list[int] = []  # messages in parked (staged, unpublished) parts by number
        self._held = HeldBook()  # stored messages by id (a few bytes each)

    @property
    def book(self) -> HeldBook:
        return self._held

    @property
    def logins(self) -> list[bytes]:
        """The owners by number (``records.encode_owner``)."""
        return self._owners

    def _number(self, owner: bytes) -> int:
        n = self._numbers.get(owner)
        if n is None:
            n = self._numbers[owner] = len(self._owners)
            self._owners.append(owner)
            self._used.append(0)
            self._staged.append(0)
        return n

    def charge(self, owner: bytes, mid: int, size: int, holds: int) -> None:
        """Message ``mid`` of ``size`` body bytes from ``owner`` is stored, held by ``holds``
        queues; a message already charged only gains the holders."""
        n = self._number(owner)
        if self._held.add(mid, n, size, holds):
            self._used[n] += size

    def charge_run(self, owner: bytes, mids: array, sizes: array, *,
                   ascending: bool = False) -> bool:
        """``charge`` of ascending ``mids`` of one sender held once each, column-wise, when
        none is charged yet (``HeldBook.add_run``); False, nothing charged, otherwise."""
        n = self._number(owner)
        if not self._held.add_run(n, mids, sizes, ascending=ascending):
            return False
        self._used[n] += sum(sizes)
        return True

    def release(self, mid: int) -> None:
        """One holder of ``mid`` let go; the last gives its bytes back. A message never
        charged (non-persistent) is ignored."""
        gone = self._held.remove(mid)
        if gone is not None:
            self._used[gone[0]] -= gone[1]

    def release_run(self, mids: array) -> None:
        release = self.release
        for mid in mids:
            release(mid)

    def stage(self, owner: bytes, size: int, count: int) -> None:
        """``count`` messages of ``size`` body bytes in all were staged by ``owner``: a parked
        part's records are hers until published (then its messages are charged one by one)
        or discarded."""
        n = self._number(owner)
        self._used[n] += size
        self._staged[n] += count

    def unstage(self, owner: bytes, size: int, count: int) -> None:
        """Staged messages that ``stage`` charged were published or discarded."""
        n = self._number(owner)
        self._used[n] -= size
        self._staged[n] -= count

    def holders(self, mid: int) -> int:
        """How many queues still hold charged message ``mid`` (0: not charged)."""
        return self._held.holders(mid)

    def used(self, owner: bytes) -> int:
        n = self._numbers.get(owner)
        return 0 if n is None else self._used[n]

    def refusal(self, owner: bytes, size: int, freed: int = 0,
                whole: bool = True) -> str | None:
        """Why ``owner`` may not store ``size`` more body bytes now, or None. A message larger
        than the whole share is taken while the user has nothing stored (it could never be
        sent otherwise); ``whole`` False: ``size`` is several messages (a COMMIT's), which get
        no such pass - else one COMMIT at an empty share stored up to max_transaction_bytes.
        ``freed``: bytes of hers the same COMMIT removes (its own ACKs)."""
        used = self.used(owner)
        if size <= freed:
            return None
        if (used > freed or not whole) and max(used - freed, 0) + size > self.limit:
            return (f"user store limit reached ({used} bytes of persistent messages of user "
                    f"{records.owner_name(owner)!r}, user_store_limit {self.limit})")
        return None

    def by_user(self) -> dict[str, dict[str, int]]:
        """Per login: stored body bytes and messages (the admin API and /metrics)."""
        counts = [a + b for a, b in zip(self._held.counts(len(self._owners)), self._staged,
                                        strict=True)]
        return {records.owner_name(owner): {"bytes": self._used[n], "messages": counts[n]}
                for n, owner in enumerate(self._owners)}


class RecordReader(Protocol):
    """What ``recount`` reads records with (``Journal``)."""

    def peek(self, loc: Location, start: int, length: int) -> bytes: ...

    def read_extent(self, segment: int, start: int, end: int) -> memoryview: ...


def recount(shares: UserShares, queues: Iterable[Queue], streams: StreamTable,
            journal: RecordReader, staged: Iterable[tuple[bytes, int, int]] = (),
            seed: ShareSeed | None = None) -> tuple[int, int]:
    """Charge every stored message the queues hold to its sender, and each parked staged
    part (``staged``: owner, body bytes, messages) to its stager; returns the messages
    counted and how many senders were read from the journal. The sender comes from the
    index snapshot's book (``seed``, ``sharestate.py``) when it covers the record, else from
    the record's head (replay keeps no owner): paged-out slots are read a block at a time,
    neighbouring small records with one ``read_extent`` (one ``peek`` a message took
    ~4.5 us: 0.9 s for a 200k backlog)."""
    n = read = 0
    for owner, size, count in staged:
        shares.stage(owner, size, count)
        n += count
    for q in queues:
        for m in held_objects(q, streams, {}):
            loc = m.ticket.loc if m.persistent and m.ticket is not None else None
            if loc is None or m.inner < 0:
                continue
            known = seed.owner(m.mid, loc.segment, loc.offset) if seed is not None else None
            if known is None:
                known = _peek_owner(journal, loc, m.inner)
                read += 1
            m.owner = known
            shares.charge(m.owner, m.mid, m.size, 1)
            n += 1
        for _prio, _head, tail in q.pending.lanes():
            if tail:
                counted, unread = _charge_lane(shares, tail, journal, seed)
                n += counted
                read += unread
    return n, read


def _charge_lane(shares: UserShares, tail: SpillFifo, journal: RecordReader,
                 seed: ShareSeed | None) -> tuple[int, int]:
    """``recount`` of a paged-out lane's journal slots, one block of slots at a time: a run
    one user filled before the snapshot's position is charged at once (``charge_run``), the
    others one by one, their senders from the snapshot or read. Why a block at a time: the
    whole lane's columns at once were ~10 MiB of arrays for a 200k backlog, freed into
    glibc's heap, which keeps up to 32 MiB of free top (app.py ``TRIM_THRESHOLD``): +11 MiB
    of RSS for good after such a restart."""
    n = read = 0
    runs = tail.runs() if seed is not None else []
    for i, j, packed, fields, k in tail.pieces():
        if fields is None:  # a sealed block of journal slots: unpacked for this step only
            assert packed is not None
            fields = slotpack.unpack(packed)
        mids, srcs, segs, offs, lengths, inners, sizes = fields
        lo, hi = k, k + j - i
        first = lo  # slots before it were charged column-wise
        if seed is not None:
            cut = seed.covered(segs, offs, lo, hi)
            ids = mids[lo:cut]
            if (cut > lo and (packed is not None or srcs[lo:cut].count(JOURNAL) == cut - lo)
                    and (_in_one_run(runs, i, i + cut - lo) or all(map(lt, ids, ids[1:])))):
                sender = seed.run_owner(ids)
                if sender is not None and shares.charge_run(sender, ids, sizes[lo:cut],
                                                            ascending=True):
                    n += cut - lo
                    first = cut
        unknown = []
        for x in range(first, hi):
            if srcs[x] != JOURNAL:
                continue
            n += 1
            known = seed.owner(mids[x], segs[x], offs[x]) if seed is not None else None
            if known is None:
                unknown.append(x)
            else:
                shares.charge(known, mids[x], sizes[x], 1)
        owners = _owners(journal, [(segs[x], offs[x], lengths[x], inners[x]) for x in unknown])
        for x, owner in zip(unknown, owners, strict=True):
            shares.charge(owner, mids[x], sizes[x], 1)
        read += len(unknown)
    return n, read


def _in_one_run(runs: list[tuple[int, int]], i: int, j: int) -> bool:
    """Whether array indexes ``[i, j)`` lie in one of ``runs`` (``SpillFifo.runs``: windows
    in which ids ascend), so their order needs no walk."""
    return any(lo <= i and j <= hi for lo, hi in runs)


def _peek_owner(journal: RecordReader, loc: Location, inner: int) -> bytes:
    head = journal.peek(loc, inner, _PEEK)
    flags = records.MSG_HEAD.unpack_from(head, 0)[4]
    need = records.MSG_HEAD.size + records.owner_prefix(head, flags)
    if need > len(head):
        head = journal.peek(loc, inner, need)
    return records.message_owner(head)


def _owners(journal: RecordReader, slots: list[tuple[int, int, int, int]]) -> list[bytes]:
    """The owner of each (segment, offset, length, inner) record, in order: runs of small
    records that follow each other in one segment are read with one ``read_extent`` (a lane
    is in journal order, mostly), a large record (or one out of order) by a ``peek``."""
    out: list[bytes] = []
    i, n = 0, len(slots)
    while i < n:
        seg, start, length, inner = slots[i]
        end = start + HEADER_SIZE + length
        if length > _SMALL:
            out.append(_peek_owner(journal, Location(seg, start, length), inner))
            i += 1
            continue
        j = i + 1
        while j < n:
            s2, o2, l2, _ = slots[j]
            if (s2 != seg or l2 > _SMALL or o2 < slots[j - 1][1] or o2 > end + _GAP
                    or o2 + HEADER_SIZE + l2 - start > _SPAN):
                break
            end = max(end, o2 + HEADER_SIZE + l2)
            j += 1
        buf = journal.read_extent(seg, start, end)
        for _seg, off, _length, inner2 in slots[i:j]:
            p = off - start + HEADER_SIZE + inner2
            if buf[p + _FLAGS_AT] & records.OWNER_FLAG:
                k = p + records.MSG_HEAD.size
                out.append(bytes(buf[k:k + 2 + (buf[k] | buf[k + 1] << 8)]))
            else:
                out.append(b"")
        del buf  # (the journal reuses its buffer once nothing refers to it)
        i = j
    return out
