"""The data directory's exclusive lock: who may open the journal (shared-storage master/standby).

A POSIX record lock (``fcntl.lockf``) on ``<data-dir>/lock``: the kernel (or the NFS v4 server)
drops it when the holding process dies in any way, kill -9 included, so a standby learns it may
take over without trusting any timestamp. The holder writes its pid, host and start time into
the file so that a standby (and ``/api/health``) can tell who serves.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path

LOCK_NAME = "lock"


@dataclass(frozen=True, slots=True)
class LockHolder:
    """What the master wrote into the lock file when it took it."""

    pid: int
    host: str
    since: float  # wall clock (time.time()) of the takeover

    @classmethod
    def me(cls) -> LockHolder:
        return cls(os.getpid(), socket.gethostname(), time.time())


class StoreLock:
    """Try-lock on ``<data_dir>/lock``; held until `release()` or the death of the process."""

    def __init__(self, data_dir: Path) -> None:
        self.path = Path(data_dir) / LOCK_NAME
        self._fd: int | None = None
        self.holder: LockHolder | None = None  # set while we hold it

    @property
    def held(self) -> bool:
        return self._fd is not None

    def try_acquire(self) -> bool:
        """Take the lock if nobody holds it (never blocks); on success record who we are."""
        if self._fd is not None:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EACCES, errno.EAGAIN):
                return False
            raise
        holder = LockHolder.me()
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(asdict(holder)).encode() + b"\n", 0)
        os.fsync(fd)
        self._fd = fd
        self.holder = holder
        return True

    def release(self) -> None:
        """Give the lock up (after the journal is closed): a standby may take over now."""
        fd, self._fd = self._fd, None
        self.holder = None
        if fd is None:
            return
        with contextlib.suppress(OSError):
            fcntl.lockf(fd, fcntl.LOCK_UN)
        os.close(fd)

    def current_holder(self) -> LockHolder | None:
        """Who the lock file names (ours when held; else the last master, possibly dead)."""
        if self.holder is not None:
            return self.holder
        try:
            data = json.loads(self.path.read_text() or "null")
            return LockHolder(int(data["pid"]), str(data["host"]), float(data["since"]))
        except (OSError, ValueError, TypeError, KeyError):
            return None
