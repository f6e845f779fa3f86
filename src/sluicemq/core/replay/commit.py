"""Commit-upto: remove retained messages of a queue as if consumed and acknowledged.

Everything goes through ``Queue.acknowledge``, the path an ACK takes: counters, the batched
ACK journal record, and the release of journal space once that record is durable. What a
consumer holds unacknowledged is taken from it (its later ACK is then ignored, see
``Committed``); a stream whose final chunk is removed is closed for whoever had it, so its
consumer may take the next stream and the broker stops pinning the stream's journal tail.

Removal is paced: ``step`` takes at most ``limit`` messages, so that a commit of a million
messages neither blocks the event loop nor builds a million stub objects at once.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from sluicemq.core.replay.streams import ChunkFacts, facts_of
from sluicemq.core.routing import keys
from sluicemq.core.routing.message import Message
from sluicemq.core.streams.chunks import is_final

if TYPE_CHECKING:
    from sluicemq.core.routing.broker import Broker
    from sluicemq.core.routing.queue import Queue

MAX_INTERVALS = 64


class Committed:
    """Per queue, the seq intervals recently committed: an ACK for a message the broker took
    away from its consumer is ignored rather than refused."""

    def __init__(self) -> None:
        self._intervals: dict[str, list[tuple[int, int]]] = {}

    def add(self, key: str, lo: int, hi: int) -> None:
        spans = self._intervals.setdefault(key, [])
        merged = [(lo, hi)]
        for a, b in spans:
            if b < merged[0][0] or a > merged[0][1]:
                merged.append((a, b))
            else:
                merged[0] = (min(a, merged[0][0]), max(b, merged[0][1]))
        merged.sort()
        self._intervals[key] = merged[-MAX_INTERVALS:]

    def covers(self, key: str, seq: int) -> bool:
        return any(a <= seq < b for a, b in self._intervals.get(key, ()))


class Removal:
    """One commit's removal from one queue: ``[lo, hi)``, or only the seqs in ``only``."""

    def __init__(self, broker: Broker, queue: Queue, lo: int, hi: int,
                 only: set[int] | None, facts: ChunkFacts) -> None:
        self.broker = broker
        self.queue = queue
        self.lo, self.hi = lo, hi
        self.only = only
        self.facts = facts
        self.removed = 0
        self._finals: set[str] = set()
        self._streams_here = self._has_streams()
        self._took_held = False

    def _wanted(self, seq: int) -> bool:
        return self.lo <= seq < self.hi and (self.only is None or seq in self.only)

    def step(self, limit: int) -> bool:
        """Remove up to ``limit`` more; True once nothing in the range is left."""
        q = self.queue
        if not self._took_held:
            self._took_held = True
            self._take_held_and_unacked()
        if self.only is None and not self._streams_here:
            taken, run = q.pending.remove_run(self.lo, self.hi, limit)
            self._settle(taken)
            mids, _src, segs, offs = run[:4]
            self.removed += len(mids)
            q.acknowledge_run(mids, segs, offs)
            done = len(taken) + len(mids) < limit
        else:
            taken = q.pending.remove_seqs(self.lo, self.hi, limit, self.only)
            self._settle(taken)
            done = len(taken) < limit
        if done:
            self._close_streams()
            return True
        return False

    def _take_held_and_unacked(self) -> None:
        """What consumers hold and what waits for its stream's final chunk: small, in memory."""
        q = self.queue
        for c in list(q.consumers):
            mine = [m for mid, m in c.inflight.items() if self._wanted(mid)]
            for m in mine:
                del c.inflight[m.mid]
            for sid, msgs in list(c.stream_acked.items()):
                kept = [m for m in msgs if not self._wanted(m.mid)]
                mine += [m for m in msgs if self._wanted(m.mid)]
                if kept:
                    c.stream_acked[sid] = kept
                else:
                    del c.stream_acked[sid]
            self._settle(mine)
        for st in self.broker.streams.values():
            held = st.held
            if any(hq is q and self._wanted(m.mid) for hq, m in held):
                ours = [m for hq, m in held if hq is q and self._wanted(m.mid)]
                st.held = [(hq, m) for hq, m in held
                           if not (hq is q and self._wanted(m.mid))]
                self._settle(ours)

    def _settle(self, msgs: list[Message]) -> None:
        if not msgs:
            return
        self.removed += len(msgs)
        self.queue.acknowledge(msgs)
        if self._streams_here:
            self._finals.update(self._final_streams(msgs))

    def _has_streams(self) -> bool:
        """Does any open stream live on this queue's destination (else skip classifying)?"""
        stream_key = keys.destination_key(self.queue.destination)  # d:... -> its t: key
        return any(st.queue_key == stream_key for st in self.broker.streams.values())

    def _final_streams(self, msgs: Iterable[Message]) -> Iterable[str]:
        for m in msgs:
            if m.headers:
                if is_final(m) and m.group is not None:
                    yield m.group
                continue
            facts = self.facts.get(m.mid)
            if facts is False and m.ticket is not None and m.ticket.loc is not None:
                facts = facts_of(self.broker.store.peek_headers(m.ticket.loc, max(0, m.inner)))
            if isinstance(facts, tuple) and facts[2]:
                yield facts[0]

    def _close_streams(self) -> None:
        """Streams whose final chunk was removed are finished for whoever had them."""
        q = self.queue
        for sid in self._finals:
            owner = q.groups.get(sid)
            if owner is not None:
                q.close_stream(owner, sid)
            else:
                self.broker.stream_finished(q, sid)
        self._finals.clear()
