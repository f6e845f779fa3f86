"""Pending operations of an open STOMP transaction, kept off the heap until COMMIT or ABORT.

A client may put gigabytes of SENDs inside one BEGIN...COMMIT, and nothing of it may be
delivered before COMMIT, so the broker must park it somewhere other than RAM. Small
transactions (the common case) stay in a bytearray; once they outgrow ``memory_threshold``
they move to an anonymous temporary file that the OS deletes as soon as it is closed, so a
crashed broker leaves no debris and needs no cleanup. The spool is not fsync'd: an open
transaction does not survive a broker restart anyway (STOMP aborts it with the connection).

Entries are ``kind`` (1 byte), payload length (8 bytes, big-endian), payload. Offsets are
the same in memory and on disk, so an iterator started before a spill keeps working after.
The spool owns what its entries hold (``add_send``/``add_ack``, read back by ``operations``):
a SEND is kept as the journal MSG payload it will become, so that a staged part's COMMIT
copies the bytes into the journal without decoding them (``send_payloads``).
"""

from __future__ import annotations

import json
import os
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, NamedTuple, Self

from sluicemq.errors import StorageError
from sluicemq.storage import records
from sluicemq.storage.records import StoredMessage

__all__ = ["DEFAULT_MEMORY_THRESHOLD", "SpooledAck", "StoredMessage", "TxSpool"]

DEFAULT_MEMORY_THRESHOLD = 256 << 10
_SEND, _ACK = 1, 2  # the kinds of entry a session spools: a SEND, an ACK or NACK


class SpooledAck(NamedTuple):
    """An ACK or NACK waiting for COMMIT: the frame headers that say what it acknowledges."""

    headers: dict[str, str]
    nack: bool

_ENTRY = struct.Struct(">BQ")
REPLAY_WINDOW = 1 << 20  # bytes of a spilled spool read at once when replaying it


class TxSpool:
    """Pending operations of one open transaction, appended to an unlinked temp file.

    ``add`` appends, iteration replays in order (as often as needed, one entry in memory at
    a time), ``close`` discards everything and releases the disk space. ``nbytes`` counts
    payload bytes, not framing. Not thread-safe: a transaction belongs to one connection.
    """

    def __init__(
        self,
        directory: Path,
        tx_id: str,
        *,
        memory_threshold: int = DEFAULT_MEMORY_THRESHOLD,
    ) -> None:
        self.directory = Path(directory)
        self.tx_id = tx_id
        self.memory_threshold = memory_threshold
        self.nbytes = 0
        # journal key -> whether a persistent SEND goes there: what the COMMIT must find room
        # for (producer flow control asks at COMMIT, not at each spooled SEND)
        self.targets: dict[str, bool] = {}
        self._count = 0
        self._end = 0
        self._memory: bytearray | None = bytearray()
        self._file: BinaryIO | None = None
        self._appending = False  # the file's position is its end: appends need no seek
        self._closed = False
        self._broken: str | None = None

    # -- state

    @property
    def on_disk(self) -> bool:
        """True once the spool has spilled to its temporary file."""
        return self._file is not None

    @property
    def closed(self) -> bool:
        return self._closed

    def fileno(self) -> int | None:
        """Descriptor of the temporary file, or None while the spool is in memory."""
        return None if self._file is None else self._file.fileno()

    def __len__(self) -> int:
        return self._count

    def __repr__(self) -> str:
        where = "disk" if self.on_disk else "memory"
        state = "closed" if self._closed else where
        return f"TxSpool({self.tx_id!r}, {self._count} ops, {self.nbytes} bytes, {state})"

    # -- writing

    def add(self, kind: int, payload: bytes) -> None:
        """Append one operation; ``kind`` is the caller's tag for it, 0..255."""
        self._check_usable()
        if not 0 <= kind <= 0xFF:
            raise ValueError(f"kind must be in 0..255, got {kind}")
        header = _ENTRY.pack(kind, len(payload))
        size = len(header) + len(payload)
        if self._memory is not None and self._end + size > self.memory_threshold:
            self._spill()
        if self._memory is not None:
            self._memory += header
            self._memory += payload
        else:
            self._write_at(self._end, header, payload)
        self._end += size
        self._count += 1
        self.nbytes += len(payload)

    def add_send(self, key: str, timestamp: int, expires: int, priority: int,
                 headers: dict[str, str], body: bytes, owner: bytes = b"") -> None:
        """A SEND to journal key ``key``, kept as its MSG payload (message id 0: ids are
        given at COMMIT), naming ``owner`` as its sender (a staged part's records do)."""
        self.add(_SEND, records.encode_message(key, 0, timestamp, expires, priority, headers,
                                               body, owner))
        self.targets[key] = self.targets.get(key, False) or headers.get("persistent") == "true"

    def add_ack(self, headers: dict[str, str], nack: bool) -> None:
        """An ACK or NACK, by the headers that name what it acknowledges."""
        self.add(_ACK, json.dumps({"h": headers, "nack": nack}).encode())

    def add_many(self, kind: int, payloads: list[bytes]) -> None:
        """``add`` of many operations of one kind, written together (a column batch)."""
        self._check_usable()
        if not 0 <= kind <= 0xFF:
            raise ValueError(f"kind must be in 0..255, got {kind}")
        pack = _ENTRY.pack
        data = b"".join(b"".join((pack(kind, len(p)), p)) for p in payloads)
        if self._memory is not None and self._end + len(data) > self.memory_threshold:
            self._spill()
        if self._memory is not None:
            self._memory += data
        else:
            self._write_at(self._end, data)
        self._end += len(data)
        self._count += len(payloads)
        self.nbytes += sum(map(len, payloads))

    def clear(self) -> None:
        """Forget every operation (they were taken elsewhere) and free their room."""
        self._check_usable()
        spill, self._file = self._file, None
        if spill is not None:
            spill.close()
        self._memory = bytearray()
        self._appending = False
        self._end = self._count = self.nbytes = 0
        self.targets = {}

    def spill(self) -> None:
        """Move to the temporary file now (the connection holds too much in memory)."""
        self._check_usable()
        if self._memory is not None:
            self._spill()

    def _spill(self) -> None:
        """Move the in-memory entries to an anonymous temporary file that close() releases."""
        assert self._memory is not None
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            spill = tempfile.TemporaryFile(dir=self.directory, prefix=".tx-")  # noqa: SIM115
        except OSError as exc:
            message = f"cannot create transaction spool in {self.directory}: {exc}"
            raise StorageError(message) from exc
        self._file = spill
        self._write_at(0, self._memory)
        try:
            spill.flush()  # the spilled entries leave the process now, not a buffer later
        except OSError as exc:
            self._broken = f"transaction spool write failed: {exc}"
            raise StorageError(self._broken) from exc
        self._memory = None

    def _write_at(self, position: int, *parts: bytes | bytearray) -> None:
        """Write at ``position``; appends at the end skip the seek (a seek flushes the file's
        buffer, which made every spooled message a system call)."""
        assert self._file is not None
        try:
            if not (self._appending and position == self._end):
                self._file.seek(position)
            for part in parts:
                self._file.write(part)
            self._appending = position + sum(map(len, parts)) >= self._end
        except OSError as exc:
            self._broken = f"transaction spool write failed: {exc}"
            raise StorageError(self._broken) from exc

    # -- reading

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        """Replay the operations present when iteration starts, in the order they were added."""
        self._check_usable()
        return self._replay(self._count)

    def operations(self) -> Iterator[StoredMessage | SpooledAck]:
        """Replay the spooled SENDs (as stored messages) and ACKs/NACKs, in order."""
        for kind, payload in self:
            if kind == _SEND:
                yield records.decode_message(payload)
            else:
                entry = json.loads(payload)
                yield SpooledAck(entry["h"], entry["nack"])

    def send_payloads(self) -> Iterator[bytes]:
        """The spooled SENDs' MSG payloads, in order, undecoded (a staged part's records)."""
        for kind, payload in self:
            if kind == _SEND:
                yield payload

    def _replay(self, count: int) -> Iterator[tuple[int, bytes]]:
        if self._file is not None:
            yield from self._replay_file(count)
            return
        position = 0
        for _ in range(count):
            self._check_usable()
            kind, payload, position = self._read_at(position)
            yield kind, payload

    def _replay_file(self, count: int) -> Iterator[tuple[int, bytes]]:
        """Spilled entries through windows of ``REPLAY_WINDOW`` bytes read with ``pread``: no
        seek per entry, and the file's own position (where appends go) is left alone."""
        assert self._file is not None
        try:
            self._file.flush()
        except OSError as exc:
            raise StorageError(f"transaction spool flush failed: {exc}") from exc
        window, base, position = b"", 0, 0
        for _ in range(count):
            self._check_usable()
            at = position - base
            if at + _ENTRY.size > len(window):
                window, base, at = self._window(position, _ENTRY.size), position, 0
            kind, length = _ENTRY.unpack_from(window, at)
            end = at + _ENTRY.size + length
            if position + _ENTRY.size + length > self._end:
                raise StorageError(f"transaction spool corrupt at {position}")
            if end > len(window):
                window, base = self._window(position, _ENTRY.size + length), position
                at, end = 0, _ENTRY.size + length
            yield kind, window[at + _ENTRY.size:end]
            position += _ENTRY.size + length

    def _window(self, position: int, need: int) -> bytes:
        assert self._file is not None
        size = max(need, REPLAY_WINDOW)
        try:
            data = os.pread(self._file.fileno(), min(size, self._end - position), position)
        except OSError as exc:
            raise StorageError(f"transaction spool read failed at {position}: {exc}") from exc
        if len(data) < need:
            raise StorageError(f"transaction spool truncated at {position}")
        return data

    def _read_at(self, position: int) -> tuple[int, bytes, int]:
        self._appending = False
        if self._memory is not None:
            kind, length = _ENTRY.unpack_from(self._memory, position)
            start = position + _ENTRY.size
            with memoryview(self._memory) as view:
                payload = bytes(view[start : start + length])
            return kind, payload, start + length
        assert self._file is not None
        try:
            self._file.seek(position)
            header = self._file.read(_ENTRY.size)
            kind, length = _ENTRY.unpack(header)
            if position + _ENTRY.size + length > self._end:
                raise StorageError(f"transaction spool corrupt at {position}")
            payload = self._file.read(length)
        except (OSError, struct.error) as exc:
            raise StorageError(f"transaction spool read failed at {position}: {exc}") from exc
        if len(payload) != length:
            raise StorageError(f"transaction spool truncated at {position}")
        return kind, payload, position + _ENTRY.size + length

    # -- lifetime

    def close(self) -> None:
        """Discard every pending operation and free its memory or disk space; idempotent."""
        self._closed = True
        self._memory = None
        spill, self._file = self._file, None
        if spill is not None:
            spill.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _check_usable(self) -> None:
        if self._closed:
            raise ValueError(f"transaction spool {self.tx_id!r} is closed")
        if self._broken is not None:
            raise StorageError(self._broken)
