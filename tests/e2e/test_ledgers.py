"""Spec: ledgers and commit-upto (docs/replay-protocol.md, section 2): "done up to here",
durable across kill -9, through the same path as an ACK."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sluice_testing import RawStomp, eventually
from sluicemq.client import Client
from sluicemq.errors import ClientError

SMALL_SEGMENTS = """
[journal]
segment_bytes = 1048576
[[policy]]
queue = ">"
cursor_window = 100
"""


def fill(c: Client, destination: str, n: int, prefix: str = "m") -> list[int]:
    before = c.head(destination).next
    for i in range(n):
        c.send_async(destination, f"{prefix}{i}")
    c.send(destination, f"{prefix}-last")
    return [m.seq for m in c.read_range(destination, before) if m.seq is not None]


def bodies(c: Client, destination: str, **kw: Any) -> list[str]:
    with c.read_range(destination, **kw) as rng:
        return [m.text() for m in rng]


def test_commit_upto_removes_what_is_below_and_moves_the_ledger(broker) -> None:
    with Client(broker.url) as c:
        seqs = fill(c, "/queue/l", 5)
        done = c.commit_upto("/queue/l", seqs[3], ledger="spark")
        assert (done.committed, done.count, done.end) == (seqs[3], 3, seqs[3])
        assert done.first == seqs[3]
        h = c.head("/queue/l", ledger="spark")
        assert (h.committed, h.count, h.first) == (seqs[3], 3, seqs[3])
        with c.subscribe("/queue/l") as sub:
            assert [sub.get(5).text() for _ in range(3)] == ["m3", "m4", "m-last"]
        again = c.commit_upto("/queue/l", seqs[1], ledger="spark")  # never backwards
        assert again.committed == seqs[3] and again.count == 0


def test_a_commit_sent_and_left_is_carried_out_after_the_connection_ends(broker) -> None:
    """``send_commit`` does not wait, and the client may go at once: the broker carries out
    a commit it received - the removal and the ledger move - without anyone to answer."""
    with Client(broker.url) as c:
        seqs = fill(c, "/queue/left", 2000)
    with Client(broker.url) as c:
        c.send_commit("/queue/left", seqs[1500], ledger="job")
    with Client(broker.url) as c:
        eventually(lambda: c.head("/queue/left", ledger="job").committed == seqs[1500],
                   "the ledger moved to the commit's position")
        h = c.head("/queue/left", ledger="job")
        assert (h.count, h.first) == (501, seqs[1500])


def test_a_pending_commit_answers_like_commit_upto_and_raises_its_error(broker) -> None:
    with Client(broker.url) as c:
        seqs = fill(c, "/queue/pend", 5)
        pending = c.send_commit("/queue/pend", seqs[2], ledger="spark")
        done = pending.result()
        assert pending.done() and (done.committed, done.count) == (seqs[2], 2)
        beyond = c.send_commit("/queue/pend", seqs[-1] + 100, ledger="spark")
        with pytest.raises(ClientError, match="above the head"):
            beyond.result()
        assert c.head("/queue/pend", ledger="spark").committed == seqs[2]  # carries on


def test_a_commit_survives_kill_9_and_so_does_its_ledger(broker) -> None:
    with Client(broker.url) as c:
        seqs = fill(c, "/queue/k", 10)
        c.commit_upto("/queue/k", seqs[6], ledger="job")
    broker.kill()
    broker.restart()
    with Client(broker.url) as c:
        h = c.head("/queue/k", ledger="job")
        assert (h.committed, h.count, h.first) == (seqs[6], 5, seqs[6])
        assert bodies(c, "/queue/k") == ["m6", "m7", "m8", "m9", "m-last"]
        with pytest.raises(ClientError, match=r"already committed by ledger job up to"):
            c.read_range("/queue/k", seqs[2], ledger="job")


def test_a_commit_with_from_removes_only_that_slice_and_leaves_the_ledger(broker) -> None:
    with Client(broker.url) as c:
        seqs = fill(c, "/queue/f", 6)
        done = c.commit_upto("/queue/f", seqs[4], ledger="batch", start=seqs[2])
        assert done.count == 2 and done.committed == 0
        assert bodies(c, "/queue/f") == ["m0", "m1", "m4", "m5", "m-last"]


def test_a_range_the_ledger_committed_is_an_error_and_the_broker_carries_on(broker) -> None:
    with Client(broker.url) as c:
        seqs = fill(c, "/queue/gone", 3)
        c.commit_upto("/queue/gone", seqs[2], ledger="L")
        with pytest.raises(ClientError) as err:
            c.head("/queue/gone", start=seqs[0], ledger="L")
        assert str(err.value) == (f"range [{seqs[0]}, {c.head('/queue/gone').next}) of "
                                  f"/queue/gone was already committed by ledger L up to "
                                  f"{seqs[2]}")
        assert c.head("/queue/gone", ledger="L").count == 2  # from defaults to the ledger
        assert bodies(c, "/queue/gone", ledger="L") == ["m2", "m-last"]


def test_a_consumer_holding_a_committed_message_has_its_ack_ignored(broker) -> None:
    with Client(broker.url) as reader, Client(broker.url) as consumer:
        seqs = fill(reader, "/queue/c", 3)
        sub = consumer.subscribe("/queue/c", ack="client-individual", prefetch=1)
        held = sub.get(5)
        assert held is not None and held.seq == seqs[0]
        reader.commit_upto("/queue/c", seqs[2], ledger="L")
        held.ack(receipt=True)  # no ERROR: the commit already took it
        nxt = sub.get(5)
        assert nxt is not None and nxt.text() == "m2"
        sub.unsubscribe()
    with Client(broker.url) as c:
        assert bodies(c, "/queue/c") == ["m2", "m-last"]  # m2 was never acked


def test_a_cumulative_ack_of_a_committed_message_still_covers_older_ones(broker) -> None:
    with Client(broker.url) as reader, Client(broker.url) as consumer:
        seqs = fill(reader, "/queue/cum", 4)
        sub = consumer.subscribe("/queue/cum", ack="client", prefetch=10)
        got = [sub.get(5) for _ in range(5)]
        assert [m.text() for m in got if m is not None] == ["m0", "m1", "m2", "m3", "m-last"]
        reader.commit_upto("/queue/cum", seqs[2], ledger="L", start=seqs[1])  # takes m1 only
        got[1].ack(receipt=True)  # cumulative: m0 is acknowledged with it
        sub.unsubscribe()  # m2, m3 and m-last go back to the queue
        assert bodies(reader, "/queue/cum") == ["m2", "m3", "m-last"]


def test_a_stomp_1_1_ack_by_message_id_of_a_committed_message_is_ignored(broker) -> None:
    raw = RawStomp(broker.host, broker.port)
    raw.connect(version="1.1")
    with Client(broker.url) as reader:
        seqs = fill(reader, "/queue/v11", 1)
        raw.send("SUBSCRIBE", {"destination": "/queue/v11", "id": "s", "ack": "client",
                               "activemq.prefetchSize": "1"})
        held = raw.recv()
        reader.commit_upto("/queue/v11", seqs[1], ledger="L")
        assert raw.recv().body == b"m-last"  # the commit freed the prefetch slot
        raw.send("ACK", {"message-id": held.headers["message-id"], "subscription": "s",
                         "receipt": "a"})
        assert raw.recv().headers == {"receipt-id": "a"}  # not an ERROR
        assert reader.head("/queue/v11").count == 1  # m-last, held by the consumer
    raw.close()


def test_commits_on_one_durable_subscription_leave_the_others_alone(broker) -> None:
    with Client(broker.url, client_id="a") as a, Client(broker.url, client_id="b") as b:
        a.subscribe("/topic/t", durable_name="s").unsubscribe()
        b.subscribe("/topic/t", durable_name="s").unsubscribe()
        for i in range(4):
            a.send("/topic/t", f"t{i}")
        seqs = [m.seq for m in a.read_range("/topic/t", subscription="s")]
        done = a.commit_upto("/topic/t", seqs[3], ledger="L", subscription="s")
        assert done.count == 3 and done.committed == seqs[3]
        assert bodies(a, "/topic/t", subscription="s") == ["t3"]
        assert bodies(b, "/topic/t", subscription="s") == ["t0", "t1", "t2", "t3"]
        assert b.head("/topic/t", ledger="L", subscription="s").committed == 0


def test_a_big_commit_over_a_paged_out_backlog_gives_journal_space_back(broker_factory) -> None:
    b = broker_factory(config_text=SMALL_SEGMENTS)
    journal = Path(b.data_dir) / "journal"
    with Client(b.url) as c:
        body = "x" * 1000
        for _ in range(12_000):  # ~12 MiB: a dozen segments, mostly paged out
            c.send_async("/queue/big", body)
        c.send("/queue/big", "tail")
        h = c.head("/queue/big")
        segments_before = len(list(journal.glob("*.log")))
        done = c.commit_upto("/queue/big", h.next - 1, ledger="L")  # all but "tail"
        assert done.count == 12_000 and c.head("/queue/big").count == 1
        eventually(lambda: len(list(journal.glob("*.log"))) <= 3, "committed segments deleted")
        assert segments_before >= 10
    b.kill()
    b.restart()
    with Client(b.url) as c:
        assert bodies(c, "/queue/big") == ["tail"]


def test_commit_then_kill_9_mid_traffic_loses_nothing_uncommitted(broker) -> None:
    """Receipted messages above the committed position all survive, exactly once."""
    with Client(broker.url) as c:
        seqs = fill(c, "/queue/mix", 50)
        c.commit_upto("/queue/mix", seqs[20], ledger="L")
        for i in range(50, 60):
            c.send("/queue/mix", f"m{i}")
    broker.kill()
    broker.restart()
    with Client(broker.url) as c:
        got = bodies(c, "/queue/mix")
    assert got == [f"m{i}" for i in range(20, 50)] + ["m-last"] + [f"m{i}" for i in range(50, 60)]


def test_bad_commits_get_errors_on_a_connection_that_lives_on(broker) -> None:
    raw = RawStomp(broker.host, broker.port)
    raw.connect()
    sub = {"destination": "/queue/x", "id": "c", "browser": "true", "receipt": "r"}
    raw.send("SUBSCRIBE", {**sub, "sluice-commit-upto": "x1", "sluice-ledger": "L"})
    assert "invalid sluice-commit-upto 'x1'" in raw.recv().headers["message"]
    raw.send("SUBSCRIBE", {**sub, "sluice-commit-upto": "1", "sluice-ledger": "no spaces"})
    assert "invalid sluice-ledger" in raw.recv().headers["message"]
    raw.send("SUBSCRIBE", {**sub, "sluice-commit-upto": "1", "sluice-ledger": "L"})
    assert raw.recv().headers["browser"] == "end"
    assert raw.recv().headers == {"receipt-id": "r"}
    raw.close()
