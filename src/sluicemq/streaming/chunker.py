"""The producer's half of a stream, sans-IO: bytes in, numbered chunks out, hash at the end.

One full chunk is always held back until more input proves it is not the last: that way
a stream whose size is an exact multiple of the chunk size ends with a full final chunk,
not an extra empty one, and only a 0-byte stream ever sends an empty body.

Resuming skips the prefix the broker already stored: it is still hashed (the SHA-256 covers
the whole stream) but not emitted, and numbering continues where the broker left off.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from sluicemq.streaming.manifest import ChunkInfo


@dataclass(frozen=True, slots=True)
class Chunk:
    """One SEND's worth of a stream: its stream headers and body."""

    info: ChunkInfo
    body: bytes


class Chunker:
    """Cuts a byte stream into chunks of `chunk_size` bytes (the last one may be shorter)."""

    def __init__(self, stream_id: str, name: str, chunk_size: int, *, skip: int = 0,
                 first_seq: int = 0) -> None:
        if chunk_size < 1:
            raise ValueError("chunk_size must be at least 1 byte")
        if skip < 0 or first_seq < 0:
            raise ValueError("a resume point cannot be negative")
        self.stream_id = stream_id
        self.name = name
        self.chunk_size = chunk_size
        self.next_seq = first_seq
        self.next_offset = skip  # stream offset of the first byte in the buffer
        self.bytes_in = 0
        self.finished = False
        self._skip = skip
        self._sha = hashlib.sha256()
        self._buf = bytearray()

    def feed(self, data: bytes | bytearray | memoryview) -> list[Chunk]:
        """Take input; return the chunks it completed (all non-final)."""
        if self.finished:
            raise ValueError("feed() after finish()")
        view = memoryview(data).cast("B")
        self._sha.update(view)
        self.bytes_in += len(view)
        if self._skip:
            skipped = min(self._skip, len(view))
            self._skip -= skipped
            view = view[skipped:]
        self._buf += view
        chunks = []
        while len(self._buf) > self.chunk_size:
            chunks.append(self._cut(self.chunk_size, final=False))
        return chunks

    def finish(self) -> Chunk:
        """The final chunk: what is left (possibly nothing), with total size and SHA-256."""
        if self.finished:
            raise ValueError("finish() called twice")
        if self._skip:
            raise ValueError(f"input ended {self._skip} bytes before the point the broker "
                             "already stored; resume needs the same input as the first run")
        self.finished = True
        return self._cut(len(self._buf), final=True)

    @property
    def sha256(self) -> str:
        """Hex digest of all input so far (the stream's hash once finished)."""
        return self._sha.hexdigest()

    def _cut(self, length: int, *, final: bool) -> Chunk:
        with memoryview(self._buf) as view:
            body = view[:length].tobytes()  # one copy; a bytearray slice would make two
        del self._buf[:length]
        size = self.next_offset + length if final else None
        info = ChunkInfo(self.stream_id, self.next_seq, self.next_offset, self.name, final,
                         size, self.sha256 if final else None)
        self.next_seq += 1
        self.next_offset += length
        return Chunk(info, body)
