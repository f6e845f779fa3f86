"""The stream wire format: header names, the values they carry, and how to parse them.

A stream is a run of ordinary persistent SEND frames (chunks) that share `sluice-stream-id`
(mirrored into `JMSXGroupID` so every broker keeps one stream on one consumer). Each chunk
says where it belongs (`seq`, `offset`); only the last one carries what the whole stream
must add up to (`size`, `sha256`), so a producer never needs to know the length up front.
Broker and clients both import these names, so the format has exactly one definition.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass

from sluicemq.protocol.numbers import MAX_DIGITS, natural, shown
from sluicemq.streaming.errors import StreamProtocolError

PREFIX = "sluice-stream-"

# On every chunk.
STREAM_ID = "sluice-stream-id"
GROUP_ID = "JMSXGroupID"
SEQ = "sluice-stream-seq"
OFFSET = "sluice-stream-offset"
NAME = "sluice-stream-name"
CONTENT_TYPE = "application/octet-stream"

# On the last chunk only.
FINAL = "sluice-stream-final"
SIZE = "sluice-stream-size"
SHA256 = "sluice-stream-sha256"

# Broker -> consumer, on redelivered chunks and stream-level errors.
RESUMED = "sluice-stream-resumed"
ABANDONED_MESSAGE = "stream abandoned"

# Broker -> producer, on receipts and errors of chunks.
DUPLICATE = "sluice-stream-duplicate"
NEXT_SEQ = "sluice-stream-next-seq"
NEXT_OFFSET = "sluice-stream-next-offset"
STATE = "sluice-stream-state"
CONSUMERS = "sluice-stream-consumers"
GAP_MESSAGE = "stream gap"

# Producer -> broker: the resume query (empty SEND, nothing is enqueued).
QUERY = "sluice-stream-query"
WAIT_CONSUMER = "sluice-stream-wait-consumer"

# Consumer -> broker, on SUBSCRIBE: streams at once, and streams in all (then no more).
MAX_STREAMS = "sluice-max-streams"
STREAM_CREDIT = "sluice-stream-credit"

# Advisory, set by `send_file`: lets a receiver show an ETA before the final chunk says the
# size. Not part of the integrity check and deliberately outside the `sluice-stream-` space.
FILE_SIZE = "sluice-file-size"

STATES = frozenset({"open", "complete", "unknown"})

_SHA_RE = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True, slots=True)
class ChunkInfo:
    """What one chunk's headers say about its place in its stream."""

    stream_id: str
    seq: int
    offset: int
    name: str
    final: bool = False
    size: int | None = None
    sha256: str | None = None
    resumed: bool = False

    def headers(self) -> dict[str, str]:
        """The stream headers of this chunk, as a producer puts them on the SEND."""
        out = {STREAM_ID: self.stream_id, GROUP_ID: self.stream_id, SEQ: str(self.seq),
               OFFSET: str(self.offset), NAME: self.name}
        if self.final:
            out[FINAL] = "true"
            out[SIZE] = str(self.size)
            out[SHA256] = str(self.sha256)
        return out


@dataclass(frozen=True, slots=True)
class ResumePoint:
    """The broker's answer to a resume query: where a producer must continue."""

    next_seq: int
    next_offset: int
    state: str
    consumers: int | None = None

    @property
    def complete(self) -> bool:
        return self.state == "complete"


def is_chunk(headers: Mapping[str, str]) -> bool:
    return STREAM_ID in headers


def parse_chunk(headers: Mapping[str, str]) -> ChunkInfo:
    """Read a chunk's stream headers; raise StreamProtocolError rather than guess."""
    stream_id = headers.get(STREAM_ID)
    if not stream_id:
        raise StreamProtocolError(f"not a stream chunk: no {STREAM_ID} header")
    seq = _natural(headers, SEQ)
    offset = _natural(headers, OFFSET)
    final = _flag(headers, FINAL)
    size = sha = None
    if final:
        size = _natural(headers, SIZE)
        sha = headers.get(SHA256, "").lower()
        if not _SHA_RE.fullmatch(sha):
            raise StreamProtocolError(f"final chunk of {stream_id} has a malformed {SHA256}")
        if size < offset:
            raise StreamProtocolError(f"final chunk of {stream_id} starts after the stream's end")
    return ChunkInfo(stream_id, seq, offset, headers.get(NAME, ""), final, size, sha,
                     _flag(headers, RESUMED))


def parse_resume(headers: Mapping[str, str]) -> ResumePoint:
    """Read the RECEIPT of a resume query; raise StreamProtocolError if it lacks the answer."""
    state = headers.get(STATE, "")
    if state not in STATES:
        raise StreamProtocolError(
            f"the broker did not answer the resume query ({STATE}={state!r}); "
            "does it support streams?")
    consumers = _natural(headers, CONSUMERS) if CONSUMERS in headers else None
    return ResumePoint(_natural(headers, NEXT_SEQ), _natural(headers, NEXT_OFFSET), state,
                       consumers)


def is_gap_error(headers: Mapping[str, str]) -> bool:
    return headers.get("message", "").startswith(GAP_MESSAGE)


def abandoned_stream(headers: Mapping[str, str]) -> str | None:
    """The id of the stream an ERROR declares abandoned, or None for any other ERROR."""
    if headers.get("message", "").startswith(ABANDONED_MESSAGE):
        return headers.get(STREAM_ID)
    return None


def check_user_headers(headers: Mapping[str, str] | None) -> dict[str, str]:
    """User headers ride on every chunk but may not impersonate the stream's own headers."""
    out = dict(headers or {})
    for key in out:
        if key.startswith(PREFIX) or key == GROUP_ID:
            raise ValueError(f"header {key!r} is reserved for the stream format")
    return out


def file_stream_id(path: str, size: int, mtime_ns: int, *, destination: str = "",
                   copy: int = 0) -> str:
    """A stream id that stays the same while the file, its destination and the copy number
    do, so a rerun resumes its stream; another destination or copy is another stream."""
    key = f"{path}\0{size}\0{mtime_ns}\0{destination}\0{copy}"
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()[:32]


def _natural(headers: Mapping[str, str], key: str) -> int:
    value = headers.get(key)
    number = natural(value)
    if number is None:
        raise StreamProtocolError(f"header {key} must be a non-negative integer of at most "
                                  f"{MAX_DIGITS} digits, got "
                                  f"{'nothing' if value is None else shown(value)}")
    return number


def _flag(headers: Mapping[str, str], key: str) -> bool:
    return headers.get(key, "false").lower() == "true"
