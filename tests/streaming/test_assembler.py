"""Spec of the consumer-side assembler: order, duplicates, gaps, resumed deliveries, hash."""

from __future__ import annotations

import hashlib
import os

import pytest

from sluicemq.streaming.assembler import Assembler, Verdict
from sluicemq.streaming.chunker import Chunk, Chunker
from sluicemq.streaming.errors import StreamGapError, StreamIntegrityError, StreamProtocolError
from sluicemq.streaming.manifest import ChunkInfo


def chunks_of(data: bytes, size: int = 4) -> list[Chunk]:
    c = Chunker("s", "f", size)
    return [*c.feed(data), c.finish()]


def resumed(chunk: Chunk) -> ChunkInfo:
    i = chunk.info
    return ChunkInfo(i.stream_id, i.seq, i.offset, i.name, i.final, i.size, i.sha256, True)


def test_in_order_chunks_are_delivered_and_verified() -> None:
    data = os.urandom(10)
    a = Assembler("s")
    verdicts = [a.accept(c.info, c.body) for c in chunks_of(data)]
    assert verdicts == [Verdict.DELIVER] * 3
    assert a.complete and a.verified
    assert (a.size, a.start_offset, a.next_seq) == (10, 0, 3)


def test_empty_stream_verifies() -> None:
    a = Assembler("s")
    (only,) = chunks_of(b"")
    assert a.accept(only.info, only.body) is Verdict.DELIVER
    assert a.complete and a.verified and a.size == 0


def test_redelivered_earlier_chunks_are_duplicates_and_not_hashed_twice() -> None:
    chunks = chunks_of(os.urandom(10))
    a = Assembler("s")
    a.accept(chunks[0].info, chunks[0].body)
    a.accept(chunks[1].info, chunks[1].body)
    assert a.accept(chunks[0].info, chunks[0].body) is Verdict.DUPLICATE
    assert a.accept(chunks[1].info, chunks[1].body) is Verdict.DUPLICATE
    assert a.accept(chunks[2].info, chunks[2].body) is Verdict.DELIVER
    assert a.verified
    assert a.accept(chunks[2].info, chunks[2].body) is Verdict.DUPLICATE  # even after the end


def test_a_skipped_chunk_is_a_gap() -> None:
    chunks = chunks_of(os.urandom(10))
    a = Assembler("s")
    a.accept(chunks[0].info, chunks[0].body)
    with pytest.raises(StreamGapError, match=r"expected chunk 1 .* got 2") as caught:
        a.accept(chunks[2].info, chunks[2].body)
    assert caught.value.next_seq == 1


def test_a_stream_starting_past_zero_without_the_resumed_mark_is_a_gap() -> None:
    chunks = chunks_of(os.urandom(10))
    with pytest.raises(StreamGapError, match="without sluice-stream-resumed"):
        Assembler("s").accept(chunks[1].info, chunks[1].body)


def test_an_offset_that_does_not_follow_is_a_gap() -> None:
    chunks = chunks_of(os.urandom(10))
    a = Assembler("s")
    a.accept(chunks[0].info, chunks[0].body)
    bad = ChunkInfo("s", 1, 5, "f")
    with pytest.raises(StreamGapError, match="offset 5"):
        a.accept(bad, b"xyz")
    with pytest.raises(StreamGapError):
        Assembler("s").accept(ChunkInfo("s", 0, 3, "f"), b"")


def test_wrong_hash_or_size_is_an_integrity_error() -> None:
    data = os.urandom(6)
    first, last = chunks_of(data)
    i = last.info
    a = Assembler("s")
    a.accept(first.info, first.body)
    with pytest.raises(StreamIntegrityError, match="corrupt"):
        a.accept(i, b"\x00" * len(last.body))
    b = Assembler("s")
    b.accept(first.info, first.body)
    with pytest.raises(StreamIntegrityError, match="declares 6 bytes"):
        b.accept(i, last.body + b"!")


def test_a_resumed_delivery_is_accepted_but_unverifiable_alone() -> None:
    data = os.urandom(10)
    chunks = chunks_of(data)
    a = Assembler("s")
    a.accept(resumed(chunks[1]), chunks[1].body)
    a.accept(chunks[2].info, chunks[2].body)
    assert a.start_offset == 4
    assert a.complete and a.size == 10
    assert not a.verifiable and not a.verified


def test_seeding_with_the_prefix_hash_makes_a_resumed_delivery_verifiable() -> None:
    data = os.urandom(10)
    chunks = chunks_of(data)
    a = Assembler("s")
    a.seed(hashlib.sha256(data[:4]), 4)
    a.accept(resumed(chunks[1]), chunks[1].body)
    a.accept(chunks[2].info, chunks[2].body)
    assert a.verified


def test_seeding_with_a_wrong_prefix_fails_the_check() -> None:
    data = os.urandom(10)
    chunks = chunks_of(data)
    a = Assembler("s")
    a.seed(hashlib.sha256(b"\xff" * 4), 4)
    a.accept(resumed(chunks[1]), chunks[1].body)
    with pytest.raises(StreamIntegrityError):
        a.accept(chunks[2].info, chunks[2].body)


def test_seed_must_match_the_resume_offset_and_come_first() -> None:
    chunks = chunks_of(os.urandom(10))
    a = Assembler("s")
    a.seed(hashlib.sha256(b"abc"), 3)
    with pytest.raises(ValueError, match="resumes at offset 4"):
        a.accept(resumed(chunks[1]), chunks[1].body)
    b = Assembler("s")
    b.accept(chunks[0].info, chunks[0].body)
    with pytest.raises(ValueError):
        b.seed(hashlib.sha256(), 0)


def test_chunks_of_another_stream_or_after_the_end_are_refused() -> None:
    (only,) = chunks_of(b"ab")
    a = Assembler("other")
    with pytest.raises(StreamProtocolError):
        a.accept(only.info, only.body)
    b = Assembler("s")
    b.accept(only.info, only.body)
    with pytest.raises(StreamProtocolError, match="after its final chunk"):
        b.accept(ChunkInfo("s", 1, 2, "f"), b"more")
