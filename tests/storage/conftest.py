"""Fixtures for journal tests: open a journal on a directory and watch its callbacks."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from sluicemq.storage.journal import Journal, Location


class Durability:
    """Collects on_durable / on_failed calls (made on the writer thread) for assertions."""

    def __init__(self, journal: Journal | None = None) -> None:
        self.cond = threading.Condition()
        self.durable: list[int] = []
        self.failed: list[tuple[int, int, BaseException]] = []
        self.locs_missing: list[int] = []
        self.journal = journal

    def on_durable(self, seq: int) -> None:
        with self.cond:
            self.durable.append(seq)
            self.cond.notify_all()

    def on_failed(self, first: int, last: int, exc: BaseException) -> None:
        with self.cond:
            self.failed.append((first, last, exc))
            self.cond.notify_all()

    @property
    def high(self) -> int:
        return self.durable[-1] if self.durable else 0

    def settled(self, seq: int) -> bool:
        return self.high >= seq or any(a <= seq <= b for a, b, _ in self.failed)

    def wait(self, seq: int, timeout: float = 10.0) -> None:
        """Block until seq is durable or failed."""
        with self.cond:
            assert self.cond.wait_for(lambda: self.settled(seq), timeout), f"seq {seq} hung"


@dataclass
class Opened:
    journal: Journal
    records: list[tuple[int, bytes, Location]]
    watch: Durability
    directory: Path = field(default_factory=Path)


@pytest.fixture
def open_journal(tmp_path: Path) -> Iterator[Callable[..., Opened]]:
    """open_journal(directory=None, **journal_kwargs): recovered and started; closed at teardown."""
    opened: list[Journal] = []

    def make(directory: Path | None = None, *, start: bool = True, **kwargs: Any) -> Opened:
        directory = directory or tmp_path / "journal"
        kwargs.setdefault("segment_bytes", 64 << 10)
        journal = Journal(directory, **kwargs)
        opened.append(journal)
        records = [(rtype, bytes(payload), loc) for rtype, payload, loc in journal.recover()]
        watch = Durability(journal)
        if start:
            journal.start(watch.on_durable, watch.on_failed)
        return Opened(journal, records, watch, directory)

    yield make
    for journal in opened:
        journal.close()
