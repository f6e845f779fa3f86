"""Spec of group commit: one fdatasync serves many records; on_durable is ordered and honest."""

from __future__ import annotations

import asyncio
import os

from sluicemq.storage.segment import HEADER_SIZE, verify_record


def test_a_burst_of_appends_shares_few_fsyncs(open_journal) -> None:
    opened = open_journal(segment_bytes=1 << 20)
    tickets = [opened.journal.append(1, b"x" * 100) for _ in range(3000)]
    opened.watch.wait(tickets[-1].seq)
    stats = opened.journal.stats
    assert stats.records == 3000
    assert stats.batches < 300 and stats.fsyncs < 300
    assert stats.mean_batch > 10
    assert stats.max_batch >= stats.last_batch >= 1
    assert len(stats.fsync_latency_s) == stats.batches


def test_on_durable_reports_increasing_seqs_ending_at_the_last(open_journal) -> None:
    opened = open_journal(segment_bytes=16 << 10)
    tickets = [opened.journal.append(1, os.urandom(i % 700)) for i in range(2000)]
    opened.watch.wait(tickets[-1].seq)
    durable = opened.watch.durable
    assert durable == sorted(set(durable))
    assert durable[-1] == 2000
    assert opened.journal.durable_seq == 2000


def test_everything_up_to_a_durable_seq_is_in_the_files_when_it_is_reported(
    open_journal,
) -> None:
    """on_durable(seq) may release a RECEIPT: every record <= seq must already be on disk."""
    opened = open_journal(start=False, segment_bytes=8 << 10)
    journal = opened.journal
    tickets: list = []
    problems: list[str] = []

    def check(seq: int) -> None:
        for t in tickets[:seq]:
            with open(journal.segment_path(t.loc.segment), "rb") as fh:
                raw = os.pread(fh.fileno(), HEADER_SIZE + t.loc.length, t.loc.offset)
            seeds = journal.header_key.seeds(t.loc.segment)
            if verify_record(raw[:HEADER_SIZE], raw[HEADER_SIZE:], t.loc, seeds=seeds) != 1:
                problems.append(f"seq {t.seq} not on disk at on_durable({seq})")
        opened.watch.on_durable(seq)

    journal.start(check, opened.watch.on_failed)
    tickets.extend(journal.append(1, os.urandom(300)) for _ in range(300))
    opened.watch.wait(300)
    assert problems == []


def test_producers_that_wait_for_durability_are_batched_together(open_journal) -> None:
    """Sixteen synchronous producers on one event loop: each fsync carries several of them."""
    opened = open_journal(start=False, segment_bytes=1 << 20)
    journal = opened.journal

    async def run() -> None:
        loop = asyncio.get_running_loop()
        waiting: dict[int, asyncio.Future[None]] = {}

        def durable(seq: int) -> None:
            for s in [s for s in waiting if s <= seq]:
                waiting.pop(s).set_result(None)

        journal.start(lambda seq: loop.call_soon_threadsafe(durable, seq), print)

        async def producer() -> None:
            for _ in range(40):
                ticket = journal.append(1, bytes(1024))
                waiting[ticket.seq] = loop.create_future()
                await waiting[ticket.seq]

        await asyncio.gather(*(producer() for _ in range(16)))

    asyncio.run(run())
    assert journal.stats.records == 640
    assert journal.stats.mean_batch >= 3


def test_sync_false_skips_fdatasync_but_still_reports_durability(open_journal) -> None:
    opened = open_journal(sync=False)
    tickets = [opened.journal.append(1, b"fast") for _ in range(100)]
    opened.watch.wait(tickets[-1].seq)
    assert opened.journal.stats.fsyncs == 0
    assert opened.journal.read(tickets[50].loc) == b"fast"
