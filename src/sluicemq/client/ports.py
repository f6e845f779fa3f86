"""What the handles (subscriptions, transactions) need of the client that made them.

The client creates its handles and the handles call back into it; typing them against these
narrow protocols instead of the client classes keeps that a one-way import (no cycle), and
says exactly which of the client's internals a handle may use.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from sluicemq.client.machine import ClientMachine, Outgoing
from sluicemq.client.tracker import Tracker


class SyncPort(Protocol):
    """The blocking client, as its `Subscription` and `Transaction` see it."""

    timeout: float
    _track: Tracker[Any]

    @property
    def is_open(self) -> bool: ...

    def _call(self, build: Callable[[ClientMachine], Outgoing]) -> Outgoing: ...

    def _forget(self, sub_id: str) -> None: ...

    def send(self, destination: str, body: bytes | str = ..., headers: dict[str, str] | None = ...,
             *, persistent: bool = ..., receipt: bool = ..., transaction: Any = ...,
             producer_seq: int | None = ...) -> Any: ...


class AsyncPort(Protocol):
    """The asyncio client, as its `AsyncSubscription` and `AsyncTransaction` see it."""

    timeout: float
    _track: Tracker[Any]

    @property
    def is_open(self) -> bool: ...

    async def _call(self, build: Callable[[ClientMachine], Outgoing]) -> Outgoing: ...

    def _forget(self, sub_id: str) -> None: ...

    async def send(self, destination: str, body: bytes | str = ...,
                   headers: dict[str, str] | None = ..., *, persistent: bool = ...,
                   receipt: bool = ..., transaction: Any = ...) -> Any: ...
