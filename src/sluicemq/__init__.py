"""SluiceMQ: a STOMP message broker for data of any size.

``Client``, ``AsyncClient`` and ``Message`` load on first use (PEP 562), so importing a part of
the package (the broker, a Spark task) does not import both clients.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from sluicemq.errors import ClientError, ProtocolError, SluiceError, StorageError

if TYPE_CHECKING:
    from sluicemq.client import AsyncClient, Client, Message

__version__ = "0.1.0"

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


def __getattr__(name: str) -> Any:
    if name in ("AsyncClient", "Client", "Message"):
        return getattr(importlib.import_module("sluicemq.client"), name)
    raise AttributeError(f"module 'sluicemq' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
