"""The journal's secret: keyed record checksums, so no sender can forge a record (journal.key).

A record's two CRC-32s (``segment.py``) are seeded with a pair of 32-bit values, the
segment's *seeds*: (0, 0) in an unkeyed segment (the format before this file existed), else
the first and last four bytes of ``blake2b(segment number, key=secret)``, derived once a
segment and cached. The secret is 32 random bytes created with the journal, in
``journal/journal.key`` (mode 0600, written under a temporary name, fsynced, renamed, the
directory fsynced), beside the number of the first segment it keys: a data directory written
before it recovers exactly as it did (its segments are below that number) and is keyed from
the segment after the highest one it had.

Why this resists a sender who controls message bodies but never sees the files: for a given
header and payload, CRC-32 maps its seed one-to-one onto its result, so a candidate record
laid out in a body checks out under exactly one header seed and one payload seed - a guess at
the segment's 64 secret bits, right with probability 2^-64 when they are uniform and unknown.
CRC's linearity is no help without a single checksum of the segment to start from, and the
broker never returns header bytes (a delivery is a record's payload only). Each offset of a
segment gets its own header seed (the offset, CRC'd under the segment's seed), so a record
copied elsewhere, even within its segment, never checks out; and a segment number's seeds say
nothing about another number's (blake2b, keyed). How many guesses a sender gets: recovery
tries a candidate at each magic (2 bytes) in a damaged or stale range whose record fits, at
most one per two bytes and in practice one per record laid out (16 header bytes plus a
payload replay would accept, ~50 bytes or more): a 64 MiB segment of her bodies offers under
2^25 candidates, 2^-39 of a forgery per scan of it. So recovery resynchronises past damage in
every keyed segment, reused files too (``recovery.py``). Keying costs no hash a record: the
checksums are as before, only their seeds differ (bench/header_check.py).

The file's version is the journal's format: a later format that older code would misread
raises it, and a broker refuses a key file of a version above its own at open, before reading
or changing anything. Brokers before this file (8d52b76 and older) know no key file and drop a
keyed journal's records as damage: they must not open it (README, Durability).

The secret is not for confidentiality (records are in the clear); it must not be lost either:
without it no record of a keyed segment checks out. So a journal whose files carry ``KEYED``
headers but has no key file refuses to open (``StorageError``) instead of reading its records
as damage, and a key file that does not check out refuses the same way. Nor does a journal
open under a key file that is not its segments' own (``check_key``): copied from another data
directory, or made anew when the directory was recreated under a running broker.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import struct
from pathlib import Path

from sluicemq.errors import StorageError
from sluicemq.storage.checksum import crc32
from sluicemq.storage.recycle import parse_spare_name
from sluicemq.storage.segment import (
    HEADER_SIZE,
    KEYED,
    MAGIC,
    TMP_SUFFIX,
    Seeds,
    fsync_dir,
    parse_segment_name,
    segment_name,
    written_at,
)

KEY_NAME = "journal.key"
_FILE = struct.Struct("<8sIQ32s")  # magic, version, first keyed segment, secret
_FILE_MAGIC = b"SLUICEJK"
_VERSION = 1
_SEGMENT = struct.Struct("<Q")
_PERSON = b"sluicemq-record"
_CACHED = 4096  # segments whose seeds are kept (a journal has far fewer live)
UNKEYED: Seeds = (0, 0)


class HeaderKey:
    """The seeds of each segment's checksums; without a secret every segment is unkeyed."""

    __slots__ = ("_cache", "_secret", "first")

    def __init__(self, secret: bytes | None = None, first: int = 0) -> None:
        self._secret = secret
        self.first = first  # the first keyed segment number
        self._cache: dict[int, Seeds] = {}

    def keyed(self, segment: int) -> bool:
        return self._secret is not None and segment >= self.first

    def seeds(self, segment: int) -> Seeds:
        """(header seed, payload seed) of ``segment``: (0, 0) for an unkeyed one."""
        seeds = self._cache.get(segment)
        if seeds is not None:
            return seeds
        if self._secret is None or segment < self.first:
            seeds = UNKEYED
        else:
            digest = hashlib.blake2b(_SEGMENT.pack(segment), key=self._secret, digest_size=8,
                                     person=_PERSON).digest()
            seeds = (int.from_bytes(digest[:4], "little"), int.from_bytes(digest[4:], "little"))
        if len(self._cache) >= _CACHED:
            self._cache.clear()
        self._cache[segment] = seeds
        return seeds


def open_key(directory: Path) -> HeaderKey | None:
    """The journal's key: read from its file, or created for a journal without files yet;
    None for a journal written before keys existed (``create_key`` once it is recovered)."""
    path = directory / KEY_NAME
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        files = _journal_files(directory)
        if not files:
            return create_key(directory, 1)
        keyed = [p.name for p in files if _keyed_header(p)]
        if keyed:
            raise StorageError(
                f"journal {directory} has keyed records ({keyed[0]}) but no {KEY_NAME}: "
                "without it none of them checks out; restore the file") from None
        return None
    return _decode(data, path)


def check_key(directory: Path, key: HeaderKey) -> None:
    """Refuse ``key`` if no keyed segment of the journal was written with it.

    The journal writes offset 0 of every segment itself (the first record, or a reused file's
    stamp), so under the right key the header there checks out in every segment but one whose
    first write a crash tore, and that one holds zeros there (a header is never split) or a
    whole header, which checks out. Under another key none does, and recovery would take every
    keyed segment for a torn tail and zero it. Asked: the segments whose header claims a key
    or that the key claims; the first that checks out ends the look (at most one read a start
    in practice). Reads only."""
    asked: list[str] = []
    for number in sorted(n for p in directory.iterdir()
                         if (n := parse_segment_name(p.name)) is not None):
        name = segment_name(number)
        head = _head(directory / name)
        if len(head) < HEADER_SIZE or head[:2] != MAGIC:
            continue  # a new segment whose first write never landed
        if not head[3] & KEYED and not key.keyed(number):
            continue  # written before keys, and the key agrees
        if written_at(head, number, 0, seeds=key.seeds(number)):
            return
        asked.append(name)
    if asked:
        more = f" and {len(asked) - 1} more" if len(asked) > 1 else ""
        raise StorageError(
            f"{directory / KEY_NAME} is not the key this journal's segments were written with: "
            f"the first record of none of them checks out under it ({asked[0]}{more}); was it "
            "copied from another data directory, or the directory recreated under a running "
            f"broker? Nothing was changed. Put back the {KEY_NAME} these segments were written "
            "with (a backup of this data directory holds it) and start again; if it is lost, "
            f"so are their records: move {directory} aside to start on an empty journal")


def create_key(directory: Path, first: int) -> HeaderKey:
    """Create the key file (a fresh secret keying segments from ``first`` on), durably."""
    secret = secrets.token_bytes(32)
    body = _FILE.pack(_FILE_MAGIC, _VERSION, first, secret)
    path = directory / KEY_NAME
    tmp = path.with_name(path.name + TMP_SUFFIX)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # also when an older temporary file was left with other bits
        os.write(fd, body + crc32(body).to_bytes(4, "little"))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, path)
    fsync_dir(directory)
    return HeaderKey(secret, first)


def _decode(data: bytes, path: Path) -> HeaderKey:
    size = _FILE.size
    if len(data) != size + 4 or crc32(data[:size]) != int.from_bytes(data[size:], "little"):
        raise StorageError(f"{path} is damaged: restore it (no keyed record checks out without)")
    magic, version, first, secret = _FILE.unpack_from(data)
    if magic != _FILE_MAGIC:
        raise StorageError(f"{path} is not a journal key")
    if version > _VERSION:
        raise StorageError(
            f"{path} is of journal format {version}, newer than this SluiceMQ reads "
            f"({_VERSION}): the data directory was written by a newer SluiceMQ; start that one "
            "(this one would read its records as damage)")
    if version != _VERSION:
        raise StorageError(f"{path} is not a journal key of version {_VERSION}")
    return HeaderKey(secret, first)


def _journal_files(directory: Path) -> list[Path]:
    return [p for p in directory.iterdir()
            if parse_segment_name(p.name) is not None or parse_spare_name(p.name) is not None]


def _head(path: Path) -> bytes:
    """The file's first header-sized bytes (fewer if it is shorter; none if unreadable)."""
    try:
        with path.open("rb") as fh:
            return fh.read(HEADER_SIZE)
    except OSError:
        return b""


def _keyed_header(path: Path) -> bool:
    """Does the file start with a header flagged KEYED (its first record, or a spare's stamp)?
    Offset 0 is always written by the journal, never by a sender."""
    head = _head(path)
    return len(head) == HEADER_SIZE and head[:2] == MAGIC and bool(head[3] & KEYED)
