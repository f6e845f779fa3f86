"""SluiceMQ: a STOMP message broker for data of any size."""

__version__ = "0.1.0"

from sluicemq.client import AsyncClient, Client, Message
from sluicemq.errors import ClientError, ProtocolError, SluiceError, StorageError

__all__ = [
    "AsyncClient",
    "Client",
    "ClientError",
    "Message",
    "ProtocolError",
    "SluiceError",
    "StorageError",
    "__version__",
]
