"""Ledgers: named, durable "done up to here" positions on queues and durable subscriptions.

Why a file of its own and not journal records: a ledger is a few bytes that change once per
committed batch (a Spark micro-batch), not per message, and it must outlive any compaction
or snapshot of the journal. Keeping it out of the journal means compaction, the index
snapshot and replay need not know about it. The file (``<data-dir>/ledgers.json``) is
rewritten whole and atomically (write a temp file, fsync, rename, fsync the directory), so
after a kill -9 it is either the old or the new version, never a torn one.

Order on commit: the removals (ACK records) are made durable first, then the ledger moves.
A crash in between leaves the ledger behind its messages' removal, which only means a reader
restarting from its own checkpoint is not told its range is gone; the opposite order could
claim a position whose messages are still there.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

log = logging.getLogger("sluicemq.ledgers")

FILE_NAME = "ledgers.json"


class LedgerBook:
    """Every ledger of a broker: ``{queue key: {ledger name: position}}``, loaded lazily."""

    def __init__(self, data_dir: Path) -> None:
        self.path = Path(data_dir) / FILE_NAME
        self._positions: dict[str, dict[str, int]] | None = None

    def _load(self) -> dict[str, dict[str, int]]:
        if self._positions is not None:
            return self._positions
        try:
            raw = json.loads(self.path.read_text())
            positions = {str(key): {str(n): int(p) for n, p in names.items()}
                         for key, names in raw["ledgers"].items()}
        except FileNotFoundError:
            positions = {}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            bad = self.path.with_suffix(".bad")
            log.error("ledger file %s is unreadable (%s): kept as %s, ledgers start at 0",
                      self.path, exc, bad)
            os.replace(self.path, bad)
            positions = {}
        self._positions = positions
        return positions

    def position(self, key: str, name: str) -> int:
        """Where ledger ``name`` of queue ``key`` stands (0 for a new ledger)."""
        return self._load().get(key, {}).get(name, 0)

    def advance(self, key: str, name: str, upto: int) -> int:
        """Move the ledger to ``upto`` (never backwards) and make it durable; its position."""
        positions = self._load()
        current = positions.get(key, {}).get(name, 0)
        if upto <= current:
            return current
        positions.setdefault(key, {})[name] = upto
        self._save(positions)
        return upto

    def _save(self, positions: dict[str, dict[str, int]]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w") as fh:
            json.dump({"version": 1, "ledgers": positions}, fh, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)
        fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
