"""`AsyncClient` failover: the asyncio client keeps the blocking client's promises across
kill -9 of the master (unconfirmed SENDs re-sent under their numbers, subscriptions replayed,
open transactions rolled back with a retryable error)."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from ha_helpers import failover_url
from sluicemq.client import AsyncClient
from sluicemq.client.failover import FailoverEvent, TransactionRolledBack
from sluicemq.errors import ClientError

PRODUCERS = 4
PER_PRODUCER = 300
WINDOW = 16


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 90))


def test_async_producers_across_kill_9_lose_nothing_and_store_nothing_twice(cluster) -> None:
    master = cluster.master()
    standby = cluster.standby()
    url = failover_url(master, standby)
    events: list[FailoverEvent] = []

    async def main() -> list[str]:
        receipted: list[str] = []
        quarter = asyncio.Event()
        started = 0

        async def produce(n: int) -> None:
            nonlocal started
            async with await AsyncClient.connect(url, on_failover=events.append) as c:
                window: list[tuple[str, asyncio.Future]] = []
                for i in range(PER_PRODUCER):
                    body = f"a{n}-{i}"
                    window.append((body, c.send_async("/queue/afo", body)))
                    await c.drain()
                    if len(window) >= WINDOW:
                        done, future = window.pop(0)
                        await asyncio.wait_for(future, 30)
                        receipted.append(done)
                    if i == PER_PRODUCER // 4:
                        started += 1
                        if started == PRODUCERS:
                            quarter.set()
                for done, future in window:
                    await asyncio.wait_for(future, 30)
                    receipted.append(done)

        async def kill_at_quarter() -> None:
            await quarter.wait()
            await asyncio.to_thread(master.kill)

        await asyncio.gather(*(produce(n) for n in range(PRODUCERS)), kill_at_quarter())
        return receipted

    receipted = run(main())
    assert len(receipted) == PRODUCERS * PER_PRODUCER
    assert events and all(e.to_url == standby.url for e in events)

    async def drain() -> Counter[str]:
        consumed: Counter[str] = Counter()
        async with await AsyncClient.connect(standby.url) as c:
            count = (await c.head("/queue/afo")).count
            sub = await c.subscribe("/queue/afo", ack="client-individual")
            for _ in range(count):
                msg = await sub.get(10)
                assert msg is not None
                consumed[msg.text()] += 1
                await msg.ack(receipt=True)
            assert (await c.head("/queue/afo")).count == 0
        return consumed

    consumed = run(drain())
    assert set(consumed) == set(receipted)  # nothing lost
    assert max(consumed.values()) == 1  # nothing twice


def test_async_subscription_replay_and_rolled_back_transaction(cluster) -> None:
    master = cluster.master()
    standby = cluster.standby()

    async def main() -> None:
        failed_over = asyncio.Event()
        seen: list[FailoverEvent] = []

        def told(event: FailoverEvent) -> None:
            seen.append(event)
            failed_over.set()

        async with await AsyncClient.connect(failover_url(master, standby),
                                             on_failover=told) as c:
            sub = await c.subscribe("/queue/ares", ack="client-individual", id="a-1")
            tx = await c.transaction().begin()
            await tx.send("/queue/atx", "inside")
            await asyncio.to_thread(master.kill)
            await asyncio.wait_for(failed_over.wait(), 30)
            assert seen[0].resubscribed == 1 and seen[0].rolled_back == (tx.id,)
            with pytest.raises(TransactionRolledBack):
                await tx.commit()
            async with c.transaction() as retry:
                await retry.send("/queue/atx", "inside")
            assert (await c.head("/queue/atx")).count == 1
            await c.send("/queue/ares", "after")
            msg = await sub.get(10)
            assert msg is not None and msg.text() == "after" and msg.subscription == "a-1"
            await msg.ack(receipt=True)

    run(main())


def test_a_reader_that_stops_ends_the_async_client_at_once_naming_why(cluster) -> None:
    """As with the blocking client: the on_failover callback raising ends the client, and
    calls get a ClientError naming the cause instead of waiting out their timeout."""
    master = cluster.master()
    standby = cluster.standby()

    def broken(event: FailoverEvent) -> None:
        raise RuntimeError("a bug in the callback")

    async def main() -> None:
        async with await AsyncClient.connect(failover_url(master, standby), timeout=30,
                                             on_failover=broken) as c:
            await c.send("/queue/astops", "before")
            await asyncio.to_thread(master.kill)
            with pytest.raises(ClientError, match="reader stopped: RuntimeError") as raised:
                await c.send("/queue/astops", "after")
            assert isinstance(raised.value.__cause__, RuntimeError) and not c.is_open
            with pytest.raises(ClientError, match="a bug in the callback"):
                await c.send("/queue/astops", "later")

    run(main())
