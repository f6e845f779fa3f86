"""Spec of column batches (protocol/columns.py): many messages packed as columns in one
MESSAGE body, decoded back as views without a loop per message; malformed bodies refused."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
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
