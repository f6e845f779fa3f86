"""Temp files for non-persistent messages that overflow the memory limit (the file cursor).

Why unlinked files: what spills here is by definition not meant to survive a restart, so the
files are deleted right after creation and vanish with the process (even after kill -9); no
start-up cleanup and no fsync. Space is reclaimed file by file: a file is closed (and its
blocks freed) once every record written to it was read back or discarded and a newer file
has taken over appends.
"""

from __future__ import annotations

import os
import tempfile
import threading
from pathlib import Path

from sluicemq.errors import StorageError

DEFAULT_FILE_BYTES = 32 << 20


class TempStore:
    """Append-only unlinked files with per-file live counts; loop-thread only, synchronous I/O
    (the writes land in the page cache)."""

    def __init__(self, directory: Path, *, file_bytes: int = DEFAULT_FILE_BYTES) -> None:
        self.directory = Path(directory)
        self.file_bytes = file_bytes
        self._fds: dict[int, int] = {}
        self._live: dict[int, int] = {}
        self._sizes: dict[int, int] = {}
        self._active = 0
        self._offset = 0
        self.bytes_used = 0  # bytes in files not yet freed (what the temp limit measures)

    def append(self, payload: bytes) -> tuple[int, int, int]:
        """Write one record; returns (file, offset, length) for `read` and `release`."""
        if not self._fds or (self._offset and self._offset + len(payload) > self.file_bytes):
            self._rotate()
        fd = self._fds[self._active]
        try:
            written = os.pwrite(fd, payload, self._offset)
        except OSError as exc:
            raise StorageError(f"temp store write failed: {exc}") from exc
        if written != len(payload):
            raise StorageError("temp store: short write")
        where = (self._active, self._offset, len(payload))
        self._offset += len(payload)
        self._live[self._active] += 1
        self._sizes[self._active] = self._offset
        self.bytes_used += len(payload)
        return where

    def share(self, file: int) -> bool:
        """One more slot points at a record of ``file`` written before (a topic message
        fanned out to many subscriptions is written once): it is released once more. False
        when the file is gone (its records were all released): write the record anew."""
        if file not in self._fds:
            return False
        self._live[file] += 1
        return True

    def read(self, file: int, offset: int, length: int) -> bytes:
        fd = self._fds.get(file)
        if fd is None:
            raise StorageError(f"temp file {file} is gone")
        data = os.pread(fd, length, offset)
        if len(data) != length:
            raise StorageError(f"temp file {file}: short read at {offset}")
        return data

    def release(self, file: int, count: int = 1) -> None:
        """``count`` records of `file` are no longer needed; free the file when they were the
        last ones."""
        live = self._live.get(file, 0)
        if live < count:
            raise StorageError(f"temp file {file}: release without a record")
        self._live[file] = live - count
        if live == count and file != self._active:
            self._drop(file)

    def _rotate(self) -> None:
        previous = self._active if self._fds else None
        self._active += 1
        self.directory.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix="cursor-", suffix=".tmp", dir=self.directory)
        os.unlink(name)
        self._fds[self._active] = fd
        self._live[self._active] = 0
        self._sizes[self._active] = 0
        self._offset = 0
        if previous is not None and not self._live[previous]:
            self._drop(previous)

    def _drop(self, file: int) -> None:
        # Closing the last descriptor of an unlinked file frees its pages and blocks: ~10 ms
        # for a full file, on the event loop when many subscriptions went at once.
        threading.Thread(target=os.close, args=(self._fds.pop(file),), name="temp-close",
                         daemon=True).start()
        del self._live[file]
        self.bytes_used -= self._sizes.pop(file)

    @property
    def files(self) -> int:
        return len(self._fds)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        self._live.clear()
        self._sizes.clear()
        self.bytes_used = 0
