"""MSG records: the stored header JSON.

Journals written before headers were encoded with msgspec hold ``json.dumps`` output, and
column-batch reads splice the stored JSON into frames as it is, so the encoding must stay
byte for byte what it was and every old record must read back the same.
"""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from sluicemq.storage import records

HEADER_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
HEADERS = st.dictionaries(HEADER_TEXT, HEADER_TEXT, max_size=12)


def old_encoding(headers: dict[str, str]) -> bytes:
    return json.dumps(headers, separators=(",", ":"), ensure_ascii=False).encode()


@given(HEADERS)
def test_headers_are_stored_as_the_same_compact_json_bytes_as_before(
        headers: dict[str, str]) -> None:
    assert records.encode_headers(headers) == old_encoding(headers)


@given(HEADERS, st.binary(max_size=64))
def test_a_record_written_with_the_old_encoding_reads_back_unchanged(
        headers: dict[str, str], body: bytes) -> None:
    h = old_encoding(headers)
    k = b"q:orders"
    payload = b"".join((records.MSG_HEAD.pack(7, 1_700_000_000_000, 0, 4, 0, len(k), len(h)),
                        k, h, body))
    stored = records.decode_message(memoryview(payload))
    assert (stored.key, stored.mid, stored.headers, stored.body) == ("q:orders", 7, headers, body)
    assert records.message_headers(payload[:records.message_prefix_size(payload)]) == headers


def test_control_characters_quotes_and_non_ascii_survive_the_round_trip() -> None:
    headers = {"destination": "/queue/é\u2028", "note": "a\"b\\c\n\t\x01\x7f😀", "": ""}
    payload = records.encode_message("q:x", 1, 2, 0, 4, headers, b"body")
    assert records.decode_message(payload).headers == headers


@given(HEADERS, st.binary(max_size=64))
def test_a_message_head_followed_by_its_body_is_the_whole_record(
        headers: dict[str, str], body: bytes) -> None:
    head = records.encode_message_head("q:big", 9, 5, 0, 4, headers)
    assert head + body == records.encode_message("q:big", 9, 5, 0, 4, headers, body)
    assert records.message_prefix_size(head + body) == len(head)


OWNERS = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=30)


@given(OWNERS, HEADERS, st.binary(max_size=64))
def test_a_record_names_its_sender_and_every_reader_skips_the_name(
        login: str, headers: dict[str, str], body: bytes) -> None:
    """The sender's login sits between the fixed head and the key (``OWNER_FLAG``): decoding,
    the body, the columns, the prefix and re-keying (compaction) all find their fields past it,
    and a re-keyed copy still names the sender."""
    owner = records.encode_owner(login)
    payload = records.encode_message("q:orders", 7, 5, 9, 4, headers, body, owner)
    stored = records.decode_message(payload)
    assert (stored.key, stored.mid, stored.headers, stored.body, stored.owner) == (
        "q:orders", 7, headers, body, owner)
    assert records.owner_name(stored.owner) == login
    assert records.message_owner(payload) == owner
    assert bytes(records.message_body(payload)) == body
    _ts, _exp, _prio, h, b = records.message_columns(payload)
    assert (bytes(h), bytes(b)) == (records.encode_headers(headers), body)
    assert records.message_headers(payload[:records.message_prefix_size(payload)]) == headers
    assert records.message_head(payload)[3] == "q:orders"
    head = records.encode_message_head("q:orders", 7, 5, 9, 4, headers, owner)
    assert head + body == payload
    copy = records.decode_message(records.rekey_message(payload, "d:c:s", 8))
    assert (copy.key, copy.mid, copy.owner, copy.body) == ("d:c:s", 8, owner, body)


def test_a_record_without_a_sender_is_the_anonymous_users() -> None:
    """Records written with security off, or before senders were stored, have no owner field:
    the same bytes as ever, counted as ``anonymous``."""
    payload = records.encode_message("q:x", 1, 2, 0, 4, {"a": "b"}, b"body")
    assert records.MSG_HEAD.unpack_from(payload, 0)[4] & records.OWNER_FLAG == 0
    assert records.message_owner(payload) == b""
    assert records.owner_name(records.decode_message(payload).owner) == "anonymous"
