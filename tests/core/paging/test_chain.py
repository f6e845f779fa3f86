"""Spec of BlockChain, the row of blocks under a spill FIFO: whatever the FIFO does to its
slots, the blocks stay consecutive, none lies wholly before the front, and besides the last
block at most ``OPEN_BLOCKS`` are held unpacked (memory stays a few blocks for any backlog)."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from sluicemq.core.paging import chain, spill
from sluicemq.core.paging.spill import JOURNAL, SpillFifo


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(spill, "BLOCK", 8)
    monkeypatch.setattr(chain, "OPEN_BLOCKS", 2)
    yield


def check_chain(fifo: SpillFifo) -> None:
    blocks, starts = fifo._blocks, fifo._starts
    assert len(blocks) == len(starts)
    for k in range(1, len(blocks)):
        assert starts[k] == starts[k - 1] + blocks[k - 1].n
    if blocks:
        assert starts[0] + blocks[0].n > fifo._start
        assert starts[-1] + blocks[-1].n == fifo.end
    unpacked = [b for b in blocks[:-1] if b.fields is not None]
    assert len(unpacked) <= chain.OPEN_BLOCKS
    assert all(b in fifo._open for b in unpacked)
    assert all(b in blocks for b in fifo._open)


@pytest.mark.parametrize("seed", range(20))
def test_blocks_stay_consecutive_and_few_stay_open(seed: int) -> None:
    rnd = random.Random(seed)
    fifo, mid = SpillFifo(), 0
    for _ in range(300):
        op = rnd.choice(["add", "add", "pop", "read", "cut", "clear"] if len(fifo) else ["add"])
        if op == "add":
            for _ in range(rnd.randrange(1, 20)):
                mid += 1
                fifo.append(mid, JOURNAL, 1, mid, 10, 0, 5)
        elif op == "pop":
            for _ in range(min(len(fifo), rnd.randrange(1, 12))):
                fifo.popleft()
        elif op == "read":  # a read opens a sealed block and may seal another
            i = rnd.randrange(fifo._start, fifo.end)
            assert fifo.slot(i) == fifo.slot(i)
        elif op == "cut":
            i = rnd.randrange(fifo._start, fifo.end)
            fifo.delete_range(i, min(fifo.end, i + rnd.randrange(1, 12)))
        elif rnd.random() < 0.1:
            fifo.clear()
        check_chain(fifo)
