"""Spec of the numbers the client reads from headers a broker (or, through it, another
client) wrote: a message's ``sluice-seq``, a stream's advisory file size, a gap error's next
sequence number. One ``int`` refuses - a superscript digit ``isdigit`` accepts, or more than
4,300 digits - reads as "none", like any other header that is no number (was: ValueError)."""

from __future__ import annotations

import pytest

from sluicemq.client.files import expected_total
from sluicemq.client.message import Message
from sluicemq.client.streams import chunk_error
from sluicemq.errors import ClientError
from sluicemq.protocol.frames import Frame
from sluicemq.streaming.manifest import FILE_SIZE, GAP_MESSAGE, NEXT_SEQ

BAD = ["\u00b2", "9" * 5000, "-1", ""]


@pytest.mark.parametrize("text", BAD)
def test_a_sequence_number_that_is_no_number_reads_as_none(text: str) -> None:
    frame = Frame("MESSAGE", {"sluice-seq": text}, b"")
    assert Message(frame, "s", "a", "auto", acker=None).seq is None  # type: ignore[arg-type]
    assert Message(Frame("MESSAGE", {"sluice-seq": "42"}, b""), "s", "a", "auto",
                   acker=None).seq == 42  # type: ignore[arg-type]


@pytest.mark.parametrize("text", BAD)
def test_an_advisory_file_size_that_is_no_number_is_unknown(text: str) -> None:
    assert expected_total(None, {FILE_SIZE: text}) is None
    assert expected_total(None, {FILE_SIZE: "4096"}) == 4096


@pytest.mark.parametrize("text", BAD)
def test_a_gap_error_without_a_usable_next_seq_still_says_it_is_a_gap(text: str) -> None:
    error = ClientError(f"{GAP_MESSAGE}: expected 3", {"message": f"{GAP_MESSAGE}: x",
                                                         NEXT_SEQ: text}, b"")
    gap = chunk_error(error, "s1")
    assert gap.next_seq is None and "stream s1" in str(gap)  # type: ignore[attr-defined]
