"""Range reads, head queries and ledger commits for `AsyncClient` (see ``client/ranges.py``).

Back-pressure: while a read holds ``MAX_ITEMS`` messages or ``MAX_BYTES`` its caller has not
taken, the client's reader task stops reading the socket (between reads, never in the middle of
a parsed chunk), so TCP holds the broker back - unless some task waits for a receipt, which may
be queued behind the read's messages.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from sluicemq.client.inbox import Ended
from sluicemq.client.machine import ClientMachine, Outgoing
from sluicemq.client.message import AsyncMessage
from sluicemq.client.ranges import MAX_BYTES, MAX_ITEMS, RangeHead, is_end, parse_end
from sluicemq.errors import ClientError
from sluicemq.protocol import columns

if TYPE_CHECKING:
    from sluicemq.client.aio_conn import AsyncConnection


class _SizedQueue(asyncio.Queue[object]):
    """An unbounded queue that knows how many body bytes it holds."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0

    def _put(self, item: object) -> None:
        if isinstance(item, AsyncMessage):
            self.bytes += len(item.body)
        super()._put(item)

    def _get(self) -> object:
        item = super()._get()
        if isinstance(item, AsyncMessage):
            self.bytes -= len(item.body)
        return item


class AsyncRangeRead:
    """``async for`` the messages of one range read; ``head`` is set once they end."""

    def __init__(self, client: AsyncConnection, sub_id: str, destination: str) -> None:
        self.client = client
        self.id = sub_id
        self.destination = destination
        self.active = True
        self.head: RangeHead | None = None
        self._queue = _SizedQueue()
        self._closed = False

    @property
    def full(self) -> bool:
        return self._queue.qsize() >= MAX_ITEMS or self._queue.bytes >= MAX_BYTES

    def __aiter__(self) -> AsyncRangeRead:
        return self

    async def __anext__(self) -> AsyncMessage:
        while True:
            if self._closed:
                raise StopAsyncIteration
            try:
                item = await asyncio.wait_for(self._queue.get(), self.client.timeout)
            except TimeoutError:
                self._closed = True
                raise ClientError(f"range read of {self.destination}: nothing from the broker "
                                  f"within {self.client.timeout}s") from None
            self.client._room_for_ranges()
            if isinstance(item, AsyncMessage):
                if not is_end(item.headers):
                    return item
                self.head = parse_end(item.headers)
                self._end()
                raise StopAsyncIteration
            if isinstance(item, ClientError) and item.headers.get("subscription") != self.id:
                continue  # an ERROR about something else on this connection
            self._end()
            if isinstance(item, Ended):
                raise item.error or ClientError("the range read ended before its end frame")
            assert isinstance(item, ClientError)
            raise item

    async def batches(self) -> AsyncIterator[columns.Columns]:
        """The column batches of a read opened with ``batch_bytes`` (views into each frame's
        body; ClientError for a frame that is not a well-formed batch)."""
        async for msg in self:
            try:
                yield columns.decode(msg.body)
            except ValueError as exc:
                raise ClientError(f"range read of {self.destination}: {exc}",
                                  dict(msg.headers)) from None

    def _end(self) -> None:
        self._closed = True
        self.active = False
        self.client._subscriptions.pop(self.id, None)

    async def result(self) -> RangeHead:
        """Skip any remaining messages and return the end frame's RangeHead."""
        async for _ in self:
            pass
        assert self.head is not None
        return self.head

    async def close(self) -> None:
        """Stop: an unfinished read is cancelled on the broker, buffered messages dropped."""
        was_active = self.active and not self._closed
        self._end()
        while not self._queue.empty():
            self._queue.get_nowait()
        self.client._room_for_ranges()
        if was_active and self.client.is_open:
            await self.client._call(self._unsubscribe)

    def _unsubscribe(self, machine: ClientMachine) -> Outgoing:
        """Cancel the read, unless its end frame already came (the machine forgot the id)."""
        if self.id in machine.subscriptions:
            return machine.unsubscribe(self.id, receipt=False)
        return Outgoing(b"")

    async def __aenter__(self) -> AsyncRangeRead:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def open_range(client: AsyncConnection, destination: str,
                     headers: dict[str, str]) -> AsyncRangeRead:
    """Send the SUBSCRIBE, wait for its RECEIPT (an ERROR raises), return the reader."""
    out, future = client._submit(lambda m: m.subscribe(destination, headers=headers))
    assert out.ident is not None
    reader = AsyncRangeRead(client, out.ident, destination)
    client._subscriptions[out.ident] = reader
    try:
        await client._settle(future)
    except ClientError:
        client._subscriptions.pop(out.ident, None)
        client._machine.subscriptions.pop(out.ident, None)
        raise
    return reader
