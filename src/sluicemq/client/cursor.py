"""A reader's position in one delivered stream, sans-IO; shared by both clients' readers.

It knows which chunk's bytes are being handed out and which delivered chunks are due an ACK
(handed on), are held back until a clean close (the final chunk) or must be NACKed if the
reader gives up; the front ends only fetch chunks and send the ACK/NACK frames it names.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from sluicemq.errors import ClientError
from sluicemq.streaming.assembler import Assembler, Verdict
from sluicemq.streaming.manifest import ChunkInfo

M = TypeVar("M")


class ChunkCursor(Generic[M]):
    """Hands out the bytes of one stream's chunks, in order, checked by an `Assembler`."""

    def __init__(self, info: ChunkInfo, first: M) -> None:
        self.assembler = Assembler(info.stream_id)
        self._next: tuple[ChunkInfo, M] | None = (info, first)
        self._view = memoryview(b"")
        self._current: M | None = None  # chunk whose bytes are being handed out
        self._handed: list[M] = []  # fully handed out: ACK when the caller asks for more
        self._final: M | None = None  # ACKed on a clean close only
        self._rejected: list[M] = []  # failed a check: NACKed on close

    @property
    def exhausted(self) -> bool:
        """Every byte of the stream was handed out."""
        return self.assembler.complete and not self._view

    def needs_chunk(self) -> bool:
        return not self._view and not self.assembler.complete

    def take_first(self) -> tuple[ChunkInfo, M] | None:
        """The chunk that opened this delivery, until it has been placed."""
        first, self._next = self._next, None
        return first

    def place(self, info: ChunkInfo, message: M) -> M | None:
        """Accept the next delivered chunk; returns it if it is a duplicate to ACK at once.
        Raises the assembler's errors (gap, integrity) after noting the chunk for a NACK."""
        try:
            verdict = self.assembler.accept(info, self._body(message))
        except ClientError:
            self._rejected.append(message)
            raise
        if verdict is Verdict.DUPLICATE:
            return message
        body = self._body(message)
        if info.final:
            self._final = message
        elif body:
            self._current = message
        else:
            self._handed.append(message)
        self._view = memoryview(body)
        return None

    def hand_out(self, size: int) -> bytes:
        data = bytes(self._view[:size])
        self._view = self._view[len(data):]
        if not self._view and self._current is not None:
            self._handed.append(self._current)
            self._current = None
        return data

    def due_acks(self) -> list[M]:
        """Chunks the caller has consumed since the last call (it came back for more)."""
        handed, self._handed = self._handed, []
        return handed

    def settle(self, *, clean: bool) -> tuple[list[M], list[M]]:
        """The reader is closing (call once): (chunks to ACK, chunks to NACK)."""
        acks = self.due_acks() if clean else []
        if clean and self.exhausted and self._final is not None:
            return [*acks, self._final], []
        pending = [*self._handed, self._current, self._final, *self._rejected,
                   self._next[1] if self._next else None]
        return acks, [m for m in pending if m is not None]

    @staticmethod
    def _body(message: Any) -> bytes:
        return message.body


class StreamFacts:
    """What both stream readers (blocking and asyncio) tell about the stream they deliver."""

    _cursor: ChunkCursor[Any]

    @property
    def size(self) -> int | None:
        """Total bytes, known once the final chunk arrived."""
        return self._cursor.assembler.size

    @property
    def complete(self) -> bool:
        """All bytes were read (and verified, when verifiable)."""
        return self._cursor.exhausted

    @property
    def verified(self) -> bool:
        return self._cursor.assembler.verified

    def seed(self, prefix_sha: Any, length: int) -> None:
        """Supply a SHA-256 of bytes [0, `length`) so a resumed delivery is verified too."""
        self._cursor.assembler.seed(prefix_sha, length)
