"""Fixtures of the wire-level specs that need more than the suite-wide ``broker``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ha_helpers import Cluster


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """A master/standby pair on one shared data directory (started by each spec as it needs);
    every broker of it is stopped at teardown."""
    c = Cluster(tmp_path / "shared")
    yield c
    c.close()
