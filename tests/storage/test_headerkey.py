"""Spec of the journal's key (storage/headerkey.py): created with the journal, kept beside its
segments, never silently missing nor another journal's; a journal written before keys recovers as
it did and is keyed from its next segment on."""

from __future__ import annotations

import random
import stat
from pathlib import Path

import pytest

from sluicemq.errors import StorageError
from sluicemq.storage.checksum import crc32
from sluicemq.storage.headerkey import KEY_NAME, HeaderKey, create_key
from sluicemq.storage.journal import Journal
from sluicemq.storage.segment import HEADER_SIZE, KEYED, encode_header, segment_name

SEG = 64 << 10


def recovered(directory: Path) -> tuple[list[bytes], Journal]:
    journal = Journal(directory, segment_bytes=SEG)
    payloads = [bytes(p) for rtype, p, _ in journal.recover() if rtype == 1]
    journal.close()
    return payloads, journal


def test_a_new_journal_gets_a_private_key_that_keys_every_segment(open_journal) -> None:
    opened = open_journal(segment_bytes=SEG)
    path = opened.directory / KEY_NAME
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert opened.journal.header_key.first == 1
    ticket = opened.journal.append(1, b"hello")
    opened.watch.wait(ticket.seq)
    head = (opened.directory / segment_name(1)).read_bytes()[:HEADER_SIZE]
    assert head[3] & KEYED
    seeds = opened.journal.header_key.seeds(1)
    assert seeds != (0, 0) and head == encode_header(1, b"hello", 1, 0, seeds=seeds)
    assert head != encode_header(1, b"hello", 1, 0, seeds=(0, 0))


def test_two_journals_have_different_keys_and_a_segments_seeds_say_nothing_of_anothers(
        tmp_path: Path) -> None:
    one = Journal(tmp_path / "one")
    two = Journal(tmp_path / "two")
    try:
        assert one.header_key.seeds(1) != two.header_key.seeds(1)
        assert len({one.header_key.seeds(n) for n in range(1, 100)}) == 99
    finally:
        one.close()
        two.close()


def test_the_key_is_kept_across_restarts(open_journal, tmp_path: Path) -> None:
    opened = open_journal(segment_bytes=SEG)
    sent = [random.Random(1).randbytes(3000) + b"%d" % i for i in range(60)]  # three segments
    tickets = [opened.journal.append(1, p) for p in sent]
    opened.watch.wait(tickets[-1].seq)
    seeds = opened.journal.header_key.seeds(2)
    opened.journal.close()
    payloads, journal = recovered(opened.directory)
    assert payloads == sent and journal.header_key.seeds(2) == seeds


def test_a_keyed_journal_without_its_key_file_refuses_to_open(open_journal) -> None:
    opened = open_journal(segment_bytes=SEG)
    opened.watch.wait(opened.journal.append(1, b"kept").seq)
    opened.journal.close()
    (opened.directory / KEY_NAME).unlink()
    with pytest.raises(StorageError, match=r"has keyed records .* but no journal\.key"):
        Journal(opened.directory, segment_bytes=SEG)
    kept = (opened.directory / segment_name(1)).read_bytes()
    assert kept[HEADER_SIZE:HEADER_SIZE + 4] == b"kept"  # nothing was zeroed as damage


def test_a_damaged_key_file_refuses_to_open(open_journal) -> None:
    opened = open_journal(segment_bytes=SEG)
    opened.journal.close()
    path = opened.directory / KEY_NAME
    data = bytearray(path.read_bytes())
    data[20] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(StorageError, match="is damaged"):
        Journal(opened.directory, segment_bytes=SEG)


def test_a_journal_written_before_keys_recovers_as_it_did_and_is_keyed_from_its_next_segment(
        tmp_path: Path, open_journal) -> None:
    directory = tmp_path / "journal"
    directory.mkdir()
    old = [b"old %d " % i + bytes(2000) for i in range(20)]  # segment 1, as session 17 wrote it
    data = b""
    for payload in old:
        data += encode_header(1, payload, 1, len(data), seeds=(0, 0)) + payload
    (directory / segment_name(1)).write_bytes(data.ljust(SEG, b"\0"))

    opened = open_journal(directory, segment_bytes=SEG)
    assert [p for _, p, _ in opened.records] == old
    assert opened.journal.header_key.first == 2  # the active segment 1 stays unkeyed
    assert oct(stat.S_IMODE((directory / KEY_NAME).stat().st_mode)) == oct(0o600)
    new = [b"new %d " % i + bytes(3000) for i in range(40)]  # the rest of 1, then 2 and 3
    tickets = [opened.journal.append(1, p) for p in new]
    opened.watch.wait(tickets[-1].seq)
    opened.journal.close()
    assert tickets[-1].loc.segment == 3 and tickets[0].loc.segment == 1
    heads = [(directory / segment_name(n)).read_bytes()[3] for n in (1, 2, 3)]
    assert [bool(h & KEYED) for h in heads] == [False, True, True]
    payloads, _ = recovered(directory)
    assert payloads == old + new


def test_unkeyed_seeds_are_the_format_before_keys() -> None:
    key = HeaderKey()
    assert not key.keyed(1) and key.seeds(7) == (0, 0)
    keyed = HeaderKey(bytes(32), 5)
    assert keyed.seeds(4) == (0, 0) and keyed.keyed(5) and keyed.seeds(5) != (0, 0)


def test_a_key_file_of_a_newer_format_is_refused_and_nothing_is_touched(open_journal) -> None:
    opened = open_journal(segment_bytes=SEG)
    opened.watch.wait(opened.journal.append(1, b"kept").seq)
    opened.journal.close()
    path = opened.directory / KEY_NAME
    data = bytearray(path.read_bytes())
    data[8:12] = (2).to_bytes(4, "little")  # the version field, after the 8-byte magic
    data[-4:] = crc32(bytes(data[:-4])).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    before = {p.name: p.read_bytes() for p in opened.directory.iterdir() if p.is_file()}
    with pytest.raises(StorageError, match=r"journal format 2, newer than this SluiceMQ reads "
                                           r"\(1\): .* written by a newer SluiceMQ"):
        Journal(opened.directory, segment_bytes=SEG)
    assert {p.name: p.read_bytes() for p in opened.directory.iterdir() if p.is_file()} == before


def written(open_journal, count: int = 60) -> tuple[Path, list[bytes]]:
    """A closed journal of ``count`` records, three segments and the next one made ahead."""
    opened = open_journal(segment_bytes=SEG)
    sent = [random.Random(2).randbytes(3000) + b"%d" % i for i in range(count)]
    tickets = [opened.journal.append(1, p) for p in sent]
    opened.watch.wait(tickets[-1].seq)
    opened.journal.close()
    return opened.directory, sent


def files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in directory.iterdir() if p.is_file()}


FOREIGN = (r"journal\.key is not the key this journal's segments were written with: the first "
           r"record of none of them checks out under it \(00000000000000000001\.log")


def test_a_key_that_is_not_the_segments_own_refuses_to_open_and_changes_nothing(
        open_journal, tmp_path: Path) -> None:
    directory, sent = written(open_journal)
    own = (directory / KEY_NAME).read_bytes()
    Journal(tmp_path / "other").close()  # another broker's journal: its own key
    (directory / KEY_NAME).write_bytes((tmp_path / "other" / KEY_NAME).read_bytes())
    before = files(directory)
    with pytest.raises(StorageError, match=FOREIGN + r" and \d+ more\).* Nothing was changed. "
                                                     r"Put back the journal\.key"):
        Journal(directory, segment_bytes=SEG)
    assert files(directory) == before  # nothing zeroed as a torn tail, no segment deleted
    (directory / KEY_NAME).write_bytes(own)  # the directory lock was let go with the refusal
    payloads, _ = recovered(directory)
    assert payloads == sent


def test_a_key_file_put_beside_a_journal_from_before_keys_is_refused_too(tmp_path: Path) -> None:
    directory = tmp_path / "journal"
    directory.mkdir()
    data = encode_header(1, b"old", 1, 0, seeds=(0, 0)) + b"old"
    (directory / segment_name(1)).write_bytes(data.ljust(SEG, b"\0"))
    create_key(directory, 1)  # claims segment 1, which was written before keys
    with pytest.raises(StorageError, match=FOREIGN + r"\)"):
        Journal(directory, segment_bytes=SEG)
    assert (directory / segment_name(1)).read_bytes()[: len(data)] == data


@pytest.mark.parametrize("landed", [0, HEADER_SIZE, HEADER_SIZE + 1000],
                         ids=["nothing", "the header", "part of the payload"])
@pytest.mark.parametrize("segments", [1, 3], ids=["the journal's only segment",
                                                  "its third segment"])
def test_a_crash_that_tore_the_first_write_of_a_new_segment_still_opens(
        open_journal, landed: int, segments: int) -> None:
    """Of the first write into a new segment only ``landed`` bytes reached the disk (it is
    zero-filled ahead of use): under the right key there is nothing at offset 0 or a header
    that checks out, so the journal opens and drops the torn write as a tail."""
    directory, sent = written(open_journal, count=20 * segments)
    journal = Journal(directory, segment_bytes=SEG)
    before = [loc.segment for rtype, _, loc in journal.recover() if rtype == 1]
    journal.close()
    assert before[-1] == segments
    path = directory / segment_name(segments)
    data = bytearray(path.read_bytes())
    data[landed:] = bytes(len(data) - landed)
    path.write_bytes(bytes(data))
    payloads, journal = recovered(directory)
    assert payloads == sent[: before.index(segments)]  # every record before the torn write
    assert journal.report is not None
    torn = [(n, offset) for n, offset, _, why in journal.report.dropped if "torn tail" in why]
    assert torn == ([(segments, 0)] if landed else [])
