"""Spec of the stream header format: parsing chunks and resume answers, reserved names."""

from __future__ import annotations

import pytest

from sluicemq.streaming import manifest as m
from sluicemq.streaming.errors import StreamProtocolError
from sluicemq.streaming.manifest import ChunkInfo, ResumePoint

SHA = "ab" * 32


def test_chunk_headers_round_trip() -> None:
    info = ChunkInfo("id1", 3, 300, "a b.bin", True, 310, SHA)
    headers = info.headers()
    assert headers["JMSXGroupID"] == "id1"
    assert m.parse_chunk(headers) == info
    assert m.is_chunk(headers) and not m.is_chunk({"destination": "/queue/x"})


def test_resumed_mark_is_read() -> None:
    headers = {**ChunkInfo("id1", 2, 8, "n").headers(), "sluice-stream-resumed": "true"}
    assert m.parse_chunk(headers).resumed


@pytest.mark.parametrize("broken", [
    {},
    {"sluice-stream-id": "x", "sluice-stream-seq": "-1", "sluice-stream-offset": "0"},
    {"sluice-stream-id": "x", "sluice-stream-seq": "0"},
    {"sluice-stream-id": "x", "sluice-stream-seq": "9" * 5000, "sluice-stream-offset": "0"},
    {"sluice-stream-id": "x", "sluice-stream-seq": "0", "sluice-stream-offset": "\u00b2"},
    {"sluice-stream-id": "x", "sluice-stream-seq": "0", "sluice-stream-offset": "0",
     "sluice-stream-final": "true", "sluice-stream-size": "1", "sluice-stream-sha256": "zz"},
    {"sluice-stream-id": "x", "sluice-stream-seq": "1", "sluice-stream-offset": "9",
     "sluice-stream-final": "true", "sluice-stream-size": "4", "sluice-stream-sha256": SHA},
])
def test_malformed_chunks_are_refused(broken: dict[str, str]) -> None:
    with pytest.raises(StreamProtocolError):
        m.parse_chunk(broken)


def test_resume_answer_is_parsed() -> None:
    point = m.parse_resume({"receipt-id": "r-1", "sluice-stream-next-seq": "4",
                            "sluice-stream-next-offset": "4096", "sluice-stream-state": "open"})
    assert point == ResumePoint(4, 4096, "open") and not point.complete
    waited = m.parse_resume({"sluice-stream-next-seq": "0", "sluice-stream-next-offset": "0",
                             "sluice-stream-state": "unknown", "sluice-stream-consumers": "0"})
    assert waited.consumers == 0


@pytest.mark.parametrize("seq", ["9" * 5000, "\u00b2", "-1", " 4"])
def test_a_resume_answer_with_a_bad_number_is_refused_saying_which(seq: str) -> None:
    """Past int()'s 4,300 digits, or digits it does not take ("²"): the clear error, with
    at most 50 characters of the value (was: ValueError)."""
    with pytest.raises(StreamProtocolError, match="sluice-stream-next-seq must be") as caught:
        m.parse_resume({"sluice-stream-next-seq": seq, "sluice-stream-next-offset": "0",
                        "sluice-stream-state": "open"})
    assert len(str(caught.value)) < 200


def test_a_receipt_without_the_answer_means_no_stream_support() -> None:
    with pytest.raises(StreamProtocolError, match="support streams"):
        m.parse_resume({"receipt-id": "r-1"})


def test_broker_errors_are_recognised() -> None:
    assert m.is_gap_error({"message": "stream gap: expected 3"})
    assert not m.is_gap_error({"message": "queue full"})
    abandoned = {"message": "stream abandoned: producer gone", "sluice-stream-id": "s9"}
    assert m.abandoned_stream(abandoned) == "s9"
    assert m.abandoned_stream({"message": "other", "sluice-stream-id": "s9"}) is None


def test_user_headers_cannot_impersonate_stream_headers() -> None:
    assert m.check_user_headers({"owner": "me"}) == {"owner": "me"}
    assert m.check_user_headers(None) == {}
    for key in ("sluice-stream-seq", "JMSXGroupID"):
        with pytest.raises(ValueError, match="reserved"):
            m.check_user_headers({key: "1"})


def test_file_stream_id_is_stable_and_sensitive_to_changes() -> None:
    a = m.file_stream_id("/data/x.bin", 10, 1_000)
    assert a == m.file_stream_id("/data/x.bin", 10, 1_000)
    assert len(a) == 32
    assert len({a, m.file_stream_id("/data/x.bin", 11, 1_000),
                m.file_stream_id("/data/x.bin", 10, 1_001),
                m.file_stream_id("/data/y.bin", 10, 1_000)}) == 4
