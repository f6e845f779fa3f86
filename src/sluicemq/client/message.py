"""What a subscriber receives: a MESSAGE frame plus the means to ACK or NACK it.

The blocking and asyncio clients hand out `Message` and `AsyncMessage`; they differ only in
whether ack/nack block or are awaited, so the data half is shared.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from sluicemq.protocol.frames import Frame
from sluicemq.protocol.numbers import natural


class HasTransactionId(Protocol):
    """Anything naming a STOMP transaction (both clients' Transaction objects do)."""

    @property
    def id(self) -> str: ...


TransactionRef = str | HasTransactionId


def transaction_id(transaction: TransactionRef | None) -> str | None:
    """Accept either a transaction object or its raw id wherever a transaction is optional."""
    if transaction is None or isinstance(transaction, str):
        return transaction
    return transaction.id


class _Received:
    """The data of one delivered message; immutable by convention."""

    __slots__ = ("ack_id", "ack_mode", "body", "headers", "subscription")

    def __init__(self, frame: Frame, subscription: str, ack_id: str, ack_mode: str) -> None:
        self.headers = frame.headers
        self.body = frame.body
        self.subscription = subscription
        self.ack_id = ack_id
        self.ack_mode = ack_mode

    @property
    def destination(self) -> str:
        return self.headers.get("destination", "")

    @property
    def message_id(self) -> str:
        return self.headers.get("message-id", "")

    @property
    def seq(self) -> int | None:
        """The broker's sequence number (docs/replay-protocol.md, section 1), if it sent one."""
        return natural(self.headers.get("sluice-seq"))

    @property
    def redelivered(self) -> bool:
        return self.headers.get("redelivered", "false").lower() == "true"

    def text(self, encoding: str = "utf-8") -> str:
        return bytes(self.body).decode(encoding)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.destination!r}, id={self.message_id!r}, "
                f"<{len(self.body)} bytes>)")


Acker = Callable[[str, "_Received", str | None, bool], object]
AsyncAcker = Callable[[str, "_Received", str | None, bool], Awaitable[None]]


class Message(_Received):
    """A message from the blocking `Client`; ack/nack write the frame before returning."""

    __slots__ = ("_acker", "epoch")

    def __init__(self, frame: Frame, subscription: str, ack_id: str, ack_mode: str,
                 acker: Acker, epoch: int = 0) -> None:
        super().__init__(frame, subscription, ack_id, ack_mode)
        self._acker = acker
        self.epoch = epoch  # which connection delivered it (a failover starts a new one)

    def ack(self, transaction: TransactionRef | None = None, *, receipt: bool = False) -> None:
        """Acknowledge (a no-op on `auto` subscriptions, where the broker already did).

        ``receipt=True`` waits until the broker has journaled the ACK.
        """
        self._acker("ACK", self, transaction_id(transaction), receipt)

    def nack(self, transaction: TransactionRef | None = None, *, receipt: bool = False) -> None:
        """Refuse: the broker redelivers, or dead-letters after too many attempts."""
        self._acker("NACK", self, transaction_id(transaction), receipt)


class AsyncMessage(_Received):
    """A message from `AsyncClient`; ack/nack are awaited."""

    __slots__ = ("_acker", "epoch")

    def __init__(self, frame: Frame, subscription: str, ack_id: str, ack_mode: str,
                 acker: AsyncAcker, epoch: int = 0) -> None:
        super().__init__(frame, subscription, ack_id, ack_mode)
        self._acker = acker
        self.epoch = epoch  # which connection delivered it (a failover starts a new one)

    async def ack(self, transaction: TransactionRef | None = None, *,
                  receipt: bool = False) -> None:
        """Acknowledge (a no-op on `auto` subscriptions, where the broker already did).

        ``receipt=True`` waits until the broker has journaled the ACK.
        """
        await self._acker("ACK", self, transaction_id(transaction), receipt)

    async def nack(self, transaction: TransactionRef | None = None, *,
                   receipt: bool = False) -> None:
        """Refuse: the broker redelivers, or dead-letters after too many attempts."""
        await self._acker("NACK", self, transaction_id(transaction), receipt)
