"""Spec of the asyncio `AsyncClient` against a real broker process."""

from __future__ import annotations

import asyncio

import pytest

from sluice_testing import async_test
from sluicemq.client import AsyncClient, AsyncMessage
from sluicemq.errors import ClientError


async def next_message(sub, timeout: float = 10.0) -> AsyncMessage:
    message = await sub.get(timeout)
    assert message is not None, "no message arrived in time"
    return message


@async_test
async def test_send_then_receive(broker) -> None:
    async with await AsyncClient.connect(broker.url) as c:
        assert c.version == "1.2"
        await c.send("/queue/a", b"\x01\x02", {"k": "v"})
        sub = await c.subscribe("/queue/a")
        message = await next_message(sub)
    assert (message.body, message.headers["k"], message.destination) == (
        b"\x01\x02", "v", "/queue/a")


@async_test
async def test_pipelined_sends_and_async_iteration(broker) -> None:
    async with await AsyncClient.connect(broker.url) as c:
        await asyncio.gather(*(c.send_async("/queue/pipe", str(i)) for i in range(200)))
        got = []
        async with await c.subscribe("/queue/pipe") as sub:
            async for message in sub:
                got.append(message.text())
                if len(got) == 200:
                    break
    assert got == [str(i) for i in range(200)]


@async_test
async def test_nack_then_ack(broker) -> None:
    async with await AsyncClient.connect(broker.url, version="1.1") as c:
        await c.send("/queue/nack", "again")
        sub = await c.subscribe("/queue/nack", ack="client-individual")
        await (await next_message(sub)).nack()
        second = await next_message(sub)
        assert second.redelivered
        await second.ack()
        assert (await c.head("/queue/nack")).count == 0  # acked, not redelivered again


@async_test
async def test_transactions_commit_and_abort(broker) -> None:
    async with await AsyncClient.connect(broker.url) as c:
        sub = await c.subscribe("/queue/tx")
        async with c.transaction() as tx:
            await tx.send("/queue/tx", "kept")
            await c.send("/queue/tx", "marker")  # sent later, outside the transaction
            assert (await next_message(sub)).text() == "marker"  # FIFO: "kept" was not there
        assert (await next_message(sub)).text() == "kept"
        with pytest.raises(RuntimeError):
            async with c.transaction() as tx:
                await tx.send("/queue/tx", "dropped")
                raise RuntimeError("boom")
        await c.send("/queue/tx", "after")
        assert (await next_message(sub)).text() == "after"  # not "dropped"


@async_test
async def test_durable_subscription_with_client_id(broker) -> None:
    async with await AsyncClient.connect(broker.url, client_id="svc") as c:
        await c.subscribe("/topic/t", durable_name="keep")
    async with await AsyncClient.connect(broker.url) as p:
        await p.send("/topic/t", "while away")
    async with await AsyncClient.connect(broker.url, client_id="svc") as c:
        sub = await c.subscribe("/topic/t", durable_name="keep")
        assert (await next_message(sub)).text() == "while away"


@async_test
async def test_selector(broker) -> None:
    async with await AsyncClient.connect(broker.url) as c:
        sub = await c.subscribe("/queue/sel", selector="kind = 'b'")
        await c.send("/queue/sel", "a", {"kind": "a"})
        await c.send("/queue/sel", "b", {"kind": "b"})
        assert (await next_message(sub)).text() == "b"  # "a", sent before it, was filtered
        await c.send("/queue/sel", "c", {"kind": "b"})
        assert (await next_message(sub)).text() == "c"  # and nothing came in between


@async_test
async def test_broker_errors_raise(broker) -> None:
    async with await AsyncClient.connect(broker.url) as c:
        with pytest.raises(ClientError, match="destination"):
            await c.send("/nowhere/x", "x")
        with pytest.raises(ClientError, match="selector"):
            await c.subscribe("/queue/x", selector="a = = 1")
        await c.send("/queue/x", "still fine")


@async_test
async def test_killed_broker_fails_subscribers_and_senders(broker) -> None:
    c = await AsyncClient.connect(broker.url, heartbeat=(200, 200))
    sub = await c.subscribe("/queue/dying")
    broker.kill()
    with pytest.raises(ClientError):
        await sub.get(5)
    with pytest.raises(ClientError):
        await c.send("/queue/dying", "x")
    await c.disconnect()


@async_test
async def test_connection_refused() -> None:
    with pytest.raises(ClientError, match="cannot connect"):
        await AsyncClient.connect("stomp://127.0.0.1:1", timeout=2)
