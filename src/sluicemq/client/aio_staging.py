"""Staged publishing for `AsyncClient`: the blocking client's API (client/staging.py), awaited.

The frames and the reading of their answers are `PartState`'s and the module functions' of
client/staging.py; this module only awaits them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Self

from sluicemq.client.scope import AsyncCommitScope
from sluicemq.client.staging import (
    PartState,
    PublishResult,
    abort_frame,
    discarded,
    publish_frame,
    published,
)

if TYPE_CHECKING:
    from sluicemq.client.aio_conn import AsyncConnection


class AsyncStagedPart(PartState, AsyncCommitScope):
    """One part of a batch: SENDs parked invisibly until the batch is published.

    `async with` begins it (or ``await part.begin()``); a clean exit commits (and waits for
    the RECEIPT: the part is then durable), an exception aborts. ``result`` and ``messages``
    as for the blocking `StagedPart`.
    """

    def __init__(self, client: AsyncConnection, sink: str, batch: str | int,
                 part: str | int) -> None:
        super().__init__(sink, batch, part)
        self.client = client

    async def begin(self) -> Self:
        await self.client._call(self.begin_frame)
        return self

    async def send(self, destination: str, body: bytes | str = b"",
                   headers: Mapping[str, str] | None = None, *,
                   persistent: bool = True) -> None:
        """Add a message to the part (waits only, as a SEND does, while a failover is under
        way and for room in the socket's buffer)."""
        await self.client._wait_up()
        self.client._submit(self.send_frame(destination, body, headers, persistent))
        self.sent += 1
        await self.client.drain()

    async def send_batch(self, destination: str, batch: bytes, count: int,
                         headers: Mapping[str, str] | None = None) -> None:
        """Add ``count`` messages packed as one column batch: one frame for many rows."""
        await self.client._wait_up()
        self.client._submit(self.batch_frame(destination, batch, headers))
        self.sent += count
        await self.client.drain()

    async def commit(self) -> tuple[str, int]:
        """Park the part; returns (result, messages). Raises ClientError when the broker
        stored fewer messages than were sent: the part must be staged again."""
        return self.committed(await self.client._ask(self.commit_frame()))

    async def abort(self) -> None:
        await self.client._call(self.abort_frame())


async def publish_stage(client: AsyncConnection, sink: str, batch: str | int,
                        parts: Iterable[str | int], token: str | None = None) -> PublishResult:
    """Publish exactly ``parts`` of the batch; ("published" | "duplicate", messages), with
    ``.token`` (see `PublishResult`)."""
    return published(await client._ask(publish_frame(sink, batch, parts, token)))


async def abort_stage(client: AsyncConnection, sink: str, batch: str | int) -> int:
    """Discard the batch's parked parts; returns how many there were."""
    return discarded(await client._ask(abort_frame(sink, batch)))
