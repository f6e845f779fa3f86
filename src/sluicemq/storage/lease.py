"""A lease on the data directory, for file systems whose locks cannot be trusted.

``<data-dir>/lease`` holds {generation, owner, pid, host, expires}. The master rewrites it (a
temp file renamed over it) every ``renew`` seconds with ``expires`` = now + ``duration``. A
standby may take over only once ``expires`` has passed, and only by creating
``lease-claim-<generation+1>`` with O_EXCL, so that of several standbys exactly one wins.

Fencing: the master trusts its lease only until ``duration - margin`` after the start of its
last successful renewal, on the monotonic clock (which keeps counting while the process is
paused). Past that, `check` ends the process at once (``os._exit``) before the journal writes
anything: the journal calls it before every write, and the renewal thread calls it too. So an
old master that was paused (SIGSTOP, a VM freeze) and wakes after a standby took over never
writes to the journal the new master owns. Wall clocks of the hosts must agree to within
``margin``.

A renewal counts only if its rename lands before the lease it replaces expires (less the
margin): a renewal thread stalled between its owner check and the rename (a slow fsync on
shared storage, a pause) may have let a standby take over meanwhile, and trusting such a late
write would leave two masters; the late renewal gives the lease up instead (`renew_once`). Its
rename may still have replaced the new master's record: a master that finds a record of an
older generation writes its own again rather than stopping, since that older master is fenced.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from sluicemq.storage.lock import LockHolder

log = logging.getLogger("sluicemq.ha")
LEASE_NAME = "lease"
CLAIM_PREFIX = "lease-claim-"
FENCED_EXIT = 75  # the process exit status of a fenced master


class LeaseLock:
    """The lease as the `StoreLock` interface (try_acquire, release, held, current_holder)."""

    def __init__(self, data_dir: Path, duration: float = 10.0, renew: float = 2.0) -> None:
        if not 0 < renew < duration / 2:
            raise ValueError("the lease must be renewed at least twice per lease duration")
        self.path = Path(data_dir) / LEASE_NAME
        self.duration = duration
        self.renew = renew
        self.margin = duration / 4
        self.owner = uuid.uuid4().hex
        self.generation = 0
        self.holder: LockHolder | None = None
        self._valid_until = 0.0  # monotonic
        self._expires = 0.0  # wall clock: when the record last written expires
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def held(self) -> bool:
        return self.holder is not None

    def try_acquire(self) -> bool:
        """Take the lease if it is free or expired; never blocks."""
        if self.held:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        record = self._read()
        if record is not None and float(record["expires"]) > time.time():
            return False
        generation = int(record["generation"]) + 1 if record is not None else 1
        claim = self.path.parent / f"{CLAIM_PREFIX}{generation}"
        try:
            os.close(os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        except FileExistsError:
            return False  # another standby claimed this generation first
        self.generation = generation
        self.holder = LockHolder.me()
        self._write()
        for old in self.path.parent.glob(f"{CLAIM_PREFIX}*"):
            if old != claim:
                with contextlib.suppress(OSError, ValueError):
                    if int(old.name[len(CLAIM_PREFIX):]) < generation:
                        old.unlink()
        self._thread = threading.Thread(target=self._renew_loop, name="sluice-lease",
                                        daemon=True)
        self._thread.start()
        return True

    def check(self) -> None:
        """Exit the process now if the lease may have passed to another broker."""
        if self.held and time.monotonic() > self._valid_until:
            log.critical("lease on %s not renewed in time: another broker may own the journal "
                         "now; stopping without writing", self.path.parent)
            os._exit(FENCED_EXIT)

    def release(self) -> None:
        """Give the lease up at a clean stop (the journal is closed): expires now."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.renew + 5)
        if self.held and self._read_owner() == self.owner:
            self._write(expires=0.0)
        self.holder = None

    def current_holder(self) -> LockHolder | None:
        if self.holder is not None:
            return self.holder
        record = self._read()
        if record is None:
            return None
        return LockHolder(int(record["pid"]), str(record["host"]), float(record["since"]))

    # -- internals ----------------------------------------------------------------------

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.renew):
            self.check()
            if not self.renew_once():
                log.critical("lease on %s was taken by another broker; stopping without "
                             "writing", self.path.parent)
                os._exit(FENCED_EXIT)

    def renew_once(self) -> bool:
        """Renew the lease; False when it may have passed to another broker (the caller stops).

        Lost: the record names another owner of this generation or a later one, or this
        renewal landed too late to count (see the module's docstring). A record of an older
        generation is a fenced master's late write over ours: ours is written again."""
        record = self._read()
        if record is None or record["owner"] != self.owner:
            if record is None or int(record["generation"]) >= self.generation:
                return False
            log.warning("lease on %s: a fenced master (generation %s) wrote over ours "
                        "(generation %s); writing ours again", self.path.parent,
                        record["generation"], self.generation)
        try:
            return self._write(renewal=True)
        except OSError as exc:
            log.error("cannot renew the lease on %s: %s", self.path.parent, exc)
            return True  # not renewed: ``check`` stops the process once the lease runs out

    def _write(self, expires: float | None = None, *, renewal: bool = False) -> bool:
        """Rewrite the record atomically; on success the lease is trusted ``duration -
        margin`` from the start of this write. A ``renewal`` whose rename lands past the
        replaced record's expiry less the margin is not trusted: returns False."""
        started = time.monotonic()
        assert self.holder is not None
        until = time.time() + self.duration if expires is None else expires
        record = {"generation": self.generation, "owner": self.owner, "pid": self.holder.pid,
                  "host": self.holder.host, "since": self.holder.since, "expires": until}
        tmp = self.path.with_name(f".{LEASE_NAME}.{self.owner}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, json.dumps(record).encode() + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        if expires is not None:
            return True
        if renewal and time.time() > self._expires - self.margin:
            return False  # a standby may have taken the lease before this rename landed
        self._valid_until = started + self.duration - self.margin
        self._expires = until
        return True

    def _read(self) -> dict[str, Any] | None:
        try:
            data = json.loads(self.path.read_text() or "null")
        except (OSError, ValueError):
            return None
        if not isinstance(data, dict) or not {"generation", "expires", "owner"} <= set(data):
            return None
        return data

    def _read_owner(self) -> str | None:
        record = self._read()
        return None if record is None else str(record["owner"])
