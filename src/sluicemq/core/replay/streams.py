"""Streams mode of range reads: whole large streams instead of messages.

A stream belongs to the range that holds the seq of its *final* chunk; it is *whole* when
every chunk 0..final is retained. Finding them means knowing, for each retained message,
whether it is a chunk and of what: in-memory messages say so in their headers, paged-out ones
are classified by peeking at their record's headers (no body read, see ``Store.peek_headers``)
and the answer is remembered, so a queue of many 1 MiB chunks costs one small read per chunk
once, not a read of every chunk on every head query.

``StreamPlanner`` is the sans-IO part: fed (seq, headers) of the retained messages in seq order,
it yields the whole streams whose final chunk is below a bound.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from sluicemq.core.streams.chunks import FINAL, SEQ, STREAM_ID

Facts = tuple[str, int, bool] | None  # (stream id, chunk number, final) or not a chunk
FACTS_LIMIT = 200_000


@dataclass(slots=True)
class WholeStream:
    """A stream with every chunk retained: its id, final chunk seq and chunk seqs in order."""

    id: str
    final: int
    chunks: list[int] = field(default_factory=list)


def facts_of(headers: dict[str, str]) -> Facts:
    sid = headers.get(STREAM_ID)
    if sid is None:
        return None
    try:
        number = int(headers.get(SEQ, ""))
    except ValueError:
        return None
    return sid, number, headers.get(FINAL) == "true"


class ChunkFacts:
    """Remembered classification of paged-out messages, by seq (bounded; ids never repeat)."""

    def __init__(self, limit: int = FACTS_LIMIT) -> None:
        self.limit = limit
        self._known: dict[int, Facts] = {}

    def get(self, seq: int) -> Facts | Literal[False]:
        """The facts, or False when not known yet."""
        return self._known.get(seq, False)

    def remember(self, seq: int, facts: Facts) -> None:
        if len(self._known) >= self.limit:
            for old in list(self._known)[: self.limit // 2]:
                del self._known[old]
        self._known[seq] = facts


class StreamPlanner:
    """Collects chunks by stream while retained messages are fed in seq order."""

    def __init__(self, below: int) -> None:
        self.below = below
        self._chunks: dict[str, dict[int, int]] = {}  # stream id -> chunk number -> lowest seq
        self._finals: list[tuple[int, str, int]] = []  # (seq, stream id, chunk number)

    def feed(self, seq: int, facts: Facts) -> None:
        if facts is None or seq >= self.below:
            return
        sid, number, final = facts
        numbers = self._chunks.setdefault(sid, {})
        numbers.setdefault(number, seq)
        if final:
            self._finals.append((seq, sid, number))

    def result(self) -> list[WholeStream]:
        """Whole streams in order of their final chunk's seq."""
        out: list[WholeStream] = []
        for seq, sid, last in sorted(self._finals):
            numbers = self._chunks.get(sid, {})
            if len(numbers) != last + 1 or any(n not in numbers for n in range(last + 1)):
                continue  # a chunk was consumed, or the final is not the last one stored
            if numbers[last] != seq:
                continue  # a duplicate final under another seq; the first one counts
            out.append(WholeStream(sid, seq, [numbers[n] for n in range(last + 1)]))
        return out


def select(streams: list[WholeStream], start: int, to: int,
           limit: int | None) -> tuple[list[WholeStream], int]:
    """The streams with final seq in ``[start, to)`` (at most ``limit``) and the seq-end."""
    chosen = [s for s in streams if start <= s.final < to]
    if limit is not None and len(chosen) > limit:
        chosen = chosen[:limit]
        return chosen, chosen[-1].final + 1
    return chosen, to


def stream_cuts(streams: list[WholeStream], slices: int) -> list[int]:
    """Seqs cutting the streams (by final seq) into up to ``slices`` slices of equal count."""
    n = len(streams)
    k = min(slices, n)
    return [streams[i * n // k].final for i in range(1, k)]
