"""Spec of column batches (protocol/columns.py): many messages packed as columns in one
MESSAGE body, decoded back as views without a loop per message; malformed bodies refused."""

from __future__ import annotations

import json
from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluicemq.protocol import columns

Row = tuple[int, int, int, int, int, bytes, bytes]
rows = st.lists(st.tuples(
    st.integers(0, (1 << 63) - 1), st.integers(0, 1 << 45), st.integers(0, 1 << 45),
    st.integers(0, 9), st.integers(0, 3),
    st.dictionaries(st.text(min_size=1, max_size=5), st.text(max_size=8), max_size=3).map(
        lambda h: json.dumps(h).encode()),
    st.binary(max_size=40)), max_size=30)


def encode(batch: list[Row]) -> bytes:
    w = columns.ColumnWriter()
    for row in batch:
        w.add(*row)
    body = b"".join(w.finish())
    assert abs(len(body) - w.nbytes) <= 64 + 30 * len(batch), "nbytes estimates the size"
    return body


@given(rows)
def test_a_batch_decodes_to_what_was_added(batch: list[Row]) -> None:
    cols = columns.decode(encode(batch))
    assert cols.count == len(batch)
    assert list(cols.seq) == [r[0] for r in batch]
    assert list(cols.timestamp) == [r[1] for r in batch]
    assert list(cols.expires) == [r[2] for r in batch]
    assert list(cols.priority) == [r[3] for r in batch]
    assert list(cols.flags) == [r[4] for r in batch]
    assert [cols.headers_json(i) for i in range(len(batch))] == [r[5] for r in batch]
    assert list(cols.bodies()) == [r[6] for r in batch]


@given(rows)
def test_every_section_starts_8_byte_aligned_for_zero_copy_readers(batch: list[Row]) -> None:
    cols = columns.decode(encode(batch))
    for at in (cols.seq_at, cols.timestamp_at, cols.expires_at, cols.priority_at,
               cols.flags_at, cols.hoff_at, cols.boff_at, cols.hdata_at, cols.bdata_at):
        assert at % 8 == 0


@given(rows, st.data())
def test_a_damaged_batch_is_refused_not_misread(batch: list[Row], data: st.DataObject) -> None:
    """Truncation, a wrong magic or offsets that do not add up: ValueError, never a wrong
    batch (a batch whose bodies are all empty has no body bytes to lose, so cut the head)."""
    body = encode(batch)
    cut = data.draw(st.integers(0, len(body) - 1))
    with pytest.raises(ValueError, match="column batch"):
        columns.decode(body[:cut])
    with pytest.raises(ValueError, match="bad magic"):
        columns.decode(b"XXXX" + body[4:])


def test_offsets_that_go_backwards_are_refused() -> None:
    body = bytearray(encode([(1, 0, 0, 4, 0, b"{}", b"ab"), (2, 0, 0, 4, 0, b"{}", b"cd")]))
    cols = columns.decode(bytes(body))
    body[cols.boff_at + 4:cols.boff_at + 8] = (5).to_bytes(4, "little")  # 0, 5, 4
    with pytest.raises(ValueError, match="not ascending"):
        columns.decode(bytes(body))


# -- the spans layout: values located where they lie, not copied together ----------------------

def encode_spans(batch: list[Row], gaps: list[bytes]) -> bytes:
    """Half the rows by ``add``, half by ``add_run`` over one piece holding each row's
    headers and body with ``gaps[i]`` (bytes that belong to no value) before it."""
    w = columns.SpanWriter()
    half = len(batch) // 2
    for row in batch[:half]:
        w.add(*row)
    piece, spans = bytearray(), []
    for row, gap in zip(batch[half:], gaps, strict=False):
        piece += gap
        start = w.data_size + len(piece)
        spans += [start, start + len(row[5]), start + len(row[5]) + len(row[6])]
        piece += row[5] + row[6]
    rest = batch[half:]
    w.add_run(array("Q", [r[0] for r in rest]).tobytes(),
              array("q", [r[1] for r in rest]).tobytes(),
              array("q", [r[2] for r in rest]).tobytes(), bytes(r[3] for r in rest),
              bytes(r[4] for r in rest), array("i", spans).tobytes(), [memoryview(piece)])
    return b"".join(w.finish())


# No deadline: the first example's decode imports numpy (protocol/columns loads it only on a
# spans check), a one-time ~0.1-0.5 s that Hypothesis would report as an unreliable timing.
@settings(deadline=None)
@given(rows, st.lists(st.binary(max_size=20), min_size=30, max_size=30))
def test_a_spans_batch_decodes_to_what_was_added(batch: list[Row], gaps: list[bytes]) -> None:
    cols = columns.decode(encode_spans(batch, gaps))
    assert cols.layout == columns.SPANS
    assert list(cols.seq) == [r[0] for r in batch]
    assert list(cols.timestamp) == [r[1] for r in batch]
    assert list(cols.expires) == [r[2] for r in batch]
    assert list(cols.priority) == [r[3] for r in batch]
    assert list(cols.flags) == [r[4] for r in batch]
    assert cols.all_headers_json() == [r[5] for r in batch]
    assert list(cols.bodies()) == [r[6] for r in batch]
    assert cols.body_bytes == sum(len(r[6]) for r in batch)
    for at in (cols.seq_at, cols.timestamp_at, cols.expires_at, cols.priority_at,
               cols.flags_at, cols.spans_at, cols.data_at):
        assert at % 8 == 0


def test_spans_that_go_backwards_or_past_the_data_are_refused() -> None:
    w = columns.SpanWriter()
    w.add(1, 0, 0, 4, 0, b"{}", b"ab")
    w.add(2, 0, 0, 4, 0, b"{}", b"cd")
    body = bytearray(b"".join(w.finish()))
    cols = columns.decode(bytes(body))
    spans_at = cols.spans_at
    body[spans_at + 12:spans_at + 16] = (1).to_bytes(4, "little")  # 2nd headers start < 1st end
    with pytest.raises(ValueError, match="not ascending"):
        columns.decode(bytes(body))
    body[spans_at + 12:spans_at + 16] = (4).to_bytes(4, "little")
    body[spans_at + 20:spans_at + 24] = (99).to_bytes(4, "little")  # last end past the data
    with pytest.raises(ValueError, match="not ascending"):
        columns.decode(bytes(body))


def test_a_run_whose_spans_leave_its_pieces_is_refused() -> None:
    w = columns.SpanWriter()
    with pytest.raises(ValueError, match="outside the pieces"):
        w.add_run((1).to_bytes(8, "little"), bytes(8), bytes(8), b"\x04", b"\x00",
                  array("i", [0, 2, 9]).tobytes(), [memoryview(b"{}ab")])
    assert len(w) == 0 and w.data_size == 0  # refused whole: the writer is as it was
