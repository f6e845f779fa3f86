"""The Python client library: one sans-IO protocol machine, blocking and asyncio front ends."""

from sluicemq.client.aio import AsyncClient, AsyncSubscription, AsyncTransaction
from sluicemq.client.message import AsyncMessage, Message
from sluicemq.client.sync import Client, Receipt, Subscription, Transaction
from sluicemq.client.url import parse_url

__all__ = [
    "AsyncClient",
    "AsyncMessage",
    "AsyncSubscription",
    "AsyncTransaction",
    "Client",
    "Message",
    "Receipt",
    "Subscription",
    "Transaction",
    "parse_url",
]
