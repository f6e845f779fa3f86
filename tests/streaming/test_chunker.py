"""Spec of the producer-side chunker: boundaries, numbering, final chunk, hash, resume."""

from __future__ import annotations

import hashlib
import os

import pytest

from sluicemq.streaming.chunker import Chunk, Chunker

SIZE = 8


def chunk_all(data: bytes, *, step: int = 3, chunk_size: int = SIZE, **kw: int) -> list[Chunk]:
    """Feed `data` in `step`-byte writes, then finish: every chunk, in order."""
    c = Chunker("s1", "f.bin", chunk_size, **kw)
    out: list[Chunk] = []
    for i in range(0, len(data), step):
        out += c.feed(data[i:i + step])
    out.append(c.finish())
    return out


@pytest.mark.parametrize(("length", "bodies"), [
    (0, [0]),
    (1, [1]),
    (SIZE - 1, [SIZE - 1]),
    (SIZE, [SIZE]),
    (SIZE + 1, [SIZE, 1]),
    (2 * SIZE, [SIZE, SIZE]),
    (3 * SIZE - 1, [SIZE, SIZE, SIZE - 1]),
])
def test_chunk_boundaries(length: int, bodies: list[int]) -> None:
    data = os.urandom(length)
    chunks = chunk_all(data)
    assert [len(c.body) for c in chunks] == bodies
    assert b"".join(c.body for c in chunks) == data


@pytest.mark.parametrize("step", [1, 5, SIZE, SIZE + 3, 1000])
def test_write_sizes_do_not_change_the_chunks(step: int) -> None:
    data = os.urandom(5 * SIZE + 3)
    assert chunk_all(data, step=step) == chunk_all(data, step=7)


def test_seq_and_offset_number_every_chunk_and_only_the_last_is_final() -> None:
    data = os.urandom(2 * SIZE + 5)
    chunks = chunk_all(data)
    assert [(c.info.seq, c.info.offset) for c in chunks] == [(0, 0), (1, SIZE), (2, 2 * SIZE)]
    assert [c.info.final for c in chunks] == [False, False, True]
    assert all(c.info.size is None and c.info.sha256 is None for c in chunks[:-1])
    last = chunks[-1].info
    assert last.size == len(data)
    assert last.sha256 == hashlib.sha256(data).hexdigest()


def test_empty_stream_is_one_empty_final_chunk_with_the_empty_hash() -> None:
    (only,) = chunk_all(b"")
    assert only.body == b""
    assert (only.info.seq, only.info.offset, only.info.final, only.info.size) == (0, 0, True, 0)
    assert only.info.sha256 == hashlib.sha256(b"").hexdigest()


def test_headers_follow_the_wire_format() -> None:
    first, last = chunk_all(os.urandom(SIZE + 1))
    assert first.info.headers() == {
        "sluice-stream-id": "s1", "JMSXGroupID": "s1", "sluice-stream-seq": "0",
        "sluice-stream-offset": "0", "sluice-stream-name": "f.bin"}
    headers = last.info.headers()
    assert headers["sluice-stream-final"] == "true"
    assert headers["sluice-stream-size"] == str(SIZE + 1)
    assert len(headers["sluice-stream-sha256"]) == 64


def test_full_chunks_are_emitted_as_soon_as_more_input_proves_they_are_not_last() -> None:
    c = Chunker("s", "n", SIZE)
    assert c.feed(b"x" * SIZE) == []  # could still be the final chunk
    (emitted,) = c.feed(b"y")
    assert emitted.body == b"x" * SIZE and not emitted.info.final
    assert c.bytes_in == SIZE + 1


def test_resume_skips_stored_bytes_but_hashes_them() -> None:
    data = os.urandom(4 * SIZE + 2)
    full = chunk_all(data)
    resumed = chunk_all(data, skip=2 * SIZE, first_seq=2)
    assert [c.info for c in resumed] == [c.info for c in full[2:]]
    assert [c.body for c in resumed] == [c.body for c in full[2:]]


def test_resume_with_a_different_chunk_size_continues_at_the_stored_offset() -> None:
    data = os.urandom(30)
    chunks = chunk_all(data, chunk_size=4, skip=10, first_seq=3)
    assert [(c.info.seq, c.info.offset, len(c.body)) for c in chunks] == [
        (3, 10, 4), (4, 14, 4), (5, 18, 4), (6, 22, 4), (7, 26, 4)]
    assert chunks[-1].info.sha256 == hashlib.sha256(data).hexdigest()


def test_resume_where_everything_but_the_final_chunk_was_stored() -> None:
    data = os.urandom(2 * SIZE)
    (final,) = chunk_all(data, skip=2 * SIZE, first_seq=2)
    assert (final.body, final.info.offset, final.info.size) == (b"", 2 * SIZE, 2 * SIZE)


def test_input_shorter_than_the_resume_point_is_refused() -> None:
    c = Chunker("s", "n", SIZE, skip=10, first_seq=1)
    c.feed(b"123")
    with pytest.raises(ValueError, match="same input"):
        c.finish()


def test_misuse_is_refused() -> None:
    with pytest.raises(ValueError):
        Chunker("s", "n", 0)
    c = Chunker("s", "n", SIZE)
    c.finish()
    with pytest.raises(ValueError):
        c.feed(b"late")
    with pytest.raises(ValueError):
        c.finish()
