"""Spec of one large stream's chunk headers and state (core/streams/chunks.py), in process:
what a chunk SEND must say (the broker answers anything else with an ERROR naming it), and to
whom a stream belongs."""

from __future__ import annotations

import pytest

from sluicemq.core.streams.chunks import (
    FINAL,
    GROUP,
    NAME,
    OFFSET,
    SEQ,
    SIZE,
    STREAM_ID,
    Chunk,
    ChunkError,
    StreamState,
    check_owner,
    parse_chunk,
)


def headers(**extra: str) -> dict[str, str]:
    return {STREAM_ID: "s1", SEQ: "2", OFFSET: "8", **extra}


def test_a_chunk_says_its_stream_place_and_whether_it_ends_it() -> None:
    assert parse_chunk(headers(), 4) == Chunk("s1", 2, 8, "s1", False, None, None)
    final = parse_chunk(headers(**{FINAL: "true", SIZE: "12", NAME: "f.bin",
                                   GROUP: "s1"}), 4)
    assert (final.final, final.size, final.name) == (True, 12, "f.bin")


@pytest.mark.parametrize(("changed", "says"), [
    ({STREAM_ID: ""}, "1-200 characters"),
    ({STREAM_ID: "x" * 201}, "1-200 characters"),
    ({SEQ: "two"}, "must be non-negative integers"),
    ({OFFSET: "-1"}, "must be non-negative integers"),
    ({SEQ: "9" * 5000}, "at most 19 digits"),  # int() raises past 4,300 digits
    ({OFFSET: "\u00b2"}, "must be non-negative integers"),  # "²".isdigit(), int() refuses
    ({SEQ: " 2"}, "must be non-negative integers"),
    ({FINAL: "true", SIZE: "9" * 5000}, "integer sluice-stream-size"),
    ({GROUP: "other"}, "must be the stream id"),
    ({FINAL: "true"}, "integer sluice-stream-size"),
    ({FINAL: "true", SIZE: "99"}, "does not match"),
])
def test_a_bad_chunk_is_refused_saying_why(changed: dict[str, str], says: str) -> None:
    with pytest.raises(ChunkError, match=says):
        parse_chunk({**headers(), **changed}, 4)


def test_a_stream_belongs_to_who_started_it_when_security_names_users() -> None:
    st = StreamState("s1", "f.bin", "/queue/files", "q:files", owner="alice")
    check_owner(st, "alice")
    check_owner(st, None)  # security off: nobody is named
    with pytest.raises(ChunkError, match="belongs to another user"):
        check_owner(st, "mallory")
    check_owner(StreamState("s2", "g", "/queue/files", "q:files"), "anyone")


def test_a_stream_is_known_by_destination_and_id_and_complete_once_its_size_is() -> None:
    st = StreamState("s1", "f.bin", "/queue/files", "q:files")
    assert st.key == ("q:files", "s1")
    assert not st.final_stored
    st.size = 12
    assert st.final_stored
    assert st.as_dict()["size"] == 12
