"""Spec of staged publishing and duplicate detection with the asyncio `AsyncClient`, against a
real broker process: the blocking client's API (tests/e2e/test_staging.py, test_dedup.py),
awaited - parts durable and invisible until published, publication atomic, ordered and once."""

from __future__ import annotations

import json
import os
import signal

import pytest

from sluice_testing import async_test, held_async
from sluicemq.client import AsyncClient
from sluicemq.errors import ClientError
from sluicemq.protocol.columns import ColumnWriter


async def stage(c: AsyncClient, batch: str, part: str, bodies: list[str],
                dest: str = "/queue/out") -> None:
    async with c.stage("sink", batch, part) as p:
        for body in bodies:
            await p.send(dest, body.encode(), {"part": part})
    assert (p.result, p.messages) == ("staged", len(bodies))


async def visible(c: AsyncClient, dest: str = "/queue/out") -> list[bytes]:
    """What a browser sees (a range read of everything retained)."""
    async with await c.read_range(dest) as rng:
        return [m.body async for m in rng]


@async_test
async def test_a_parked_part_is_invisible_until_published_in_part_then_send_order(
        broker) -> None:
    async with await AsyncClient.connect(broker.url) as c:
        await stage(c, "b1", "p0", ["a0", "a1"])
        await stage(c, "b1", "p1", ["b0"])
        await stage(c, "b1", "p2", ["c0"])
        assert await visible(c) == [] and (await c.head("/queue/out")).count == 0
        assert await c.publish_stage("sink", "b1", ["p2", "p0"]) == ("published", 3)
        assert await held_async(c, "/queue/out") == [b"c0", b"a0", b"a1"]  # p1 is gone


@async_test
async def test_publishing_again_is_a_duplicate_with_the_first_token(broker) -> None:
    async with await AsyncClient.connect(broker.url) as c:
        await stage(c, "b1", "p0", ["x"])
        first = await c.publish_stage("sink", "b1", ["p0"], token="mine")
        assert (first, first.result, first.messages, first.token) == (
            ("published", 1), "published", 1, "mine")
        async with c.stage("sink", "b1", "p1") as p:  # a part of a published batch
            await p.send("/queue/out", b"late")
        assert (p.result, p.messages) == ("duplicate", 0)
        again = await c.publish_stage("sink", "b1", ["p0"], token="theirs")
        assert (again, again.token) == (("duplicate", 1), "mine")
        assert await held_async(c, "/queue/out") == [b"x"]


@async_test
async def test_an_unknown_part_is_an_error_and_nothing_is_published(broker) -> None:
    async with await AsyncClient.connect(broker.url) as c:
        await stage(c, "b1", "p0", ["x"])
        with pytest.raises(ClientError, match="no part p9"):
            await c.publish_stage("sink", "b1", ["p0", "p9"])
        assert await visible(c) == []
        assert await c.publish_stage("sink", "b1", ["p0"]) == ("published", 1)  # p0 was kept


@async_test
async def test_abort_stage_discards_the_batch(broker) -> None:
    async with await AsyncClient.connect(broker.url) as c:
        await stage(c, "b1", "p0", ["x"])
        await stage(c, "b1", "p1", ["y"])
        assert await c.abort_stage("sink", "b1") == 2
        with pytest.raises(ClientError, match="no part p0"):
            await c.publish_stage("sink", "b1", ["p0"])
        assert await c.abort_stage("sink", "b1") == 0


@async_test
async def test_an_exception_inside_the_block_aborts_the_part_and_a_retry_replaces_it(
        broker) -> None:
    async with await AsyncClient.connect(broker.url) as c:
        with pytest.raises(RuntimeError):
            async with c.stage("sink", "b1", "p0") as p:
                await p.send("/queue/out", b"half")
                raise RuntimeError("task failed")
        assert p.finished and p.result is None
        with pytest.raises(ClientError, match="no part p0"):
            await c.publish_stage("sink", "b1", ["p0"])
        await stage(c, "b1", "p0", ["attempt-1"])
        await stage(c, "b1", "p0", ["attempt-2a", "attempt-2b"])
        assert await c.publish_stage("sink", "b1", ["p0"]) == ("published", 2)
        assert await held_async(c, "/queue/out") == [b"attempt-2a", b"attempt-2b"]


@async_test
async def test_a_send_the_broker_refused_makes_the_parts_commit_fail_loudly(broker) -> None:
    async with await AsyncClient.connect(broker.url) as c:
        with pytest.raises(ClientError, match="stored 1 of 2"):
            async with c.stage("sink", "b1", "p0") as p:
                await p.send("/queue/fine", b"ok")
                await p.send("/queue/bad name", b"refused")  # ERROR: invalid destination
        with pytest.raises(ClientError, match="already finished"):
            await p.send("/queue/fine", b"too late")


@async_test
async def test_a_part_is_begun_before_it_takes_a_send(broker) -> None:
    async with await AsyncClient.connect(broker.url) as c:
        part = c.stage("sink", "b1", "p0")
        with pytest.raises(ClientError, match="never begun"):
            await part.send("/queue/out", b"x")
        await part.begin()
        await part.send("/queue/out", b"x")
        assert await part.commit() == ("staged", 1)
        assert await c.publish_stage("sink", "b1", ["p0"]) == ("published", 1)


@async_test
async def test_a_column_batch_stages_many_messages_in_one_frame(broker) -> None:
    w = ColumnWriter()
    for i in range(100):
        w.add(0, 0, 0, 4, 0, json.dumps({"i": str(i)}).encode(), f"row{i}".encode())
    async with await AsyncClient.connect(broker.url) as c:
        async with c.stage("sink", "cb", "p0") as p:
            await p.send("/queue/out", b"single")
            await p.send_batch("/queue/out", b"".join(w.finish()), 100, {"from": "frame"})
        assert (p.result, p.messages) == ("staged", 101)
        assert await c.publish_stage("sink", "cb", ["p0"]) == ("published", 101)
        async with await c.read_range("/queue/out") as rng:
            got = [m async for m in rng]
    assert [m.body for m in got] == [b"single"] + [f"row{i}".encode() for i in range(100)]
    assert {m.headers["from"] for m in got[1:]} == {"frame"}


@async_test
async def test_a_resend_under_the_same_number_is_stored_once(broker) -> None:
    async with await AsyncClient.connect(broker.url, producer_id="orders-writer") as c:
        first = await c.send("/queue/d", b"order-1")
        assert first.producer_seq is not None and not first.duplicate
        again = await c.send("/queue/d", b"order-1", producer_seq=first.producer_seq)
        assert again.duplicate and again.producer_seq == first.producer_seq
        piped = c.send_async("/queue/d", b"order-2")  # numbered as it is written
        assert piped.producer_seq == first.producer_seq + 1
        assert not (await c.send("/queue/d", b"order-3")).duplicate
        assert not (await piped).get("sluice-duplicate") and not piped.duplicate
        assert await held_async(c, "/queue/d") == [b"order-1", b"order-2", b"order-3"]


@async_test
async def test_a_client_without_producer_id_refuses_a_producer_seq(broker) -> None:
    async with await AsyncClient.connect(broker.url) as c:
        with pytest.raises(ValueError):
            await c.send("/queue/x", b"", producer_seq=3)
        plain = await c.send("/queue/x", b"")
        assert plain.producer_seq is None and not plain.duplicate
    with pytest.raises(ValueError):
        await AsyncClient.connect(broker.url, producer_id="line\nbreak")


@async_test
async def test_a_send_without_receipt_in_time_tells_its_number_for_the_resend(broker) -> None:
    async with await AsyncClient.connect(broker.url, producer_id="slow", producer_seq=40,
                                         timeout=2.0) as c:
        await c.send("/queue/slow", b"first")
        os.kill(broker.pid, signal.SIGSTOP)  # the broker stalls: the RECEIPT does not come
        try:
            with pytest.raises(ClientError, match="no receipt") as err:
                await c.send("/queue/slow", b"second")
        finally:
            os.kill(broker.pid, signal.SIGCONT)
        assert err.value.producer_seq == 41
        assert (await c.send("/queue/slow", b"second", producer_seq=41)).duplicate
        assert await held_async(c, "/queue/slow") == [b"first", b"second"]
