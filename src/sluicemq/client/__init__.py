"""The Python client library: one sans-IO protocol machine, blocking and asyncio front ends."""

from sluicemq.client.aio import AsyncClient, AsyncSubscription, AsyncTransaction
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

__all__ = [
    "AsyncClient",
    "AsyncMessage",
    "AsyncRangeRead",
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
