"""Filling a column batch (``protocol/columns.py``) with the next retained messages of a range.

Why its own path: a per-message range read costs, per message, two ``pread`` calls, a JSON
decode of the stored headers, a ``Message`` object and an encoded frame. Here the slots of the
next messages are looked at first (their sizes are known without reading), neighbouring journal
records are read together (``Journal.read_many``), and each stored record goes into the batch
as it is stored: its header JSON and body are sliced out of the record, never decoded.
Messages still held as objects (in memory, not yet durable, redelivered) are encoded from the
object; non-persistent ones paged to the temp store are paged in as a normal read does.
"""

from __future__ import annotations

import heapq
import json
from array import array
from collections.abc import Callable, Iterator
from itertools import repeat
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from sluicemq.core.paging.spill import JOURNAL, OBJ, SpillFifo
from sluicemq.core.replay.seqindex import TailRef
from sluicemq.core.routing.message import Message
from sluicemq.core.selectors import Selector
from sluicemq.protocol.columns import PERSISTENT, REDELIVERED, ColumnWriter, SpanWriter
from sluicemq.storage import records
from sluicemq.storage.slotpack import Fields

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from sluicemq.core.replay.seqindex import Fetcher, SeqView

MAX_MESSAGES = 65_536  # a batch of tiny messages is cut here even below its byte target

Writer = ColumnWriter | SpanWriter
# A chosen message: an object, or a journal slot as (segment, offset, length, inner, priority).
Item = Message | tuple[int, int, int, int, int]


def fill(view: SeqView, fetcher: Fetcher, body_of: Callable[[Message], bytes | memoryview],
         start: int, to: int, *, max_bytes: int, max_messages: int,
         average_size: float = 1024.0, spans: bool = False,
         selector: Selector | None = None) -> tuple[Writer, int]:
    """The next retained messages of ``[start, to)`` (at least one if any, about ``max_bytes``
    of bodies at most, ``max_messages`` at most) as a batch, and the seq to continue from.
    ``body_of`` reads the body of a message object that keeps it only in the journal;
    ``average_size`` (the queue's) sizes how many slots are looked at for one batch;
    ``spans`` picks the spans layout (records sent as read) over the packed one; with a
    ``selector`` only the messages it matches go into the batch (their stored headers are
    decoded for it), and the batch may be empty while the seq to continue from moved on."""
    writer: Writer = SpanWriter() if spans else ColumnWriter()
    want = min(max_messages, MAX_MESSAGES, max(64, int(max_bytes / average_size * 1.25)))
    sources = view.sources(start, to, want)
    if not sources:
        return writer, start
    only = sources[0]
    if len(sources) == 1 and isinstance(only, tuple):
        n = _cut(only[3][6], max_bytes)
        if selector is None and _plain_run(writer, fetcher, only, n):
            return writer, writer.last_seq + 1
        seqs, items = _from_tail(fetcher, *only, n)
    else:
        seqs, items = _merged(fetcher, sources, max_bytes, max_messages)
    locs: dict[tuple[int, int, int], int] = {}
    for item in items:
        if isinstance(item, tuple):
            locs.setdefault(item[:3], len(locs))
    payloads = fetcher.store.journal.read_many(list(locs)) if locs else []
    add = writer.add
    for seq, item in zip(seqs, items, strict=True):
        if isinstance(item, Message):
            if selector is not None and not selector.matches(item.headers):
                continue
            body = item.body if item.body is not None else body_of(item)
            flags = (PERSISTENT if item.persistent else 0) | (
                REDELIVERED if item.deliveries else 0)
            add(seq, item.timestamp, item.expires, item.priority, flags,
                records.encode_headers(item.headers), body)
            continue
        payload: bytes | memoryview = payloads[locs[item[:3]]]
        if item[3]:
            payload = records.tx_op_at(payload, item[3])
        ts, expires, _prio, headers, body = records.message_columns(payload)
        if selector is not None and not selector.matches(json.loads(bytes(headers))):
            continue
        add(seq, ts, expires, item[4], PERSISTENT, headers, body)
    return writer, seqs[-1] + 1


def _cut(sizes: array, max_bytes: int) -> int:
    """How many leading messages fit in ``max_bytes`` of bodies (at least one)."""
    import numpy as np  # here, not at import: ~15 MiB of RSS a broker may not need

    ends = np.cumsum(_np(sizes), dtype=np.int64)
    return max(1, int(np.searchsorted(ends, max_bytes, side="right")))


def _np(column: array, n: int = -1) -> NDArray[Any]:
    """A slot column (``array``) as a numpy array over the same memory."""
    import numpy as np

    return np.frombuffer(column, f"u{column.itemsize}", n)


def _plain_run(writer: Writer, fetcher: Fetcher,
               source: tuple[int, SpillFifo, int, Fields], n: int) -> bool:
    """The common case of a backlog, done column-wise: paged-out slots of one run, each its
    own MSG record written to the journal. False (nothing done) when the run has anything
    else (objects, records inside transactions, records still on their way to the disk)."""
    from sluicemq.storage import runread  # numpy: imported by the first range read

    prio, _tail, _first, (mid, src, seg, off, length, inner, _size) = source
    journal = fetcher.store.journal
    if bool((_np(src, n) != JOURNAL).any()) or bool(_np(inner, n).any()):
        return False
    segs, offs = _np(seg, n), _np(off, n)
    unwritten = journal.unwritten_from()
    if unwritten is not None:
        useg, uoff = unwritten
        if bool(((segs > useg) | ((segs == useg) & (offs >= uoff))).any()):
            return False
    mids, lengths = _np(mid, n), _np(length, n)
    prios, flags = bytes([prio]) * n, bytes([PERSISTENT]) * n
    if isinstance(writer, SpanWriter):
        run = runread.message_spans(journal, mids, segs, offs, lengths, writer.data_size)
        writer.add_run(mids.tobytes(), run.timestamps.tobytes(), run.expires.tobytes(), prios,
                       flags, run.spans, run.pieces)
        return True
    cols = runread.message_columns(journal, mids, segs, offs, lengths)
    writer.extend_joined(mids.tobytes(), cols.timestamps.tobytes(), cols.expires.tobytes(),
                         prios, flags, cols.header_lengths.tolist(), cols.headers,
                         cols.body_lengths.tolist(), cols.bodies)
    return True


def _from_tail(fetcher: Fetcher, prio: int, tail: SpillFifo, first: int, cols: Fields,
               n: int) -> tuple[list[int], list[Item]]:
    """The first ``n`` slots of one run (the caller cut them by cumulative size) as items."""
    mid, src, seg, off, length, inner, _size = cols
    seqs = list(mid[:n])
    if src[:n].tobytes().count(JOURNAL) == n:
        return seqs, list(zip(seg[:n], off[:n], length[:n], inner[:n], repeat(prio, n),
                              strict=True))
    items: list[Item] = []
    for k in range(n):
        items.append(_slot_item(fetcher, prio, tail, first + k,
                                (mid[k], src[k], seg[k], off[k], length[k], inner[k])))
    return seqs, items


def _slot_item(fetcher: Fetcher, prio: int, tail: SpillFifo, index: int,
               slot: tuple[int, int, int, int, int, int]) -> Item:
    mid, src, seg, off, length, inner = slot
    if src == JOURNAL:
        return (seg, off, length, inner, prio)
    if src == OBJ:
        return tail.objs[mid]
    return fetcher.message(TailRef(prio, tail, index))  # paged to the temp store


def _merged(fetcher: Fetcher, sources: list[list[Message] | tuple[int, SpillFifo, int, Fields]],
            max_bytes: int, max_messages: int) -> tuple[list[int], list[Item]]:
    """Several sorted sources (in-memory messages, runs of several lanes): merged by seq."""
    def messages(msgs: list[Message]) -> Iterator[tuple[int, int, Item]]:
        for m in msgs:
            yield m.mid, m.size, m

    def slots(prio: int, tail: SpillFifo, first: int, cols: Fields
              ) -> Iterator[tuple[int, int, Item]]:
        mid, src, seg, off, length, inner, size = cols
        for k in range(len(mid)):
            yield mid[k], size[k], _slot_item(fetcher, prio, tail, first + k, (
                mid[k], src[k], seg[k], off[k], length[k], inner[k]))

    streams = [messages(s) if isinstance(s, list) else slots(*s) for s in sources]
    seqs: list[int] = []
    items: list[Item] = []
    total = 0
    for seq, size, item in heapq.merge(*streams, key=itemgetter(0)):
        if seqs and (total + size > max_bytes or len(seqs) >= max_messages):
            break
        seqs.append(seq)
        items.append(item)
        total += size
    return seqs, items
