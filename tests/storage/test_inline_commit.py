"""Spec of the loop-side commit path: small batches may be synced in place, big ones never."""

from __future__ import annotations

from sluicemq.storage.journal import Journal


def test_commit_now_syncs_a_small_batch_on_the_calling_thread(open_journal) -> None:
    opened = open_journal()
    journal = opened.journal
    journal.wake_on_append = False
    ticket = journal.append(1, b"hello")
    assert journal.commit_now() is True
    assert journal.durable_seq == ticket.seq  # done before commit_now returned
    assert opened.watch.durable[-1] == ticket.seq


def test_commit_now_without_report_leaves_the_durable_seq_to_the_caller(open_journal) -> None:
    opened = open_journal()
    journal = opened.journal
    journal.wake_on_append = False
    ticket = journal.append(1, b"hello")
    assert journal.commit_now(report=False) is True
    assert journal.durable_seq == ticket.seq  # the store answers receipts from this at once
    assert ticket.seq not in opened.watch.durable  # no second hop back to the loop
    later = journal.append(1, b"again")
    journal.kick()
    opened.watch.wait(later.seq)  # the writer thread still reports its own batches


def test_commit_now_leaves_big_batches_to_the_writer(open_journal) -> None:
    opened = open_journal()
    journal = opened.journal
    journal.wake_on_append = False
    tickets = [journal.append(1, b"x" * 100) for _ in range(10)]
    assert journal.commit_now(max_records=4) is False
    assert journal.durable_seq < tickets[-1].seq
    journal.kick()
    opened.watch.wait(tickets[-1].seq)
    assert journal.durable_seq == tickets[-1].seq


def test_commit_now_leaves_small_batches_to_the_writer_while_recent_ones_were_big(
        open_journal) -> None:
    """Under load a loop turn that appended a few records must not stall the loop for a sync."""
    opened = open_journal()
    journal = opened.journal
    journal.wake_on_append = False
    for _ in range(3):  # three group commits of 20 records: a loaded broker
        tickets = [journal.append(1, b"x" * 100) for _ in range(20)]
        journal.kick()
        opened.watch.wait(tickets[-1].seq)
    assert journal.stats.recent_batch > 4
    lone = journal.append(1, b"lone")
    assert journal.commit_now(max_records=4) is False
    journal.kick()
    opened.watch.wait(lone.seq)
    quiet = 0
    while True:  # the writer's small batches bring the average down: in place again
        ticket = journal.append(1, b"quiet")
        if journal.commit_now(max_records=4):
            break
        journal.kick()
        opened.watch.wait(ticket.seq)
        quiet += 1
    assert journal.durable_seq == ticket.seq
    assert 0 < quiet < 40


def test_commit_now_refuses_large_payloads(open_journal) -> None:
    opened = open_journal(segment_bytes=4 << 20)
    journal = opened.journal
    journal.wake_on_append = False
    ticket = journal.append(1, b"y" * (1 << 20))
    assert journal.commit_now(max_bytes=256 << 10) is False
    journal.kick()
    opened.watch.wait(ticket.seq)


def test_inline_and_writer_commits_interleave_in_order(open_journal, tmp_path) -> None:
    opened = open_journal()
    journal = opened.journal
    journal.wake_on_append = False
    seqs = []
    for i in range(50):
        seqs.append(journal.append(1, f"r{i}".encode()).seq)
        if i % 7 == 0:
            for _ in range(6):
                seqs.append(journal.append(1, b"burst").seq)
            journal.kick()
        elif not journal.commit_now():
            journal.kick()
    opened.watch.wait(seqs[-1])
    journal.close()
    again = Journal(opened.directory, segment_bytes=64 << 10)
    recovered = [bytes(p) for _, p, _ in again.recover()]
    again.close()
    assert len(recovered) == len(seqs)
    assert [r for r in recovered if r != b"burst"] == [f"r{i}".encode() for i in range(50)]


def test_read_works_during_recovery_for_records_already_yielded(open_journal) -> None:
    opened = open_journal()
    ticket = opened.journal.append(7, b"part one")
    opened.watch.wait(ticket.seq)
    opened.journal.close()
    journal = Journal(opened.directory, segment_bytes=64 << 10)
    for _rtype, payload, loc in journal.recover():
        assert journal.read(loc) == bytes(payload)
    journal.close()
