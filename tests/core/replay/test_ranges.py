"""Specs of the sans-IO parts of range reads: ascending runs in a paged-out FIFO, the seq view
of a queue, removal by seq range, request parsing, stream planning and ledgers."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from journal_harness import JournalHarness
from sluicemq.core.paging.cursor import PendingList
from sluicemq.core.paging.pager import Pager
from sluicemq.core.paging.spill import SpillFifo
from sluicemq.core.replay.commit import Committed
from sluicemq.core.replay.ledgers import LedgerBook
from sluicemq.core.replay.request import RangeError, RangeRequest, parse_request
from sluicemq.core.replay.seqindex import Fetcher, SeqView
from sluicemq.core.replay.streams import StreamPlanner, facts_of, select, stream_cuts
from sluicemq.core.routing.message import Message
from sluicemq.core.routing.queue import Consumer

DEST = "/queue/q"


# -- ascending runs ----------------------------------------------------------------------------
def fifo_of(mids: list[int]) -> SpillFifo:
    f = SpillFifo()
    for m in mids:
        f.append(m, 0, 0, 0, 0, 0, 1)
    return f


def run_values(f: SpillFifo) -> list[list[int]]:
    return [list(f.ids(lo, hi)) for lo, hi in f.runs()]


def test_ids_appended_in_order_form_one_run() -> None:
    assert run_values(fifo_of([1, 2, 5, 9])) == [[1, 2, 5, 9]]


def test_a_late_older_id_starts_a_new_run() -> None:
    f = fifo_of([10, 11, 12, 3, 4, 13])
    assert run_values(f) == [[10, 11, 12], [3, 4, 13]]


def test_runs_follow_pops_from_the_front_and_reset_once_empty() -> None:
    f = fifo_of([10, 11, 3, 4])
    f.popleft()
    f.popleft()
    assert run_values(f) == [[3, 4]]
    f.popleft()
    f.popleft()
    assert f.runs() == []
    f.append(1, 0, 0, 0, 0, 0, 1)
    assert run_values(f) == [[1]]


def test_bulk_extended_fifos_find_their_runs_by_one_scan() -> None:
    from array import array

    f = SpillFifo()
    cols = [array("Q", [5, 6, 1, 2, 3]), array("I", [0] * 5), array("Q", [0] * 5),
            array("I", [0] * 5), array("I", [0] * 5), array("I", [1] * 5)]
    f.extend(*cols)
    assert run_values(f) == [[5, 6], [1, 2, 3]]


def test_deleting_a_range_at_the_front_is_a_pop_and_keeps_the_runs() -> None:
    f = fifo_of([1, 2, 3, 4, 0, 9])
    taken = f.delete_range(f.indexes().start, f.indexes().start + 2)
    assert [s[0] for s in taken] == [1, 2]
    assert run_values(f) == [[3, 4], [0, 9]]
    f.delete_range(f.indexes().start + 1, f.indexes().start + 3)  # from the middle
    assert list(f.ids(f.indexes().start, f.end)) == [3, 9]
    assert run_values(f) == [[3, 9]]


# -- a queue seen by seq -----------------------------------------------------------------------
class Harness:
    """A real journal; paged-out messages point at real records."""

    def __init__(self, directory: Path) -> None:
        self.journal_harness = JournalHarness(directory, 1 << 20)
        self.store = self.journal_harness.store
        self.pager = Pager(self.store, None, spill_bytes=64 << 10)
        self.next_mid = 100

    def message(self, priority: int = 4, headers: dict[str, str] | None = None) -> Message:
        mid = self.next_mid
        self.next_mid += 1
        h = dict(headers or {"n": str(mid)})
        msg = Message(mid, DEST, h, f"body-{mid}".encode(), persistent=True,
                      priority=priority, timestamp=mid)
        msg.ticket = self.store.append_message("q:q", mid, mid, 0, priority, h, msg.body or b"")
        msg.inner = 0
        self.store.hold(msg.ticket)
        return msg

    def settle(self) -> None:
        self.journal_harness.settle()
        self.pager.settle(self.store.durable_seq)

    def close(self) -> None:
        self.store.close()


class FakeQueue:
    """The two things a SeqView reads from a queue: its cursor and its consumers."""

    def __init__(self, pending: PendingList) -> None:
        self.pending = pending
        self.consumers: list[Consumer] = []


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(tmp_path)
    yield harness
    harness.close()


def backlog(h: Harness, n: int, window: int = 20) -> tuple[PendingList, list[int]]:
    """n messages over three priorities, most paged out; returns the cursor and all seqs."""
    pending = PendingList(h.pager, destination=DEST, window=window)
    rng = random.Random(7)
    msgs = [h.message(priority=rng.choice([1, 4, 9])) for _ in range(n)]
    h.settle()
    for m in msgs:
        pending.push(m)
    h.settle()
    return pending, [m.mid for m in msgs]


def test_the_view_counts_and_finds_paged_out_messages_by_seq(h: Harness) -> None:
    pending, seqs = backlog(h, 500)
    assert pending.paged > 400
    view = SeqView(FakeQueue(pending))
    assert view.lowest() == seqs[0]
    a, b = seqs[37], seqs[411]
    assert view.count(a, b) == 411 - 37
    assert view.count(0, 1 << 62) == 500
    assert [s for s, _ in view.batch(a, b, 10)] == seqs[37:47]
    assert [s for s, _ in view.batch(a, b, 10_000)] == seqs[37:411]
    assert view.nth(a, b, 0) == a and view.nth(a, b, 373) == seqs[410]
    assert view.find(seqs[200]) is not None and view.find(seqs[-1] + 1) is None


def test_fetching_reads_a_paged_out_message_without_taking_it(h: Harness) -> None:
    pending, seqs = backlog(h, 100)
    view = SeqView(FakeQueue(pending))
    fetch = Fetcher(h.store, h.pager, DEST)
    found = view.find(seqs[90])
    assert found is not None
    msg = fetch.message(found)
    assert msg.mid == seqs[90] and msg.body == f"body-{seqs[90]}".encode()
    assert fetch.headers(found) == {"n": str(seqs[90])}
    assert len(pending) == 100


def test_cuts_split_a_range_into_slices_of_equal_count(h: Harness) -> None:
    pending, seqs = backlog(h, 300)
    view = SeqView(FakeQueue(pending))
    cuts = view.cuts(seqs[0], seqs[-1] + 1, 4)
    assert cuts == [seqs[75], seqs[150], seqs[225]]
    assert view.cuts(seqs[0], seqs[2], 10) == [seqs[1]]  # fewer messages than slices
    assert view.cuts(seqs[-1] + 1, seqs[-1] + 5, 3) == []


def test_redelivered_and_out_of_order_messages_are_still_found_in_seq_order(h: Harness) -> None:
    pending, seqs = backlog(h, 200)
    popped = [pending.pop() for _ in range(30)]  # delivered ...
    for m in reversed(popped[::3]):  # ... and some given back: an unsorted head
        assert m is not None
        pending.push_front(m)
    late = h.message(priority=4)
    h.settle()
    late.mid = seqs[0] - 1  # an older id arriving late (a held stream chunk, say)
    pending.push(late)
    view = SeqView(FakeQueue(pending))
    expected = sorted(m.mid for m in pending)
    assert [s for s, _ in view.batch(0, 1 << 62, 10_000)] == expected
    assert view.lowest() == late.mid
    assert view.count(0, 1 << 62) == len(pending)


def test_removing_a_seq_range_leaves_everything_else_in_dispatch_order(h: Harness) -> None:
    pending, seqs = backlog(h, 400)
    before = [m.mid for m in pending]
    lo, hi = seqs[100], seqs[300]
    removed: list[Message] = []
    while batch := pending.remove_seqs(lo, hi, 64):
        removed += batch
    assert sorted(m.mid for m in removed) == seqs[100:300]
    assert len(pending) == 200
    rest = []
    while (m := pending.pop()) is not None:
        rest.append(m.mid)
    assert rest == [s for s in before if not lo <= s < hi]
    assert (len(pending), pending.paged, pending.stored_bytes, pending.memory) == (0, 0, 0, 0)


def test_removal_can_be_limited_to_chosen_seqs(h: Harness) -> None:
    pending, seqs = backlog(h, 100)
    chosen = set(seqs[10:20:2]) | {seqs[50]}
    removed = pending.remove_seqs(seqs[10], seqs[51], 1000, chosen)
    assert {m.mid for m in removed} == chosen
    assert {m.mid for m in pending} == set(seqs) - chosen


# -- requests ----------------------------------------------------------------------------------
def test_a_full_request_parses() -> None:
    req = parse_request({"browser": "true", "sluice-seq-from": "10", "sluice-seq-to": "20",
                         "sluice-max": "5", "sluice-ledger": "spark-1", "sluice-streams":
                         "complete"})
    assert req == RangeRequest(10, 20, 5, False, 0, "spark-1", None, True)
    assert req.sends_messages
    head = parse_request({"browser": "true", "sluice-head-only": "true", "sluice-splits": "4"})
    assert head.head_only and head.splits == 4 and not head.sends_messages


@pytest.mark.parametrize(("headers", "says"), [
    ({"sluice-seq-from": "abc"}, "invalid sluice-seq-from 'abc'"),
    ({"sluice-seq-from": "-1"}, "invalid sluice-seq-from '-1'"),
    ({"sluice-seq-to": "1e9"}, "invalid sluice-seq-to"),
    ({"sluice-seq-to": "9" * 5000}, "invalid sluice-seq-to '99999"),
    ({"sluice-max": "0"}, "invalid sluice-max '0'"),
    ({"sluice-seq-from": "9", "sluice-seq-to": "3"}, "sluice-seq-from 9 is above"),
    ({"sluice-commit-upto": "5"}, "sluice-commit-upto needs sluice-ledger"),
    ({"sluice-commit-upto": "5", "sluice-ledger": "l", "sluice-max": "3"}, "cannot be combined"),
    ({"sluice-splits": "3"}, "sluice-splits needs sluice-head-only:true"),
    ({"sluice-head-only": "yes"}, "invalid sluice-head-only 'yes'"),
    ({"sluice-streams": "all"}, "invalid sluice-streams 'all'"),
    ({"sluice-ledger": "a b"}, "invalid sluice-ledger 'a b'"),
])
def test_bad_values_are_refused_naming_the_header(headers: dict[str, str], says: str) -> None:
    with pytest.raises(RangeError, match=says.replace("(", r"\(")):
        parse_request({"browser": "true", **headers})


# -- streams mode ------------------------------------------------------------------------------
def chunk(sid: str, n: int, final: bool = False) -> dict[str, str]:
    h = {"sluice-stream-id": sid, "sluice-stream-seq": str(n)}
    if final:
        h["sluice-stream-final"] = "true"
    return h


def test_only_whole_streams_count_and_belong_where_their_final_chunk_is() -> None:
    planner = StreamPlanner(below=100)
    feed = [(1, chunk("a", 0)), (2, chunk("b", 0)), (3, {"plain": "1"}), (4, chunk("a", 1)),
            (5, chunk("a", 2, final=True)), (6, chunk("c", 1)), (7, chunk("c", 2, True)),
            (8, chunk("b", 1)), (9, chunk("b", 2, final=True)), (10, chunk("d", 0))]
    for seq, headers in feed:
        planner.feed(seq, facts_of(headers))
    streams = planner.result()  # c lost its chunk 0 (consumed), d is unfinished
    assert [(s.id, s.final, s.chunks) for s in streams] == [("a", 5, [1, 4, 5]),
                                                            ("b", 9, [2, 8, 9])]
    assert select(streams, 6, 100, None) == (streams[1:], 100)
    assert select(streams, 0, 100, 1) == (streams[:1], 6)
    assert stream_cuts(streams, 2) == [9]


# -- ledgers and committed intervals -----------------------------------------------------------
def test_a_ledger_only_moves_forward_and_survives_a_new_process(tmp_path: Path) -> None:
    book = LedgerBook(tmp_path)
    assert book.position("q:a", "l") == 0
    assert book.advance("q:a", "l", 50) == 50
    assert book.advance("q:a", "l", 20) == 50
    assert LedgerBook(tmp_path).position("q:a", "l") == 50
    assert json.loads((tmp_path / "ledgers.json").read_text())["ledgers"] == {"q:a": {"l": 50}}


def test_an_unreadable_ledger_file_is_kept_aside_and_ledgers_restart(tmp_path: Path) -> None:
    (tmp_path / "ledgers.json").write_text("{torn")
    book = LedgerBook(tmp_path)
    assert book.position("q:a", "l") == 0
    assert (tmp_path / "ledgers.bad").read_text() == "{torn"


def test_committed_intervals_merge_and_answer_membership() -> None:
    c = Committed()
    c.add("q:a", 0, 10)
    c.add("q:a", 5, 20)
    c.add("q:a", 30, 40)
    assert c.covers("q:a", 19) and c.covers("q:a", 30)
    assert not c.covers("q:a", 25) and not c.covers("q:b", 1)
