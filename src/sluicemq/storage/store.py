"""The broker's view of the journal: typed appends, reference counting, durability callbacks.

Why a layer between broker and journal: the journal knows records and segments, the broker
knows messages and queues. The store turns "this message is now held by that queue" into
retain/release calls that let the journal delete segments, batches acknowledgements into one
record per loop turn, and tells the broker when an appended sequence number is durable.
"""

from __future__ import annotations

import logging
import time
from array import array
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple, Protocol

from sluicemq.storage import records
from sluicemq.storage.journal import Journal, Location
from sluicemq.storage.release import SegmentRelease, segment_release
from sluicemq.storage.shared import SharedRecords

log = logging.getLogger("sluicemq.store")

TX_RECORD_BYTES = 4 << 20  # a transaction larger than this is journaled as parts + a final
SPLIT_BODY = 64 << 10  # a body this large is written from its own buffer (Journal.append tail)
FULL_BATCH = 1024  # records a loaded group commit may have and still be committed in place
INLINE_BYTES = 256 << 10  # unwritten bytes above which a batch goes to the writer at once
QUIET_ITERATION = 100e-6  # a loop iteration this short did little besides looking at the batch
FILL_LOOKS = 3  # loop iterations a loaded batch may wait for more records


class TicketLike(Protocol):
    seq: int
    loc: Location | None


class RecoveredTicket:
    """A record found on disk at start-up: durable by definition."""

    __slots__ = ("loc", "seq")

    def __init__(self, loc: Location) -> None:
        self.seq = 0
        self.loc: Location | None = loc


class NewMessage(NamedTuple):
    """A message record a transaction writes, and how many holders it will have."""

    key: str
    mid: int
    timestamp: int
    expires: int
    priority: int
    headers: dict[str, str]
    body: bytes | memoryview
    holders: int = 1
    owner: bytes = b""  # the sender (``records.encode_owner``), b"": anonymous


class Removed(NamedTuple):
    """A message record a transaction removes (its holder let go of it)."""

    key: str
    mid: int
    ticket: TicketLike


class ShareBook(Protocol):
    """What the store tells the per-user share of the store (``UserShares``)."""

    def charge(self, owner: bytes, mid: int, size: int, holds: int) -> None: ...

    def release(self, mid: int) -> None: ...

    def release_run(self, mids: array) -> None: ...

    def stage(self, owner: bytes, size: int, count: int) -> None: ...

    def unstage(self, owner: bytes, size: int, count: int) -> None: ...


class Deferred(Protocol):
    """Messages whose record is deferred (``StoreLater``): their body bytes."""

    bytes: int


class _NoneDeferred:
    bytes = 0


_NOTHING_DEFERRED = _NoneDeferred()


class Store:
    """Appends records for the broker and runs the loop-side half of group commit.

    Every method runs on the event-loop thread; the journal's writer thread only calls the
    two callbacks passed to ``start``, which hop back to the loop through ``call_soon_threadsafe``.
    """

    def __init__(self, journal: Journal, schedule: Callable[[Callable[[], object]], Any],
                 *, inline_commit: bool = True,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.journal = journal
        self._schedule = schedule
        self._clock = clock
        # Called (on a later loop turn) when releases left the oldest segment with only a few
        # records: holders of one pinned record (memo anchors, the snapshot pin) move it forward
        # as soon as it is what keeps the oldest segment, so empty segments do not pile up
        # behind it until a timer fires.
        self.reclaim_watchers: list[Callable[[], None]] = []
        self._inline_commit = inline_commit
        # True while an in-place commit's durable report runs: the turn has nothing left to
        # do, so a receipt it answers may be written at once instead of on the next loop
        # iteration (a lone synchronous producer's receipt: one epoll round less).
        self.in_place = False
        self._turn_scheduled = False
        self._looked = (0, 0.0)  # (appended_seq, clock) when _end_turn last let a batch fill
        self._quiet = False  # the loop iteration before that look did little else
        self._looks = 0  # loop iterations the batch has waited to fill
        journal.wake_on_append = False  # one hand-off per loop turn, decided in _end_turn
        # The per-user share of the store (core/limits/usershare.py), when it is kept: charged
        # by message appends, given back by removals. None (no per-message cost) otherwise.
        self.shares: ShareBook | None = None
        # Holders of the records several queues hold (a topic's, its durable subscriptions)
        self.shared = SharedRecords()
        self.durable_seq = 0
        self.appended_seq = 0
        self._releases: deque[tuple[int, TicketLike | SegmentRelease]] = deque()
        self._after: deque[tuple[int, Callable[[], None]]] = deque()  # after_durable
        self._acks: list[tuple[str, int, TicketLike]] = []
        self._flush_scheduled = False
        self.on_durable: Callable[[int], None] = lambda seq: None
        self.on_failed: Callable[[int, int, BaseException], None] = lambda a, b, e: None
        # Called before a record is appended (a message's queue key, or None for any other
        # record but an ACK batch) and at close: the broker journals messages it deferred
        # (concurrent store and dispatch) first, so the log keeps every queue's order.
        self.pre_append: Callable[[str | None], None] = lambda key: None
        self.deferred: Deferred = _NOTHING_DEFERRED  # the broker's StoreLater

    # -- lifecycle ---------------------------------------------------------------------------
    def recover(self) -> Iterator[tuple[int, Any, RecoveredTicket]]:
        for rtype, payload, loc in self.journal.recover():
            yield rtype, payload, RecoveredTicket(loc)

    def read(self, loc: Location) -> bytes:
        return self.journal.read(loc)

    def read_many(self, locs: list[tuple[int, int, int]]) -> list[bytes | memoryview]:
        """Payloads of many records, verified, in order (``Journal.read_many``)."""
        return self.journal.read_many(locs)

    def peek_headers(self, loc: Location, inner: int = 0) -> dict[str, str]:
        """The headers of the message stored at ``loc`` (at ``inner`` inside a transaction
        record), read without its body and without checksum verification."""
        head = self.journal.peek(loc, inner, 4096)
        need = records.message_prefix_size(head)
        if need > len(head):
            head = self.journal.peek(loc, inner, need)
        return records.message_headers(head)

    def start(self, call_soon_threadsafe: Callable[..., Any]) -> None:
        self.journal.start(
            lambda seq: call_soon_threadsafe(self._durable, seq),
            lambda first, last, exc: call_soon_threadsafe(self._failed, first, last, exc),
        )

    def close(self, on_closed: Callable[[], None] | None = None) -> None:
        """Journal the last acks and close; ``on_closed`` as in ``Journal.close``."""
        self.pre_append(None)
        self.flush()
        self.journal.close(on_closed)

    def settled_counts(self) -> dict[int, int]:
        """Live records per segment once every queued release has been applied: what the
        broker's holders must add up to, as of the last record appended (index snapshot
        self-check). Every queued release waits for a record already appended."""
        counts = dict(self.journal.live_counts())
        for _seq, t in self._releases:
            if isinstance(t, SegmentRelease):
                for seg, n in t.counts.items():
                    counts[seg] = counts.get(seg, 0) - n
            elif t.loc is not None:
                counts[t.loc.segment] = counts.get(t.loc.segment, 0) - 1
        return counts

    # -- appends -----------------------------------------------------------------------------
    def _append(self, rtype: int, payload: bytes, tail: bytes = b"", holds: int = 0) -> TicketLike:
        ticket = self.journal.append(rtype, payload, tail, holds)
        self.appended_seq = ticket.seq
        if not self._turn_scheduled:
            self._turn_scheduled = True
            self._schedule(self._end_turn)
        return ticket

    def _end_turn(self) -> None:
        """Everything this loop turn appended goes to disk as one batch: in place when it is
        small and the writer idles (lowest latency), else on the writer thread.

        Under load (recent group commits above ``commit_now``'s few records) the batch
        first fills: it waits while loop iterations add to it, and once one added nothing
        and did little else, it is committed in place as well. Why: the writer thread
        cannot take a batch while the loop is busy (it waits for the GIL, which the loop
        takes back between its callbacks), so it took the batch only when the loop fell
        idle anyway, and then the loop idled again through the hand-offs to the writer and
        back (8 producers x 8 in flight: ~75 us of each ~1.6 ms cycle of 64 records)."""
        self._turn_scheduled = False
        if self._acks:
            self.flush()
            self._turn_scheduled = False
        journal = self.journal
        if self._inline_commit and journal.commit_now(report=False):
            self.in_place = True  # what this report answers may go out at once (in_place)
            try:
                self._durable(journal.durable_seq)  # answer receipts now, not a turn later
            finally:
                self.in_place = False
            return
        # (a stream's chunks are past INLINE_BYTES: they go to the writer at once, as before)
        if self._inline_commit and journal.loaded and journal.unwritten_bytes <= INLINE_BYTES:
            if self._filling():
                self._turn_scheduled = True
                self._schedule(self._end_turn)  # look again after the loop's next iteration
                return
            if self._quiet and journal.commit_now(FULL_BATCH, INLINE_BYTES, report=False):
                self._durable(journal.durable_seq)  # (not in_place: many receipts, one flush)
                return
        self._looks = 0
        journal.kick()

    def _filling(self) -> bool:
        """Should a loaded batch wait one more loop iteration? While the last iteration added
        to it, the writer idles (else the writer takes it when done) and it has not waited
        ``FILL_LOOKS`` iterations yet. Notes whether that iteration was quiet."""
        seq, now = self.appended_seq, self._clock()
        last_seq, last_at = self._looked
        self._looked = (seq, now)
        self._quiet = now - last_at < QUIET_ITERATION
        if seq == last_seq or self._looks >= FILL_LOOKS or not self.journal.writer_idle:
            self._looks = 0
            return False
        self._looks += 1
        return True

    def append_message(self, key: str, mid: int, timestamp: int, expires: int, priority: int,
                       headers: dict[str, str], body: bytes, holds: int = 0,
                       owner: bytes = b"") -> TicketLike:
        """Append a MSG record, held by ``holds`` queues from the start (as ``hold``), sent
        by ``owner`` (``records.encode_owner``; charged to its share when shares are kept)."""
        self.pre_append(key)
        shares = self.shares
        if shares is not None:
            shares.charge(owner, mid, len(body), holds or 1)
        if holds > 1:
            self.shared.add(mid, holds)
        if len(body) >= SPLIT_BODY:  # written from its own buffer, not copied into the record
            head = records.encode_message_head(key, mid, timestamp, expires, priority, headers,
                                               owner)
            return self._append(records.MSG, head, body, holds)
        ticket = self.journal.append(records.MSG, records.encode_message(  # (``_append``,
            key, mid, timestamp, expires, priority, headers, body, owner), b"", holds)  # inlined)
        self.appended_seq = ticket.seq
        if not self._turn_scheduled:
            self._turn_scheduled = True
            self._schedule(self._end_turn)
        return ticket

    def append_tx(self, txid: str, ops: list[tuple[int, bytes]], *, final: bool) -> TicketLike:
        self.pre_append(None)
        return self._append(records.TX, records.encode_tx(txid, ops, final=final))

    def transaction(self, txid: str, added: Iterable[NewMessage],
                    removed: Iterable[Removed] = ()) -> list[tuple[TicketLike, int]]:
        """Store ``added`` and remove ``removed`` as one journal transaction: all of it or
        none of it survives a crash. This is the one way several messages change at once
        (COMMIT, dead-lettering, moves): callers hand over messages, never records or pins.

        A transaction whose records outgrow ``TX_RECORD_BYTES`` is written as parts and a
        final (recovery applies none of it without the final). Each added record is held by
        its ``holders``; the removed ones are unpinned once the final is durable. Returns,
        for each added message, its ticket and where it starts inside the record (``inner``).
        """
        first = records.tx_op_offsets(txid, [(records.MSG, b"")])[0]  # where op payloads start
        parts: list[list[tuple[int, bytes]]] = []
        ops: list[tuple[int, bytes]] = []
        size, pos = 0, first
        placed: list[tuple[int, int, int]] = []  # (part, inner, holders) of each added message
        shares = self.shares
        for m in added:
            payload = records.encode_message(m.key, m.mid, m.timestamp, m.expires, m.priority,
                                             m.headers, m.body, m.owner)
            if shares is not None:
                shares.charge(m.owner, m.mid, len(m.body), m.holders)
            self.shared.add(m.mid, m.holders)
            placed.append((len(parts), pos, m.holders))
            ops.append((records.MSG, payload))
            size += len(payload)
            pos += len(payload) + records.OP_HEAD_SIZE
            if size >= TX_RECORD_BYTES:
                parts.append(ops)
                ops, size, pos = [], 0, first
        gone = list(removed)
        for r in gone:
            if shares is not None:
                shares.release(r.mid)
            self.shared.release(r.mid)
        if gone:
            ops.append((records.ACK, records.encode_acks((r.key, r.mid) for r in gone)))
        if ops or parts:
            parts.append(ops)
        tickets = [self.append_tx(txid, part, final=i == len(parts) - 1)
                   for i, part in enumerate(parts)]
        if tickets and gone:
            self.release_after(tickets[-1].seq, [r.ticket for r in gone])
        result = []
        for part, inner, holders in placed:
            ticket = tickets[part]
            self.hold(ticket, holders)
            result.append((ticket, inner))
        return result

    def append_record(self, rtype: int, payload: bytes) -> TicketLike:
        """Any other record type (staging, memo tables: ``storage/staging_records.py``)."""
        self.pre_append(None)
        return self._append(rtype, payload)

    # -- records that stand for state (staged parts, subscriptions, stream tails, memos) ----
    # Such a record is not a message a queue holds: it is pinned by whoever keeps the state,
    # and made redundant by a later record (a publication or discard of staged parts, a newer
    # copy of a table). These calls do that bookkeeping, so their owners never count pins.
    def keep(self, rtype: int, payload: bytes,
             replaces: Iterable[TicketLike] = ()) -> TicketLike:
        """Append a record that stays on disk until ``let_go`` or ``settle`` names it; the
        ``replaces`` records (an older copy) are unpinned once the new one is durable, so a
        crash in between finds one or the other."""
        ticket = self.append_record(rtype, payload)
        self.keep_appended(ticket, replaces)
        return ticket

    def keep_appended(self, ticket: TicketLike, replaces: Iterable[TicketLike] = ()) -> None:
        """``keep`` for a record appended as something else: a stream's newest chunk is a
        message its queues hold, and also what remembers how far the stream got."""
        self.hold(ticket)
        self.release_after(self.appended_seq, replaces)

    def keep_sub(self, sub: records.DurableSub) -> TicketLike:
        """Journal a durable subscription (SUB): kept until ``end_sub`` (or a compacted copy
        replaces it)."""
        return self.keep(records.SUB, records.encode_sub(sub))

    def end_sub(self, key: str, held: Iterable[TicketLike]) -> TicketLike:
        """Journal the end of durable subscription ``key`` (UNSUB): its SUB record and the
        messages it still ``held`` are let go once that is durable."""
        return self.settle(records.UNSUB, records.encode_unsub(key), held)

    def settle(self, rtype: int, payload: bytes, settled: Iterable[TicketLike]) -> TicketLike:
        """Append a record that makes the kept ``settled`` records redundant (staged parts
        published or discarded): they are unpinned once it is durable."""
        ticket = self.append_record(rtype, payload)
        self.release_after(ticket.seq, settled)
        return ticket

    def let_go(self, tickets: Iterable[TicketLike]) -> None:
        """Unpin kept records that nothing newer stands in for (an abandoned part, an emptied
        table, originals whose copies are durable): now if everything appended so far is
        durable (``release_after`` would wait for the next write), else once it is."""
        tickets = list(tickets)
        if not tickets:
            return
        seq = self.flush()
        if seq > self.durable_seq:
            self.release_after(seq, tickets)
            return
        for t in tickets:
            if t.loc is not None:
                self.journal.release(t.loc)
        self.journal.reclaim()

    def hold_rows(self, counts: dict[int, int], newest: tuple[int, int]) -> None:
        """Queues adopted ``counts`` rows of records per segment as their slots (published
        staged rows, kept in columns, not as tickets); ``newest`` is the newest such record."""
        self.journal.retain_counts(counts, newest)

    # -- references --------------------------------------------------------------------------
    def hold(self, ticket: TicketLike, count: int = 1) -> None:
        """``count`` queues now hold the record: pin its segment (locations are final at append)."""
        if ticket.loc is not None:
            for _ in range(count):
                self.journal.retain(ticket.loc)

    def remove(self, key: str, mid: int, ticket: TicketLike) -> None:
        """A queue let go of a message: journal that in the next batched ACK record."""
        shares = self.shares
        if shares is not None:
            shares.release(mid)
        if self.shared.held:
            self.shared.release(mid)
        if not self._acks and not self._flush_scheduled:  # (``remove_copy``, written out:
            self._flush_scheduled = True  # once per consumed message)
            self._schedule(self.flush)
        self._acks.append((key, mid, ticket))

    def remove_copy(self, key: str, mid: int, ticket: TicketLike) -> None:
        """``remove`` of a record no share counts (compaction's copy of a message consumed
        while it was copied: the original's removal gave the room back)."""
        if not self._acks and not self._flush_scheduled:
            self._flush_scheduled = True
            self._schedule(self.flush)
        self._acks.append((key, mid, ticket))

    def remove_run(self, key: str, mids: array, segments: array, offsets: array) -> None:
        """A queue let go of many paged-out messages at once (ids, and their records'
        segments and offsets): one ACK record now, their records unpinned once it is durable,
        counted per segment - no object per message."""
        if not mids:
            return
        shares = self.shares
        if shares is not None:
            shares.release_run(mids)
        if self.shared.held:
            self.shared.release_run(mids)
        ticket = self._append(records.ACK, records.encode_ack_run(key, mids))
        self._releases.append((ticket.seq, segment_release(segments, offsets)))

    def release_after(self, seq: int, tickets: Iterable[TicketLike]) -> None:
        """Unpin these records once record ``seq`` (which removes them) is durable."""
        for t in tickets:
            self._releases.append((seq, t))

    def flush(self) -> int:
        """Write the pending ACK batch; returns the newest appended sequence number."""
        self._flush_scheduled = False
        if self._acks:
            acks = self._acks
            self._acks = []
            ticket = self._append(records.ACK, records.encode_acks((k, m) for k, m, _ in acks))
            self.release_after(ticket.seq, (t for _, _, t in acks))
        return self.appended_seq

    # -- durability (loop thread) ------------------------------------------------------------
    def _durable(self, seq: int) -> None:
        if seq <= self.durable_seq:
            return
        self.durable_seq = seq
        releases = self._releases
        released = False
        while releases and releases[0][0] <= seq:
            _, t = releases.popleft()
            if isinstance(t, SegmentRelease):
                self.journal.release_counts(t.counts, t.newest)
                released = True
            elif t.loc is not None:
                self.journal.release(t.loc)
                released = True
        if released:
            self.journal.reclaim()
            if self.reclaim_watchers and self._oldest_nearly_free():
                self._schedule(self._reclaimed)
        while self._after and self._after[0][0] <= seq:
            self._schedule(self._after.popleft()[1])
        self.on_durable(seq)

    def after_durable(self, seq: int, fn: Callable[[], None]) -> None:
        """Run ``fn`` on a loop turn once record ``seq`` is durable (or its batch failed and
        a later one was written: the caller checks its tickets). ``seq`` must not be older
        than one asked for before."""
        if seq <= self.durable_seq:
            self._schedule(fn)
        else:
            self._after.append((seq, fn))

    def _oldest_nearly_free(self) -> bool:
        """Is the oldest segment kept by no more records than there are watchers (each holds
        one), while newer segments exist? Then one of them may be what keeps it."""
        live = self.journal.live_counts()
        return len(live) > 1 and live[0][1] <= len(self.reclaim_watchers)

    def _reclaimed(self) -> None:
        for watch in list(self.reclaim_watchers):
            watch()

    def _failed(self, first: int, last: int, exc: BaseException) -> None:
        log.error("journal could not store records %d..%d: %s", first, last, exc)
        self.on_failed(first, last, exc)

    def disk_estimate(self) -> int:
        """Journal bytes on disk, cheaply (asked on every SEND): live segments times their size,
        and the bodies whose write is deferred (``deferred.bytes``: they take room from their
        SEND, see ``core/persistence/storelater.py``)."""
        journal = self.journal
        return journal.segment_count() * journal.segment_bytes + self.deferred.bytes

    @property
    def idle(self) -> bool:
        """Nothing appended is still waiting for its fsync."""
        return self.durable_seq >= self.appended_seq and not self._acks
