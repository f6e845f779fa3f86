"""The pager: moves messages between a cursor's memory and their stored records.

Paged-out messages are slots in a ``SpillFifo`` (``spill.py``); this module decides when a
message may become a slot (its record is durable, or it was written to the temp store) and
rebuilds the full ``Message`` from its record when a consumer needs it.
"""

from __future__ import annotations

import contextlib
import logging
from collections import deque
from typing import TYPE_CHECKING, Protocol

from sluicemq.core.paging.spill import JOURNAL, OBJ, TEMP, Slot, SpillFifo
from sluicemq.core.routing import keys
from sluicemq.core.routing.message import Message
from sluicemq.errors import StorageError
from sluicemq.storage import records
from sluicemq.storage.segment import Location
from sluicemq.storage.store import RecoveredTicket

if TYPE_CHECKING:
    from sluicemq.storage.store import Store
    from sluicemq.storage.tempstore import TempStore

log = logging.getLogger("sluicemq.cursor")
_LastTemp = tuple[tuple[object, ...], dict[str, str], tuple[int, int, int]]
SHARE_READ_MOST = 1 << 20  # a temp record read back is kept for the next reader up to this


class Settles(Protocol):
    """Told when objects it paged out became journal slots (their records reached the disk)."""

    def settled(self, msgs: list[Message]) -> None:
        """``msgs`` are stored now, no longer in memory."""


class _Unsettled:
    """Objects paged out to one FIFO at consecutive positions from ``pos`` before their
    records were durable; ``top_seq`` is the highest of their records' seqs (they mostly
    ascend; a held stream chunk may come late). Kept as a run from the start, not one entry
    a message: settling it is then a slice."""

    def __init__(self, fifo: SpillFifo, pos: int, sink: Settles | None, msg: Message,
                 seq: int) -> None:
        self.fifo = fifo
        self.pos = pos
        self.sink = sink
        self.msgs = [msg]
        self.top_seq = seq


class Pager:
    """Moves messages between memory and their stored records, for every cursor of a broker.

    ``store`` is the journal side (persistent messages are paged by reference: their record
    already exists); ``temp`` receives non-persistent messages (None: they stay objects).
    """

    def __init__(self, store: Store, temp: TempStore | None, spill_bytes: int) -> None:
        self.store = store
        self.temp = temp
        self.spill_bytes = spill_bytes
        self._cache: tuple[Location, bytes] | None = None  # last transaction record read
        # objects paged out before their record was durable, in runs, in the order of seqs
        self._unsettled: deque[_Unsettled] = deque()
        self._last_run: _Unsettled | None = None  # the newest run, while it may grow
        self.paged_in = 0
        self.paged_out = 0
        # the temp record written last: what it holds and where (_shared_temp)
        self._last_temp: _LastTemp | None = None
        # the temp record read last, decoded: ((file, offset), record) (_temp_record)
        self._last_read: tuple[tuple[int, int], records.StoredMessage] | None = None

    def page_out(self, fifo: SpillFifo, msg: Message, settled: Settles | None = None) -> bool:
        """Append ``msg`` to ``fifo``: as a compact slot when its record is safe to point at.
        False when it stays an object (its memory is still held); ``settled`` is told when
        such an object becomes a slot after all (its record reached the disk)."""
        ticket = msg.ticket
        if msg.deliveries == 0 and msg.persistent and ticket is not None and msg.inner >= 0:
            loc = ticket.loc
            if loc is not None and ticket.seq <= self.store.durable_seq:
                fifo.append(msg.mid, JOURNAL, loc.segment, loc.offset, loc.length, msg.inner,
                            msg.size)
                self.paged_out += 1
                return True
            if loc is not None:
                pos = fifo.append_obj(msg)
                run = self._last_run
                if (run is not None and run.fifo is fifo and run.sink is settled
                        and run.pos + len(run.msgs) == pos):
                    run.msgs.append(msg)
                    if ticket.seq > run.top_seq:
                        run.top_seq = ticket.seq
                else:
                    run = self._last_run = _Unsettled(fifo, pos, settled, msg, ticket.seq)
                    self._unsettled.append(run)
                return False
        elif (msg.deliveries == 0 and not msg.persistent and self.temp is not None
              and msg.body is not None):
            where = self._shared_temp(msg)
            if where is None:
                payload = records.encode_message(msg.destination, msg.mid, msg.timestamp,
                                                 msg.expires, msg.priority, msg.headers, msg.body)
                where = self.temp.append(payload)
                self._last_temp = (_identity(msg), msg.headers, where)
            f, off, length = where
            fifo.append(msg.mid, TEMP, f, off, length, 0, msg.size)
            self.paged_out += 1
            return True
        fifo.append_obj(msg)
        return False

    def _shared_temp(self, msg: Message) -> tuple[int, int, int] | None:
        """The temp record last written, when ``msg`` is a copy of the same message (a topic
        publication reaching another subscription): its slot points at that record too.

        Why: each subscriber that stopped reading had its own record of every message, so
        one 16 KiB SEND to 200 of them wrote 3.2 MB to temp files - ~half the broker's time,
        and the page cache's writeback throttling stalled the event loop (probe p99 ~100 ms).
        """
        last = self._last_temp
        if last is None:
            return None
        identity, headers, where = last
        if identity != _identity(msg) or headers != msg.headers:
            return None
        if self.temp is None or not self.temp.share(where[0]):
            return None
        return where

    def _temp_record(self, file: int, offset: int, length: int) -> records.StoredMessage:
        """The temp record at ``offset`` of ``file``, decoded; read again only when it is not
        the one read last.

        Why: a topic message paged out for many subscriptions is one shared record
        (``_shared_temp``), and a dispatch pass reads it back for each of them in turn. Each
        read made its own copy of the body, and the transports of subscribers that stopped
        reading then held one copy each: 200 of them, ~64 MiB of 16 KiB bodies beyond what
        their frames' heads need. Read once, the body is one object every copy refers to
        (``SessionContext.deliver`` writes it uncopied on TCP). Only a record up to
        ``SHARE_READ_MOST`` is kept, so the one held between reads stays small.
        """
        last = self._last_read
        if last is not None and last[0] == (file, offset):
            return last[1]
        assert self.temp is not None
        sm = records.decode_message(self.temp.read(file, offset, length))
        self._last_read = ((file, offset), sm) if length <= SHARE_READ_MOST else None
        return sm

    def settle(self, durable_seq: int) -> None:
        """Journal records up to ``durable_seq`` are on disk: their waiting objects go compact,
        a run at a time (``SpillFifo.settle_run``)."""
        q = self._unsettled
        while q:
            run = q[0]
            msgs = run.msgs
            if run.top_seq <= durable_seq:
                q.popleft()
                if run is self._last_run:
                    self._last_run = None
                pos = run.pos
            else:  # not all of the run is durable: its front part up to the first that is not
                n = 0
                while msgs[n].ticket.seq <= durable_seq:
                    n += 1
                if n == 0:
                    return
                pos = run.pos
                run.msgs = msgs[n:]
                run.pos = pos + n
                msgs = msgs[:n]
            done = self._settle_run(run.fifo, pos, msgs)
            self.paged_out += len(done)
            if run.sink is not None and done:
                run.sink.settled(done)

    def _settle_run(self, fifo: SpillFifo, pos: int, run: list[Message]) -> list[Message]:
        """Settle ``run`` (paged out at consecutive positions from ``pos``): the messages that
        became journal slots. One by one when the run is not intact (a message whose batch
        failed stays an object, one that left the cursor is skipped, a removal moved the
        slots behind it)."""
        segs: list[int] = []
        offs: list[int] = []
        lengths: list[int] = []
        for msg in run:
            loc = msg.ticket.loc
            if loc is None:
                break
            seg, off, length = loc
            segs.append(seg)
            offs.append(off)
            lengths.append(length)
        if len(segs) == len(run) and fifo.settle_run(pos, run, segs, offs, lengths):
            return run
        done = []
        for n, msg in enumerate(run):
            loc = msg.ticket.loc
            if loc is None or fifo.objs.get(msg.mid) is not msg:
                continue  # its batch failed (it stays an object), or it left the cursor
            if fifo.settle_obj(msg.mid, pos + n, JOURNAL, loc.segment, loc.offset, loc.length,
                               msg.inner):
                done.append(msg)
        return done

    def prefetch(self, fifo: SpillFifo, count: int) -> list[bytes | memoryview | None]:
        """The records of ``fifo``'s first ``count`` slots that are whole journal records,
        read together (None for the others, and for all when one of them fails its checks:
        ``page_in`` then reads each alone and names the bad one).

        Why: ``Journal.read`` costs five system calls a record (a dup of the segment's fd,
        two reads, a close, under a lock); ``read_many`` reads a span of neighbours with one,
        and a backlog drained in order is one span after another."""
        out: list[bytes | memoryview | None] = [None] * count
        first = fifo.indexes().start
        _mid, src, seg, off, length, inner, _size = fifo.columns(first, first + count)
        plain = [k for k in range(count) if src[k] == JOURNAL and not inner[k]]
        if len(plain) < 2:
            return out
        try:
            payloads = self.store.read_many([(seg[k], off[k], length[k]) for k in plain])
        except StorageError:
            return out
        for k, payload in zip(plain, payloads, strict=True):
            out[k] = payload
        return out

    def page_in(self, fifo: SpillFifo, slot: Slot, destination: str, priority: int,
                *, consume: bool = True, payload: bytes | memoryview | None = None) -> Message:
        """The full message for a slot; ``consume`` frees its temp record (it leaves the cursor).
        ``payload``: its journal record, when ``prefetch`` read it already."""
        mid, src, seg, off, length, inner, size = slot
        if src == OBJ:
            return fifo.objs.pop(mid) if consume else fifo.objs[mid]
        self.paged_in += 1
        if src == TEMP:
            assert self.temp is not None
            sm = self._temp_record(seg, off, length)
            if consume:
                self.temp.release(seg)
            if _is_pattern(destination):  # a wildcard subscription: each its own topic
                destination = sm.key or destination
            msg = Message(mid, destination, dict(sm.headers), sm.body, persistent=False,
                          priority=sm.priority, expires=sm.expires, timestamp=sm.timestamp)
            return msg
        loc = Location(seg, off, length)
        if inner:
            cached = self._cache
            if cached is None or cached[0] != loc:
                cached = (loc, self.store.read(loc))
                self._cache = cached
            payload = records.tx_op_at(cached[1], inner)
        elif payload is None:
            payload = self.store.read(loc)
        sm = records.decode_message(payload)
        if _is_pattern(destination):  # a wildcard durable subscription: each its own topic
            destination = keys.destination_of(sm.key) if keys.is_topic(sm.key) else destination
        body: bytes | None = sm.body if size < self.spill_bytes else None
        msg = Message(mid, destination, sm.headers, body, persistent=True, priority=priority,
                      expires=sm.expires, timestamp=sm.timestamp)
        msg.size = size
        msg.ticket = RecoveredTicket(loc)
        msg.inner = inner
        msg.owner = sm.owner
        return msg

    def stub(self, fifo: SpillFifo, slot: Slot, destination: str) -> Message:
        """Just enough of a message to journal its removal (purge): no disk read."""
        mid, src, seg, off, length, inner, size = slot
        if src == OBJ:
            return fifo.objs.pop(mid)
        if src == TEMP:
            assert self.temp is not None
            self.temp.release(seg)
            return Message(mid, destination, {}, None, persistent=False)
        msg = Message(mid, destination, {}, None, persistent=True)
        msg.size = size
        msg.ticket = RecoveredTicket(Location(seg, off, length))
        msg.inner = inner
        return msg

    def discard(self, fifo: SpillFifo, destination: str) -> tuple[list[Message], list[Message]]:
        """Empty ``fifo`` without reading anything back or making a stub of a temp slot: its
        temp records are released file by file. Returns (the messages of its object slots,
        stubs of its journal slots - their records are still to be let go)."""
        import numpy as np  # here, not at import: ~15 MiB of RSS a broker may not need

        first, end = fifo.indexes().start, fifo.end
        mid, src, seg, off, length, inner, size = fifo.columns(first, end)
        srcs = np.frombuffer(src, dtype=np.uint8)
        if self.temp is not None:
            files, counts = np.unique(np.frombuffer(seg, dtype=np.uint32)[srcs == TEMP],
                                      return_counts=True)
            for file, n in zip(files.tolist(), counts.tolist(), strict=True):
                self.temp.release(file, n)
        stubs = []
        for j in np.flatnonzero(srcs == JOURNAL).tolist():
            msg = Message(mid[j], destination, {}, None, persistent=True)
            msg.size = size[j]
            msg.ticket = RecoveredTicket(Location(seg[j], off[j], length[j]))
            msg.inner = inner[j]
            stubs.append(msg)
        del srcs  # the column's buffer is exported while the view lives
        objs = list(fifo.objs.values())
        fifo.clear()
        return objs, stubs

    def unreadable(self, slot: Slot, destination: str, exc: StorageError) -> None:
        """A journal slot whose record fails its checks when read back (damage the start-up
        did not scan: before an index snapshot's anchor, or rot since): the message is lost,
        as a full scan would have lost it, and its record let go; the queue carries on."""
        mid, _src, seg, off, length, _inner, _size = slot
        log.warning("journal: dropped unreadable message %d of %s at segment %d offset %d (%s)",
                    mid, destination, seg, off, exc)
        journal = self.store.journal
        with contextlib.suppress(StorageError):
            journal.release(Location(seg, off, length))
            journal.reclaim()

    def drop(self, fifo: SpillFifo, slot: Slot) -> None:
        """Forget a slot for good (a temp record is freed)."""
        if slot[1] == OBJ:
            fifo.objs.pop(slot[0], None)
        elif slot[1] == TEMP and self.temp is not None:
            self.temp.release(slot[2])



def _is_pattern(destination: str) -> bool:
    """A wildcard subscription's queue (concrete names never hold ``*`` or ``>``)."""
    return "*" in destination or ">" in destination


def _identity(msg: Message) -> tuple[object, ...]:
    """What a temp record holds besides headers; the body by identity (copies of one
    publication share it), so no body is kept alive for the comparison."""
    assert msg.body is not None
    return (msg.mid, msg.destination, msg.priority, msg.expires, msg.timestamp, id(msg.body),
            len(msg.body))
