"""The Python client library: one sans-IO protocol machine, blocking and asyncio front ends.

The names below load on first use (PEP 562): a program that needs only the blocking client (a
Spark task, the CLI) does not import the asyncio one.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sluicemq.client.aio import (
        AsyncClient,
        AsyncReceipt,
        AsyncStagedPart,
        AsyncSubscription,
        AsyncTransaction,
    )
    from sluicemq.client.aio_ranges import AsyncRangeRead
    from sluicemq.client.aio_streams import (
        AsyncStreamReader,
        AsyncStreamSubscription,
        AsyncStreamWriter,
    )
    from sluicemq.client.message import AsyncMessage, Message
    from sluicemq.client.ranges import RangeHead, RangeRead
    from sluicemq.client.streams import StreamReader, StreamSubscription, StreamWriter
    from sluicemq.client.sync import Client, Receipt, Subscription, Transaction
    from sluicemq.client.url import parse_url
    from sluicemq.streaming.errors import (
        NoConsumerError,
        StreamAbandonedError,
        StreamGapError,
        StreamIntegrityError,
        StreamProtocolError,
    )

_WHERE = {
    "AsyncClient": "aio", "AsyncReceipt": "aio", "AsyncStagedPart": "aio",
    "AsyncSubscription": "aio", "AsyncTransaction": "aio",
    "AsyncRangeRead": "aio_ranges", "AsyncStreamReader": "aio_streams",
    "AsyncStreamSubscription": "aio_streams", "AsyncStreamWriter": "aio_streams",
    "AsyncMessage": "message", "Message": "message", "RangeHead": "ranges",
    "RangeRead": "ranges", "StreamReader": "streams", "StreamSubscription": "streams",
    "StreamWriter": "streams", "Client": "sync", "Receipt": "sync", "Subscription": "sync",
    "Transaction": "sync", "parse_url": "url",
}
_ERRORS = ("NoConsumerError", "StreamAbandonedError", "StreamGapError", "StreamIntegrityError",
           "StreamProtocolError")


def __getattr__(name: str) -> Any:
    if name in _ERRORS:
        return getattr(importlib.import_module("sluicemq.streaming.errors"), name)
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'sluicemq.client' has no attribute {name!r}")
    return getattr(importlib.import_module(f"sluicemq.client.{where}"), name)


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "AsyncClient",
    "AsyncMessage",
    "AsyncRangeRead",
    "AsyncReceipt",
    "AsyncStagedPart",
    "AsyncStreamReader",
    "AsyncStreamSubscription",
    "AsyncStreamWriter",
    "AsyncSubscription",
    "AsyncTransaction",
    "Client",
    "Message",
    "NoConsumerError",
    "RangeHead",
    "RangeRead",
    "Receipt",
    "StreamAbandonedError",
    "StreamGapError",
    "StreamIntegrityError",
    "StreamProtocolError",
    "StreamReader",
    "StreamSubscription",
    "StreamWriter",
    "Subscription",
    "Transaction",
    "parse_url",
]
