"""Spec of range reads, head queries and commits with the asyncio `AsyncClient`."""

from __future__ import annotations

import asyncio

import pytest

from sluice_testing import async_test
from sluicemq.client import AsyncClient
from sluicemq.client.aio import READ_CHUNK
from sluicemq.client.ranges import MAX_BYTES
from sluicemq.errors import ClientError


async def fill(c: AsyncClient, destination: str, n: int, size: int = 10) -> None:
    for i in range(n):
        c.send_async(destination, str(i).encode().ljust(size, b"."))
    await c.send(destination, b"last")


@async_test
async def test_head_read_and_commit_awaited(broker) -> None:
    async with await AsyncClient.connect(broker.url) as c:
        await fill(c, "/queue/aq", 9)
        h = await c.head("/queue/aq", splits=2)
        assert h.count == 10 and len(h.splits) == 1
        async with await c.read_range("/queue/aq", h.first, h.splits[0]) as rng:
            seqs = [m.seq async for m in rng]
        assert len(seqs) == 5 and seqs == sorted(seqs) and rng.head is not None
        done = await c.commit_upto("/queue/aq", h.splits[0], ledger="L")
        assert done.count == 5 and done.committed == h.splits[0]
        with pytest.raises(ClientError, match="already committed by ledger L"):
            await c.read_range("/queue/aq", h.first, ledger="L")
        assert (await c.head("/queue/aq", ledger="L")).count == 5


@async_test
async def test_a_slow_async_reader_holds_the_socket_not_memory(broker_factory) -> None:
    b = broker_factory(config_text="[limits]\nheartbeat_ms = 1000\n")  # dead after 2 s silent
    async with await AsyncClient.connect(b.url) as producer:  # no fast heart-beats for that
        await fill(producer, "/queue/slow", 599, 64 << 10)  # 38 MiB
    async with await AsyncClient.connect(b.url, heartbeat=(1000, 1000)) as c:
        async with await c.read_range("/queue/slow") as rng:
            first = await rng.__anext__()
            await asyncio.sleep(3.0)  # heart-beats lapse unread: the connection must live
            held = rng._queue.bytes
            await c.send("/queue/other", b"a receipt behind the range")  # no deadlock
            rest = [m async for m in rng]
        assert first.seq is not None and len(rest) == 599
        assert held <= MAX_BYTES + READ_CHUNK  # it stops between socket reads
        assert (await c.head("/queue/slow")).count == 600


@async_test
async def test_column_batches_are_read_as_the_per_message_form_is(broker) -> None:
    async with await AsyncClient.connect(broker.url) as c:
        await fill(c, "/queue/acols", 99, size=300)
        async with await c.read_range("/queue/acols") as rng:
            expect = [(m.seq, bytes(m.body)) async for m in rng]
        async with await c.read_range("/queue/acols", batch_bytes=4096) as rng:
            batches = [b async for b in rng.batches()]
            head = rng.head
        got = [(seq, b.body_of(i)) for b in batches for i, seq in enumerate(b.seq)]
        assert got == expect and len(got) == 100
        assert len(batches) > 1 and head is not None and head.count == 100
