"""What the asyncio client hands out: subscriptions, transactions and receipts."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Self

from sluicemq.client.inbox import Ended, take
from sluicemq.client.machine import ClientMachine, Outgoing
from sluicemq.client.message import AsyncMessage
from sluicemq.client.producer import DUPLICATE
from sluicemq.client.scope import AsyncCommitScope
from sluicemq.errors import ClientError

if TYPE_CHECKING:
    from sluicemq.client.ports import AsyncPort


class AsyncSubscription:
    """Messages of one SUBSCRIBE; `async for` them or `await get()`."""

    def __init__(self, client: AsyncPort, sub_id: str, destination: str) -> None:
        self.client = client
        self.id = sub_id
        self.destination = destination
        self.active = True
        self._queue: asyncio.Queue[object] = asyncio.Queue()

    async def get(self, timeout: float | None = None) -> AsyncMessage | None:
        """The next message, or None on timeout or once the subscription has ended (a
        ``timeout`` of 0: only what is queued already).

        Raises ClientError for a broker ERROR no call claimed (once) or a dead connection.
        """
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            remaining = None if deadline is None else max(deadline - loop.time(), 0)
            try:
                if remaining == 0:  # wait_for(get(), 0) gives up before looking
                    item = self._queue.get_nowait()
                else:
                    item = await asyncio.wait_for(self._queue.get(), remaining)
            except (TimeoutError, asyncio.QueueEmpty):
                return None
            message = take(item, self._queue.put_nowait, AsyncMessage)
            if message is None or not self.client._track.stale(message.epoch, message.ack_mode):
                return message

    def __aiter__(self) -> AsyncSubscription:
        return self

    async def __anext__(self) -> AsyncMessage:
        message = await self.get()
        if message is None:
            raise StopAsyncIteration
        return message

    async def unsubscribe(self, durable: bool = False) -> None:
        """Stop deliveries; `durable` also deletes a durable subscription on the broker."""
        if not self.active:
            return
        self.active = False
        try:
            await self.client._call(lambda m: m.unsubscribe(self.id, durable=durable))
        finally:
            self.client._forget(self.id)
            self._queue.put_nowait(Ended())

    async def __aenter__(self) -> AsyncSubscription:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.active and self.client.is_open:
            await self.unsubscribe()


class AsyncTransaction(AsyncCommitScope):
    """A STOMP transaction, begun by `async with` (or `begin()`); commit on a clean exit,
    abort on an exception."""

    def __init__(self, client: AsyncPort) -> None:
        self.client = client
        self.id = ""
        self.finished = False

    async def begin(self) -> Self:
        client = self.client

        def begin(m: ClientMachine) -> Outgoing:
            out = m.begin()
            assert out.ident is not None
            client._track.begun(out.ident)
            return out

        out = await client._call(begin)
        assert out.ident is not None
        self.id = out.ident
        return self

    async def send(self, destination: str, body: bytes | str = b"",
                   headers: dict[str, str] | None = None, *, persistent: bool = True,
                   receipt: bool = False) -> None:
        """Send inside the transaction; no receipt by default since COMMIT's receipt covers it."""
        await self.client.send(destination, body, headers, persistent=persistent,
                               receipt=receipt, transaction=self.id)

    async def ack(self, message: AsyncMessage) -> None:
        await message.ack(self.id)

    async def nack(self, message: AsyncMessage) -> None:
        await message.nack(self.id)

    async def commit(self) -> None:
        """COMMIT; raises TransactionRolledBack if a failover lost the transaction (retry)."""
        await self._finish(lambda m: m.commit(self.id), committing=True)

    async def abort(self) -> None:
        """ABORT; after a failover there is nothing left to abort, so it just ends."""
        await self._finish(lambda m: m.abort(self.id), committing=False)

    async def _finish(self, build: Callable[[ClientMachine], Outgoing], *,
                      committing: bool) -> None:
        if not self.id:
            raise ClientError("transaction was never begun")
        if self.finished:
            raise ClientError(f"transaction {self.id} already finished")
        self.finished = True
        client = self.client
        go: list[bool] = []

        def finish(m: ClientMachine) -> Outgoing:
            go.append(client._track.finishing(self.id, committing))  # may raise: rolled back
            return build(m) if go[0] else Outgoing(b"")

        try:
            await client._call(finish)
        except ClientError as exc:
            if committing and go and go[0]:
                raise client._track.commit_failed(self.id, exc, client.is_open) from exc
            raise


class AsyncReceipt(asyncio.Future[dict[str, str]]):
    """The receipt of a SEND: a future of the RECEIPT's headers (what `send_async` returns,
    and `send` once it came), telling ``producer_seq`` (numbered clients: the number to resend
    under) and ``duplicate``."""

    producer_seq: int | None = None  # the number a numbered SEND went out with

    @property
    def duplicate(self) -> bool:
        """The broker had this producer number stored already and dropped this copy (asked of
        a receipt not yet come, raises asyncio.InvalidStateError)."""
        return self.result().get(DUPLICATE) == "true"
