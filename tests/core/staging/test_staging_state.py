"""Specs of staged publishing's bookkeeping (sans-IO): names, part lists, parked parts and the
memory of published batches."""

from __future__ import annotations

import pytest

from sluicemq.core.staging.book import ParkedPart, StageBook, StagedRecord, parse_names, parse_parts
from sluicemq.errors import ProtocolError
from sluicemq.storage import records
from sluicemq.storage.segment import Location
from sluicemq.storage.staging_records import (
    Publication,
    StageMeta,
    decode_discard,
    decode_publish,
    decode_stage,
    encode_discard,
    encode_publish,
    encode_stage,
)
from sluicemq.storage.store import RecoveredTicket


def part(name: str, attempt: int = 1, created: int = 0, batch: str = "b1",
         messages: int = 2, owner: str | None = None) -> ParkedPart:
    rec = StagedRecord(RecoveredTicket(Location(1, 0, 10)))
    for i in range(messages):
        rec.add("q:out", 4, 20 + i, 3)
    return ParkedPart("sink", batch, name, attempt, created, owner, [rec])


def test_names_are_checked() -> None:
    assert parse_names("s/b/p", "sluice-stage", 3) == ("s", "b", "p")
    assert parse_names("spark.orders/b-17", "sluice-stage-commit", 2) == ("spark.orders", "b-17")
    for bad in (None, "", "s/b", "s/b/p/x", "s//p", "s/b/p q", "s/b/" + "x" * 201, "s/b/ä"):
        with pytest.raises(ProtocolError) as err:
            parse_names(bad, "sluice-stage", 3)
        assert not err.value.fatal


def test_part_lists() -> None:
    assert parse_parts("p0,p1, p2") == ["p0", "p1", "p2"]
    assert parse_parts("") == []
    for bad in (None, "p0,,p1", "p0,p0", "p 0"):
        with pytest.raises(ProtocolError):
            parse_parts(bad)


def test_a_staged_record_keeps_routing_facts_compactly() -> None:
    rec = StagedRecord(RecoveredTicket(Location(1, 0, 10)))
    rec.add("q:a", 4, 30, 100)
    rec.add("t:b", 9, 200, 5)
    rec.add("q:a", 0, 400, 7)
    assert len(rec) == 3
    assert rec.keys == ["q:a", "t:b"]
    assert list(rec.kidx) == [0, 1, 0]


def test_a_part_staged_again_replaces_the_earlier_attempt() -> None:
    book = StageBook()
    first = part("p0", attempt=1)
    assert book.park(first) is None
    assert book.park(part("p0", attempt=2)) is first
    assert book.parts_of((None, "sink", "b1"))["p0"].attempt == 2
    assert book.take(first) is None  # the old attempt is no longer there
    assert book.take(book.parts_of((None, "sink", "b1"))["p0"]) is not None
    assert book.parked == {}


def test_batches_of_the_same_name_belong_to_their_owners() -> None:
    """Two users' batches named alike never meet: each sees only its own parts and
    publications; ownerless entries (older data dirs) stay visible to every user."""
    book = StageBook()
    book.park(part("p0", owner="app-a"))
    book.remember(("app-b", "sink", "b1"), 100, 0)
    assert book.scope("app-a", "sink", "b1") == ("app-a", "sink", "b1")
    assert book.published_count(book.scope("app-a", "sink", "b1")) is None
    assert list(book.parts_of(book.scope("app-b", "sink", "b1"))) == []
    book.remember((None, "sink", "old"), 100, 3)
    assert book.scope("app-a", "sink", "old") == (None, "sink", "old")
    assert book.scope("app-a", "sink", "new") == ("app-a", "sink", "new")
    copy = StageBook()
    copy.load_memory(book.dump_memory())
    assert copy.published_count(("app-b", "sink", "b1")) == 0
    assert copy.published_count((None, "sink", "b1")) is None


def test_expiry_of_parts() -> None:
    book = StageBook()
    book.park(part("old", created=0))
    book.park(part("young", created=5000))
    assert [p.part for p in book.expired(now_ms=6000, timeout_ms=3000)] == ["old"]


def test_published_batches_are_remembered_within_the_cap_and_the_age_limit() -> None:
    book = StageBook(max_per_sink=2)
    book.remember((None, "s", "b1"), 100, 5)
    book.remember((None, "s", "b2"), 200, 6)
    book.remember((None, "other", "b1"), 150, 1)
    assert book.published_count((None, "s", "b1")) == 5
    book.remember((None, "s", "b3"), 300, 7)  # over the cap: the oldest is forgotten
    assert book.published_count((None, "s", "b1")) is None
    assert book.published_count((None, "s", "b3")) == 7
    assert book.forget_older(250) == 2  # s/b2 and other/b1
    assert book.dump_memory() == [["s", "b3", 300, 7]]
    copy = StageBook(max_per_sink=2)
    copy.load_memory(book.dump_memory())
    assert copy.published_count((None, "s", "b3")) == 7


def test_record_layouts_round_trip() -> None:
    meta = StageMeta("s", "b", "p", 17, 1234)
    ops = [(records.MSG, records.encode_message("q:out", 0, 1, 0, 4, {"k": "v"}, b"body"))]
    payload = encode_stage(meta, ops, final=True)
    got, txid, final, got_ops = decode_stage(payload)
    assert (got, final) == (meta, True)
    inner = records.tx_op_offsets(txid, got_ops)[0]
    assert records.message_body(records.tx_op_at(payload, inner)) == b"body"
    pub = Publication("s", "b", 1000, 3, 99, [("p0", [(Location(1, 2, 3), 4)]), ("p1", [])])
    assert decode_publish(encode_publish(pub)) == pub
    assert decode_discard(encode_discard([("s", "b", "p", 1, None)])) == [("s", "b", "p", 1,
                                                                            None)]


def test_owners_are_optional_trailing_fields() -> None:
    """Records written before owners existed read as ownerless; ownerless records are written
    exactly as before, so a data dir moves between versions either way while security is off."""
    old_txid = '["s","b","p",17,1234]'
    payload = records.encode_tx(old_txid, [], final=True)
    assert decode_stage(payload)[0] == StageMeta("s", "b", "p", 17, 1234, None)
    assert StageMeta("s", "b", "p", 17, 1234).txid() == old_txid
    owned = StageMeta("s", "b", "p", 17, 1234, "app-a")
    assert decode_stage(encode_stage(owned, [], final=True))[0] == owned
    assert decode_discard(b'[["s","b","p",1]]') == [("s", "b", "p", 1, None)]
    assert encode_discard([("s", "b", "p", 1, None)]) == b'[["s","b","p",1]]'
    assert decode_discard(encode_discard([("s", "b", "p", 1, "app-a")]))[0][4] == "app-a"
    old_pub = b'{"sink":"s","batch":"b","base":1,"count":0,"at":5,"parts":[]}'
    assert decode_publish(old_pub) == Publication("s", "b", 1, 0, 5, [])
    assert encode_publish(Publication("s", "b", 1, 0, 5, [])) == old_pub
    pub = Publication("s", "b", 1, 0, 5, [], owner="app-b")
    assert decode_publish(encode_publish(pub)).owner == "app-b"


def test_published_memory_rows_keep_tokens_and_owners_and_read_older_rows() -> None:
    """Rows are [sink, batch, at, n], then the token, then the owner (token null when only an
    owner is known); rows written before either have four elements."""
    book = StageBook()
    book.remember((None, "s", "plain"), 1, 1)
    book.remember((None, "s", "tok"), 2, 2, "q1:2:ab")
    book.remember(("app-a", "s", "own"), 3, 3)
    book.remember(("app-a", "s", "both"), 4, 4, "q2:4:cd")
    rows = book.dump_memory()
    assert sorted(rows, key=lambda r: r[2]) == [
        ["s", "plain", 1, 1], ["s", "tok", 2, 2, "q1:2:ab"], ["s", "own", 3, 3, None, "app-a"],
        ["s", "both", 4, 4, "q2:4:cd", "app-a"]]
    copy = StageBook()
    copy.load_memory(rows)
    assert copy.published_token(("app-a", "s", "both")) == "q2:4:cd"
    assert copy.published_token(("app-a", "s", "own")) is None
    assert copy.published_count(("app-a", "s", "own")) == 3
    assert copy.published_token((None, "s", "tok")) == "q1:2:ab"
    assert copy.published_count((None, "s", "plain")) == 1
