"""The consumer's half of a stream, sans-IO: decides whether each arriving chunk continues
the stream, repeats it, or proves something is missing, and checks the whole at the end.

The rule is to never pass on bytes that cannot be placed: a chunk must carry exactly the
next seq and offset. Earlier seqs are duplicates (redeliveries of chunks already handed
on) and are dropped; later ones are a gap and raise. A delivery may start past 0 only when
the broker marks it `sluice-stream-resumed` (the stream moved from a consumer that died).

The SHA-256 can only be checked when every byte passed through this object, or when the
caller `seed()`s it with a hash of the prefix it already holds (e.g. a partial file).
"""

from __future__ import annotations

import enum
import hashlib
from typing import Any

from sluicemq.streaming.errors import StreamGapError, StreamIntegrityError, StreamProtocolError
from sluicemq.streaming.manifest import RESUMED, ChunkInfo


class Verdict(enum.Enum):
    DELIVER = "deliver"  # hand the body on
    DUPLICATE = "duplicate"  # already handed on: drop it (and acknowledge it)


class Assembler:
    """Tracks one stream's delivery: position, running hash, and whether it is complete."""

    def __init__(self, stream_id: str) -> None:
        self.stream_id = stream_id
        self.start_offset: int | None = None  # where this delivery began
        self.next_seq = 0
        self.next_offset = 0
        self.size: int | None = None  # known once the final chunk arrived
        self.complete = False
        self.verified = False  # the SHA-256 was checked and matched
        self._sha: Any = hashlib.sha256()
        self._seeded: int | None = None

    @property
    def started(self) -> bool:
        return self.start_offset is not None

    @property
    def verifiable(self) -> bool:
        """Whether the final SHA-256 can be checked (we hashed, or were seeded, from byte 0)."""
        return self.start_offset == 0 or self._seeded == self.start_offset

    def seed(self, prefix_sha: Any, length: int) -> None:
        """Adopt a SHA-256 object that already hashed bytes [0, length) of this stream, so a
        resumed delivery starting at `length` can still be verified. Only before any chunk."""
        if self.started:
            raise ValueError("seed() must come before the first chunk")
        self._sha = prefix_sha.copy()
        self._seeded = length

    def accept(self, info: ChunkInfo, body: bytes) -> Verdict:
        """Place one chunk; raise StreamGapError, StreamIntegrityError or StreamProtocolError
        when it cannot be placed or the finished stream does not add up."""
        if info.stream_id != self.stream_id:
            raise StreamProtocolError(
                f"chunk of stream {info.stream_id} given to the reader of {self.stream_id}")
        if not self.started:
            self._begin(info)
        elif info.seq < self.next_seq:
            return Verdict.DUPLICATE
        elif self.complete:
            raise StreamProtocolError(
                f"stream {self.stream_id} has seq {info.seq} after its final chunk")
        elif info.seq > self.next_seq:
            raise StreamGapError(
                f"stream {self.stream_id}: expected chunk {self.next_seq} (offset "
                f"{self.next_offset}), got {info.seq}; chunks {self.next_seq}..{info.seq - 1} "
                "are missing", next_seq=self.next_seq)
        if info.offset != self.next_offset:
            raise StreamGapError(
                f"stream {self.stream_id}: chunk {info.seq} claims offset {info.offset}, "
                f"but the bytes so far end at {self.next_offset}", next_seq=self.next_seq)
        self._sha.update(body)
        self.next_seq += 1
        self.next_offset += len(body)
        if info.final:
            self._finish(info)
        return Verdict.DELIVER

    def _begin(self, info: ChunkInfo) -> None:
        if info.seq != 0 and not info.resumed:
            raise StreamGapError(
                f"stream {self.stream_id} starts at chunk {info.seq} (offset {info.offset}) "
                f"without {RESUMED}: chunks 0..{info.seq - 1} are missing", next_seq=0)
        if info.seq == 0 and info.offset != 0:
            raise StreamGapError(
                f"stream {self.stream_id}: chunk 0 claims offset {info.offset}", next_seq=0)
        if self._seeded is not None and self._seeded != info.offset:
            raise ValueError(f"seeded with {self._seeded} bytes but the delivery of "
                             f"{self.stream_id} resumes at offset {info.offset}")
        self.start_offset = info.offset
        self.next_seq = info.seq
        self.next_offset = info.offset

    def _finish(self, info: ChunkInfo) -> None:
        self.complete = True
        self.size = info.size
        if info.size != self.next_offset:
            raise StreamIntegrityError(
                f"stream {self.stream_id} declares {info.size} bytes but its chunks add up "
                f"to {self.next_offset}")
        if self.verifiable:
            actual = self._sha.hexdigest()
            if actual != info.sha256:
                raise StreamIntegrityError(
                    f"stream {self.stream_id} ({info.name or 'unnamed'}) is corrupt: SHA-256 "
                    f"is {actual}, the producer declared {info.sha256}")
            self.verified = True
