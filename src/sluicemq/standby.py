"""Master or standby: wait for the data directory's lock before touching the journal.

Several brokers may share one data directory (a SAN, NFS v4, a re-attachable cloud volume).
The one holding the lock (storage/lock.py) is the master and serves; the others stand by,
retrying every ``[ha] lock_retry`` seconds, reading nothing but the lock file and listening on
nothing (or, with ``[ha] standby_health``, only on the console port for ``/api/health``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sluicemq.config import HaSettings
from sluicemq.storage.lease import LeaseLock
from sluicemq.storage.lock import StoreLock

log = logging.getLogger("sluicemq.ha")


@dataclass(slots=True)
class HaState:
    """This process's role, since when, and the lock that decides it."""

    lock: StoreLock | LeaseLock
    role: str = "standby"  # standby -> master
    since: float = field(default_factory=time.time)

    def health(self) -> dict[str, Any]:
        """The body of ``/api/health``: role, since when, and who holds the lock."""
        holder = self.lock.current_holder()
        return {
            "status": "ok",
            "role": self.role,
            "since": self.since,
            "data_dir": str(self.lock.path.parent),
            "lock": {"path": str(self.lock.path),
                     "kind": "lease" if isinstance(self.lock, LeaseLock) else "kernel",
                     "held_by_me": self.lock.held,
                     "pid": holder.pid if holder else None,
                     "host": holder.host if holder else None,
                     "since": holder.since if holder else None},
        }


async def wait_for_lock(state: HaState, retry: float, stopped: asyncio.Event) -> bool:
    """Take the lock, standing by (one log line) while another process holds it.

    Returns False when asked to stop before the lock was ours.
    """
    if state.lock.try_acquire():
        state.role, state.since = "master", time.time()
        return True
    holder = state.lock.current_holder()
    who = f"pid {holder.pid} on {holder.host}" if holder else "another process"
    print(f"sluice: standby: {state.lock.path} is held by {who}; retrying every {retry}s",
          flush=True)
    while not stopped.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopped.wait(), retry)
        if stopped.is_set():
            return False
        if not state.lock.try_acquire():
            log.debug("lock still held; retrying in %ss", retry)
            continue
        waited = time.time() - state.since
        state.role, state.since = "master", time.time()
        print(f"sluice: lock taken after {waited:.3f}s standing by; taking over as master",
              flush=True)
        return True
    return False


class StandbyHealth:
    """A console port that answers only ``/api/health`` (role: standby) while we wait."""

    def __init__(self, state: HaState) -> None:
        self.state = state
        self._runner: Any = None

    async def start(self, host: str, port: int) -> tuple[str, int]:
        from aiohttp import web

        async def health(request: web.Request) -> web.Response:
            return web.json_response(self.state.health())

        app = web.Application()
        app.router.add_get("/api/health", health)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False,
                                     shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, reuse_address=True)
        await site.start()
        bound = self._runner.addresses[0]
        return str(bound[0]), int(bound[1])

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


def data_lock(data_dir: Path, ha: HaSettings | None = None) -> HaState:
    """The standby state for a data directory (the lock or lease is not tried yet)."""
    if ha is not None and ha.lock == "lease":
        return HaState(LeaseLock(data_dir, ha.lease_seconds, ha.lease_renew))
    return HaState(StoreLock(data_dir))
