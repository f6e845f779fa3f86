"""Fixtures for admin specs: a JSON client for the console of the `broker` fixture."""

from __future__ import annotations

import pytest
from console_client import ConsoleClient


@pytest.fixture
def console(broker) -> ConsoleClient:
    assert broker.console_url, broker.log()
    return ConsoleClient(broker.console_url)
