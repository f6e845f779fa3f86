"""What a subscription's queue holds, and how a reader interprets it; shared by both clients.

Besides messages the queue carries two kinds of news from the reader: a broker ERROR that no
receipt claims (raised once, to whoever is reading; the connection may well live on) and the
end of the subscription (sticky, so every later read sees it again).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol, TypeVar

from sluicemq.errors import ClientError

M = TypeVar("M")


class Ended:
    """The subscription is over: cleanly (`error` None) or because the connection failed."""

    __slots__ = ("error",)

    def __init__(self, error: ClientError | None = None) -> None:
        self.error = error


class Receiver(Protocol):
    """What the blocking client's reader thread hands a subscription's news to: a
    ``Subscription`` or a ``RangeRead``."""

    active: bool

    def _deliver(self, item: object) -> None: ...


class AsyncReceiver(Protocol):
    """What the asyncio client's reader puts a subscription's news into: an
    ``AsyncSubscription`` or an ``AsyncRangeRead``."""

    active: bool

    @property
    def _queue(self) -> asyncio.Queue[object]: ...


def take(item: object, requeue: Callable[[object], None], kind: type[M]) -> M | None:
    """Turn a dequeued item into a message, None (ended) or a raised ClientError."""
    if isinstance(item, kind):
        return item
    if isinstance(item, Ended):
        requeue(item)
        if item.error is not None:
            raise item.error
        return None
    if isinstance(item, ClientError):
        raise item
    raise TypeError(f"unexpected item in a subscription queue: {item!r}")
