"""Specification of the transaction spool (storage/txspool.py): tx content off the heap."""

from __future__ import annotations

import gc
import os
import re
from pathlib import Path

import pytest

from sluicemq.errors import StorageError
from sluicemq.storage import records
from sluicemq.storage.txspool import (
    DEFAULT_MEMORY_THRESHOLD,
    SpooledAck,
    StoredMessage,
    TxSpool,
)

ENTRY_OVERHEAD = 9  # kind byte + 8-byte length
PROC_FD = Path("/proc/self/fd")
needs_proc = pytest.mark.skipif(not PROC_FD.is_dir(), reason="needs Linux /proc")


def files_open_under(directory: Path) -> list[str]:
    """Targets of this process's descriptors inside ``directory`` (unlinked files included)."""
    prefix = f"{directory}/"
    targets = []
    for fd in os.listdir(PROC_FD):
        try:
            target = os.readlink(PROC_FD / fd)
        except OSError:
            continue
        if target.startswith(prefix):
            targets.append(target)
    return targets


def rss_bytes() -> int:
    status = Path("/proc/self/status").read_text()
    match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
    assert match is not None
    return int(match.group(1)) * 1024


# ---------------------------------------------------------------- in memory

@needs_proc
def test_small_transaction_stays_in_memory(tmp_path: Path) -> None:
    spool = TxSpool(tmp_path, "tx-1")
    spool.add(1, b"hello")
    spool.add(2, b"world")
    assert not spool.on_disk
    assert spool.fileno() is None
    assert files_open_under(tmp_path) == []
    assert os.listdir(tmp_path) == []
    assert list(spool) == [(1, b"hello"), (2, b"world")]


def test_counts_operations_and_payload_bytes(tmp_path: Path) -> None:
    spool = TxSpool(tmp_path, "tx-1")
    assert len(spool) == 0
    assert spool.nbytes == 0
    assert list(spool) == []
    spool.add(0, b"abc")
    spool.add(255, b"")
    assert len(spool) == 2
    assert spool.nbytes == 3
    assert spool.tx_id == "tx-1"


def test_default_threshold_is_256_kib() -> None:
    assert DEFAULT_MEMORY_THRESHOLD == 256 << 10


def test_threshold_counts_framing_and_is_inclusive(tmp_path: Path) -> None:
    spool = TxSpool(tmp_path, "tx", memory_threshold=100)
    spool.add(1, b"x" * (100 - ENTRY_OVERHEAD))
    assert not spool.on_disk
    spool.add(1, b"")  # one more entry header crosses the threshold
    assert spool.on_disk


def test_directory_is_created_only_when_spilling(tmp_path: Path) -> None:
    directory = tmp_path / "spool" / "tx"
    spool = TxSpool(directory, "tx", memory_threshold=10)
    spool.add(1, b"1")
    assert not directory.exists()
    spool.add(1, b"22")
    assert directory.is_dir()
    spool.close()


# ---------------------------------------------------------------- on disk

@needs_proc
def test_large_transaction_spills_to_an_unlinked_file(tmp_path: Path) -> None:
    spool = TxSpool(tmp_path, "tx-big", memory_threshold=1024)
    spool.add(1, b"a" * 1000)
    assert files_open_under(tmp_path) == []
    spool.add(1, b"b" * 1000)
    assert spool.on_disk
    assert len(files_open_under(tmp_path)) == 1
    assert os.listdir(tmp_path) == []  # nothing left behind even if the broker is killed
    fileno = spool.fileno()
    assert fileno is not None
    assert os.fstat(fileno).st_size >= 1000 + ENTRY_OVERHEAD  # what was in memory moved out


def test_replay_is_exact_and_in_order_across_the_spill(tmp_path: Path) -> None:
    spool = TxSpool(tmp_path, "tx", memory_threshold=4096)
    expected = [(i % 7, os.urandom(i * 37 % 3000)) for i in range(200)]
    for kind, payload in expected:
        spool.add(kind, payload)
    assert spool.on_disk
    assert list(spool) == expected
    assert len(spool) == 200
    assert spool.nbytes == sum(len(payload) for _, payload in expected)


def test_spool_can_be_replayed_many_times(tmp_path: Path) -> None:
    spool = TxSpool(tmp_path, "tx", memory_threshold=64)
    for i in range(50):
        spool.add(3, str(i).encode() * 10)
    first = list(spool)
    assert list(spool) == first
    assert [kind for kind, _ in spool] == [3] * 50


def test_iteration_sees_the_operations_present_when_it_started(tmp_path: Path) -> None:
    """Adding while replaying (and spilling in between) neither corrupts nor extends it."""
    spool = TxSpool(tmp_path, "tx", memory_threshold=256)
    spool.add(1, b"one")
    spool.add(2, b"two")
    replay = iter(spool)
    assert next(replay) == (1, b"one")
    spool.add(3, b"x" * 1000)  # spills to disk mid-iteration
    assert spool.on_disk
    assert list(replay) == [(2, b"two")]
    assert list(spool) == [(1, b"one"), (2, b"two"), (3, b"x" * 1000)]


def test_interleaved_iterators_are_independent(tmp_path: Path) -> None:
    spool = TxSpool(tmp_path, "tx", memory_threshold=0)
    for i in range(10):
        spool.add(i, bytes([i]) * 100)
    left, right = iter(spool), iter(spool)
    pairs = list(zip(left, right, strict=True))
    assert all(a == b for a, b in pairs)
    assert [kind for (kind, _), _ in pairs] == list(range(10))


# ---------------------------------------------------------------- close and errors

@needs_proc
def test_close_frees_the_file_and_forbids_further_use(tmp_path: Path) -> None:
    spool = TxSpool(tmp_path, "tx", memory_threshold=0)
    spool.add(1, b"payload")
    assert len(files_open_under(tmp_path)) == 1
    spool.close()
    assert files_open_under(tmp_path) == []
    assert spool.closed
    assert not spool.on_disk
    with pytest.raises(ValueError, match="closed"):
        spool.add(1, b"more")
    with pytest.raises(ValueError, match="closed"):
        list(spool)
    spool.close()  # idempotent


def test_closing_stops_a_replay_in_progress(tmp_path: Path) -> None:
    spool = TxSpool(tmp_path, "tx")
    spool.add(1, b"a")
    spool.add(1, b"b")
    replay = iter(spool)
    next(replay)
    spool.close()
    with pytest.raises(ValueError, match="closed"):
        next(replay)


@needs_proc
def test_context_manager_closes(tmp_path: Path) -> None:
    with TxSpool(tmp_path, "tx", memory_threshold=0) as spool:
        spool.add(1, b"x")
        assert files_open_under(tmp_path)
    assert spool.closed
    assert files_open_under(tmp_path) == []


@pytest.mark.parametrize("kind", [-1, 256])
def test_kind_must_fit_one_byte(tmp_path: Path, kind: int) -> None:
    spool = TxSpool(tmp_path, "tx")
    with pytest.raises(ValueError, match="kind"):
        spool.add(kind, b"")
    assert len(spool) == 0


def test_unusable_directory_is_a_storage_error(tmp_path: Path) -> None:
    not_a_directory = tmp_path / "file"
    not_a_directory.write_bytes(b"")
    spool = TxSpool(not_a_directory / "spool", "tx", memory_threshold=0)
    with pytest.raises(StorageError, match="cannot create transaction spool"):
        spool.add(1, b"x")


# ---------------------------------------------------------------- memory bound

@needs_proc
def test_fifty_megabyte_transaction_keeps_rss_flat(tmp_path: Path) -> None:
    """50 MiB of SENDs costs the process a few MiB of RSS, both when added and replayed."""
    chunk = os.urandom(1 << 20)
    slack = 16 << 20
    gc.collect()
    baseline = rss_bytes()
    with TxSpool(tmp_path, "tx-50m") as spool:
        for i in range(50):
            spool.add(i % 2, chunk)
        assert spool.nbytes == 50 << 20
        assert rss_bytes() - baseline < slack
        peak = 0
        replayed = 0
        for kind, payload in spool:
            assert kind == replayed % 2
            assert payload == chunk
            replayed += 1
            peak = max(peak, rss_bytes() - baseline)
            del payload
        assert replayed == 50
        assert peak < slack


def test_a_spilled_spool_takes_batches_and_replays_them_between_appends(tmp_path: Path) -> None:
    """add_many writes a batch in one go; replaying (COMMIT reads it back) does not disturb
    where later appends go, and entries larger than a replay window come back whole."""
    spool = TxSpool(tmp_path, "tx", memory_threshold=1024)
    first = [os.urandom(100) for _ in range(50)]
    spool.add_many(3, first)
    assert spool.on_disk
    assert list(spool) == [(3, p) for p in first]
    big = os.urandom(3 << 20)  # beyond one 1 MiB replay window
    spool.add(4, big)
    spool.add_many(5, [b"x", b""])
    assert list(spool) == [(3, p) for p in first] + [(4, big), (5, b"x"), (5, b"")]
    assert len(spool) == 53 and spool.nbytes == 5000 + len(big) + 1


# ---------------------------------------------------------------- what a session spools

def test_sends_and_acks_come_back_in_order_as_messages_and_acknowledgements(
        tmp_path: Path) -> None:
    """The spool owns its entries' format: a session hands over a SEND's parts or an ACK's
    headers and gets them back at COMMIT, never building bytes itself."""
    spool = TxSpool(tmp_path, "tx", memory_threshold=64)  # spills on the way: same answers
    spool.add_send("q:orders", 1700, 0, 4, {"destination": "/queue/orders"}, b"one")
    spool.add_ack({"id": "1-7"}, nack=False)
    spool.add_send("t:prices", 1701, 99, 9, {"destination": "/topic/prices"}, b"two")
    spool.add_ack({"message-id": "ID:x", "subscription": "s"}, nack=True)
    assert spool.on_disk
    first, ack, second, nack = spool.operations()
    assert isinstance(first, StoredMessage) and isinstance(second, StoredMessage)
    assert (first.key, first.mid, first.timestamp, first.expires, first.priority) == \
        ("q:orders", 0, 1700, 0, 4)
    assert (first.headers, bytes(first.body)) == ({"destination": "/queue/orders"}, b"one")
    assert (second.key, second.expires, second.priority, bytes(second.body)) == \
        ("t:prices", 99, 9, b"two")
    assert ack == SpooledAck({"id": "1-7"}, False)
    assert nack == SpooledAck({"message-id": "ID:x", "subscription": "s"}, True)


def test_a_spooled_send_is_the_journal_payload_a_staged_part_copies(tmp_path: Path) -> None:
    """A staged part's COMMIT writes the SENDs' payloads into the journal undecoded."""
    spool = TxSpool(tmp_path, "tx")
    spool.add_send("q:sink", 5, 0, 4, {"persistent": "true"}, b"row")
    spool.add_ack({"id": "1-1"}, nack=False)  # not a SEND: not part of the payloads
    assert list(spool.send_payloads()) == [
        records.encode_message("q:sink", 0, 5, 0, 4, {"persistent": "true"}, b"row")]
