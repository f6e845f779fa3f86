"""Staged publishing (docs/replay-protocol.md, section 3) against the real broker process:
parts are durable and invisible until published; publication is atomic, ordered and idempotent;
everything survives kill -9 and segment reclaim."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

from sluice_testing import eventually, held, nothing_delivered
from sluicemq import Client, ClientError
from sluicemq.protocol.frames import Frame
from sluicemq.storage.segment import segment_name

SMALL_SEGMENTS = """
[journal]
segment_bytes = 65536
snapshot_records = 0
"""


def stage(c: Client, batch: str, part: str, bodies: list[str], dest: str = "/queue/out",
          sink: str = "sink") -> None:
    with c.stage(sink, batch, part) as p:
        for body in bodies:
            p.send(dest, body.encode(), {"part": part})
    assert (p.result, p.messages) == ("staged", len(bodies))


def segment_deleted(path: Path) -> bool:
    """Whether the journal segment file gets deleted (the broker deletes it on a later loop
    turn, after the records that free it are durable)."""
    try:
        eventually(lambda: not path.exists(), f"{path.name} deleted")
    except AssertionError:
        return False
    return True


def visible(c: Client, dest: str = "/queue/out") -> list[bytes]:
    """What a browser sees (a range read of everything retained)."""
    with c.read_range(dest) as rng:
        return [m.body for m in rng]


def drain(c: Client, dest: str = "/queue/out") -> list[bytes]:
    """Everything the queue holds, each message awaited (the broker says how many)."""
    return held(c, dest)


def test_a_parked_part_is_invisible_to_consumers_and_browsers(broker) -> None:
    with Client(broker.url) as c:
        stage(c, "b1", "p0", ["a", "b"])
        assert visible(c) == []
        assert c.head("/queue/out").count == 0
        assert drain(c) == []


def test_publish_makes_the_listed_parts_visible_at_once_in_part_then_send_order(broker) -> None:
    with Client(broker.url) as c:
        stage(c, "b1", "p0", ["a0", "a1"])
        stage(c, "b1", "p1", ["b0"])
        stage(c, "b1", "p2", ["c0", "c1", "c2"])
        before = c.head("/queue/out").next
        assert c.publish_stage("sink", "b1", ["p2", "p0"]) == ("published", 5)
        with c.read_range("/queue/out") as rng:
            got = [(m.body, m.seq) for m in rng]
        assert [b for b, _ in got] == [b"c0", b"c1", b"c2", b"a0", b"a1"]
        seqs = [s for _, s in got]
        assert seqs == sorted(seqs) and seqs[0] >= before  # fresh, increasing seqs
        assert drain(c) == [b"c0", b"c1", b"c2", b"a0", b"a1"]  # the unlisted p1 is gone


def test_publishing_again_is_a_duplicate_and_shows_nothing_twice(broker) -> None:
    with Client(broker.url) as c:
        stage(c, "b1", "p0", ["x"])
        assert c.publish_stage("sink", "b1", ["p0"]) == ("published", 1)
        with c.stage("sink", "b1", "p1") as p:  # a part of a published batch is not stored
            p.send("/queue/out", b"late")
        assert (p.result, p.messages) == ("duplicate", 0)
        assert c.publish_stage("sink", "b1", ["p0"]) == ("duplicate", 1)
        assert c.publish_stage("sink", "b1", ["p1", "nonexistent"]) == ("duplicate", 1)
        assert drain(c) == [b"x"]


def test_an_unknown_part_is_an_error_and_nothing_is_published(broker) -> None:
    with Client(broker.url) as c:
        stage(c, "b1", "p0", ["x"])
        with pytest.raises(ClientError, match="no part p9"):
            c.publish_stage("sink", "b1", ["p0", "p9"])
        assert visible(c) == []
        assert c.publish_stage("sink", "b1", ["p0"]) == ("published", 1)  # p0 was kept
        assert drain(c) == [b"x"]


def test_a_batch_with_no_parts_publishes_nothing_but_is_remembered(broker) -> None:
    with Client(broker.url) as c:
        stage(c, "b1", "p0", ["x"])
        assert c.publish_stage("sink", "b1", []) == ("published", 0)
        assert c.publish_stage("sink", "b1", ["p0"]) == ("duplicate", 0)
        assert drain(c) == []


def test_abort_discards_the_batch_and_leaves_published_ones_alone(broker) -> None:
    with Client(broker.url) as c:
        stage(c, "b1", "p0", ["x"])
        stage(c, "b1", "p1", ["y"])
        assert c.abort_stage("sink", "b1") == 2
        with pytest.raises(ClientError, match="no part p0"):
            c.publish_stage("sink", "b1", ["p0"])
        stage(c, "b2", "p0", ["z"])
        c.publish_stage("sink", "b2", ["p0"])
        assert c.abort_stage("sink", "b2") == 0
        assert drain(c) == [b"z"]


def test_an_exception_inside_the_stage_block_aborts_the_part(broker) -> None:
    with Client(broker.url) as c:
        with pytest.raises(RuntimeError), c.stage("sink", "b1", "p0") as p:
            p.send("/queue/out", b"half")
            raise RuntimeError("task failed")
        with pytest.raises(ClientError):
            c.publish_stage("sink", "b1", ["p0"])


def test_a_part_staged_again_replaces_the_earlier_attempt(broker) -> None:
    with Client(broker.url) as c:
        stage(c, "b1", "p0", ["attempt-1"])
        stage(c, "b1", "p0", ["attempt-2a", "attempt-2b"])
        assert c.publish_stage("sink", "b1", ["p0"]) == ("published", 2)
        assert drain(c) == [b"attempt-2a", b"attempt-2b"]


def test_parts_fan_out_to_several_destinations_and_topics(broker) -> None:
    with Client(broker.url, client_id="d1") as c:
        durable = c.subscribe("/topic/events", durable_name="keep")
        live = c.subscribe("/topic/events")
        with c.stage("sink", "b1", "p0") as p:
            p.send("/queue/a", b"qa")
            p.send("/topic/events", b"t1", {"kind": "event"})
            p.send("/queue/b", b"qb")
        assert nothing_delivered(c, live)
        c.publish_stage("sink", "b1", ["p0"])
        assert live.get(timeout=5).body == b"t1"
        assert durable.get(timeout=5).headers["kind"] == "event"
        assert drain(c, "/queue/a") == [b"qa"]
        assert drain(c, "/queue/b") == [b"qb"]


def test_a_part_confirmed_before_kill_9_can_be_published_after_restart(broker) -> None:
    with Client(broker.url) as c:
        stage(c, "b1", "p0", ["a", "b"])
        stage(c, "b1", "p1", ["c"])
    broker.kill()
    broker.restart()
    with Client(broker.url) as c:
        assert visible(c) == []
        assert c.publish_stage("sink", "b1", ["p1", "p0"]) == ("published", 3)
        assert drain(c) == [b"c", b"a", b"b"]


def test_a_publication_confirmed_before_kill_9_stays_published_once(broker) -> None:
    with Client(broker.url) as c:
        stage(c, "b1", "p0", ["a", "b"])
        assert c.publish_stage("sink", "b1", ["p0"]) == ("published", 2)
        with c.read_range("/queue/out") as rng:
            seqs = [m.seq for m in rng]
    broker.kill()
    broker.restart()
    with Client(broker.url) as c:
        with c.read_range("/queue/out") as rng:
            assert [m.seq for m in rng] == seqs  # the same ids after replay
        assert c.publish_stage("sink", "b1", ["p0"]) == ("duplicate", 2)
        assert drain(c) == [b"a", b"b"]


def test_the_memory_of_published_batches_survives_segment_reclaim_and_restarts(
        broker_factory) -> None:
    b = broker_factory(config_text=SMALL_SEGMENTS)
    body = "x" * 4000
    with Client(b.url) as c:
        stage(c, "b1", "p0", ["first"])
        c.publish_stage("sink", "b1", ["p0"])
        assert drain(c) == [b"first"]
        for i in range(80):  # ~5 segments of other traffic, all consumed
            c.send("/queue/churn", body, {"i": str(i)})
        assert len(drain(c, "/queue/churn")) == 80
    # the memo moves off the oldest segment, which is then deleted
    assert segment_deleted(b.data_dir / "journal" / segment_name(1))
    b.kill()
    b.restart()
    with Client(b.url) as c:
        assert c.publish_stage("sink", "b1", ["p0"]) == ("duplicate", 1)
    b.stop()  # clean stop: the index snapshot carries the memory
    b.restart()
    with Client(b.url) as c:
        assert c.publish_stage("sink", "b1", []) == ("duplicate", 1)
        assert drain(c) == []


def test_a_big_staged_batch_is_published_from_several_records(broker) -> None:
    payload = b"y" * (256 << 10)
    with Client(broker.url) as c:
        with c.stage("sink", "big", "p0") as p:
            for i in range(40):  # 10 MiB: three STAGE records
                p.send("/queue/big", payload, {"i": str(i)})
        assert c.publish_stage("sink", "big", ["p0"]) == ("published", 40)
    broker.kill()
    broker.restart()
    with Client(broker.url) as c, c.subscribe("/queue/big", ack="client-individual") as sub:
        for i in range(40):
            m = sub.get(timeout=10)
            assert m.headers["i"] == str(i) and m.body == payload
            m.ack()


def test_bad_stage_frames_get_an_error_and_the_connection_keeps_serving(broker, raw) -> None:
    r = raw()
    r.connect()

    def error_for(command: str, headers: dict[str, str]) -> Frame:
        r.send(command, {**headers, "receipt": "x"})
        f = r.recv()
        assert f.command == "ERROR" and f.headers["receipt-id"] == "x", f
        return f

    assert "sluice-stage" in error_for("BEGIN", {"transaction": "t",
                                                 "sluice-stage": "no-part"}).headers["message"]
    error_for("BEGIN", {"transaction": "t", "sluice-stage": "s/b/p q"})
    error_for("COMMIT", {"transaction": "p", "sluice-stage-commit": "s/b"})  # no parts header
    error_for("COMMIT", {"transaction": "p", "sluice-stage-commit": "s/b",
                         "sluice-stage-parts": "p0,p0"})
    error_for("ABORT", {"transaction": "p", "sluice-stage-abort": "only-sink"})
    r.send("BEGIN", {"transaction": "t", "sluice-stage": "s/b/p"})
    msg = error_for("SEND", {"transaction": "t", "destination": "/queue/q",
                             "sluice-producer-id": "a", "sluice-producer-seq": "1"})
    assert "staged part" in msg.headers["message"]
    error_for("ACK", {"transaction": "t", "id": "1-1"})
    r.send("SEND", {"transaction": "t", "destination": "/queue/q"}, b"ok")
    r.send("COMMIT", {"transaction": "t", "receipt": "c"})
    receipt = r.recv()
    assert receipt.command == "RECEIPT", receipt
    assert receipt.headers["sluice-stage-result"] == "staged"
    assert receipt.headers["sluice-stage-messages"] == "1"
    r.send("COMMIT", {"transaction": "p", "sluice-stage-commit": "s/b",
                      "sluice-stage-parts": "p", "receipt": "pub"})
    done = r.recv()
    assert done.headers["sluice-stage-result"] == "published"
    with Client(broker.url) as c:
        assert drain(c, "/queue/q") == [b"ok"]


def test_parked_parts_and_memory_come_back_from_an_index_snapshot(broker) -> None:
    with Client(broker.url) as c:
        stage(c, "b1", "p0", ["done"])
        c.publish_stage("sink", "b1", ["p0"])
        stage(c, "b2", "p0", ["parked-a", "parked-b"])
    broker.stop()
    broker.restart()
    assert "index snapshot used" in broker.log()
    assert "index snapshot not written" not in broker.log()
    with Client(broker.url) as c:
        assert c.publish_stage("sink", "b1", ["p0"]) == ("duplicate", 1)
        assert c.publish_stage("sink", "b2", ["p0"]) == ("published", 2)
        assert drain(c) == [b"done", b"parked-a", b"parked-b"]


def test_snapshot_taken_while_running_plus_the_journal_tail_after_kill_9(broker_factory) -> None:
    b = broker_factory(config_text="[journal]\nsnapshot_records = 5\n")
    with Client(b.url) as c:
        stage(c, "b1", "p0", ["one"])
        stage(c, "b1", "p1", ["two"])
        for i in range(20):  # enough records for a snapshot while running
            c.send("/queue/other", str(i))
        b.wait_for_log("index snapshot written")  # on the tick
        stage(c, "b2", "p0", ["three"])  # in the tail after the snapshot
        assert c.publish_stage("sink", "b1", ["p1", "p0"]) == ("published", 2)
    assert "index snapshot written" in b.log()
    assert "index snapshot not written" not in b.log()  # the self-check adds our pins up
    b.kill()
    b.restart()
    assert "index snapshot used" in b.log()
    with Client(b.url) as c:
        assert c.publish_stage("sink", "b1", ["p0"]) == ("duplicate", 2)
        assert c.publish_stage("sink", "b2", ["p0"]) == ("published", 1)
        assert drain(c) == [b"two", b"one", b"three"]


def test_a_send_the_broker_refused_makes_the_parts_commit_fail_loudly(broker) -> None:
    with Client(broker.url) as c:
        with pytest.raises(ClientError, match="stored 1 of 2"):  # noqa: SIM117
            with c.stage("sink", "b1", "p0") as p:
                p.send("/queue/fine", b"ok")
                p.send("/queue/bad name", b"refused")  # ERROR: invalid destination
        stage(c, "b1", "p0", ["retried"])  # the task's retry replaces the short part
        c.publish_stage("sink", "b1", ["p0"])
        assert drain(c) == [b"retried"]


def test_metrics_count_parts_publications_and_duplicates(broker) -> None:
    import urllib.request

    with Client(broker.url, producer_id="m") as c:
        stage(c, "b1", "p0", ["a"])
        stage(c, "b1", "p1", ["b"])
        stage(c, "b2", "p0", ["c"])
        c.publish_stage("sink", "b1", ["p0"])
        first = c.send("/queue/m", b"x")
        c.send("/queue/m", b"x", producer_seq=first.producer_seq)
    with urllib.request.urlopen(f"{broker.console_url}/metrics", timeout=10) as resp:
        lines = set(resp.read().decode().splitlines())
    for line in ("sluice_stage_parked_parts 1.0", "sluice_stage_remembered_batches 1.0",
                 "sluice_stage_published_batches_total 1.0",
                 "sluice_stage_published_messages_total 1.0",
                 "sluice_stage_discarded_parts_total 1.0", "sluice_producer_ids 1.0",
                 "sluice_producer_duplicates_total 1.0"):
        assert line in lines, line


def test_published_messages_are_compacted_forward_and_keep_their_seqs(broker_factory) -> None:
    """A long-lived published message must not pin its part's segment: compaction copies it
    (under its published id) and the segment goes; replay after kill -9 finds the copy."""
    b = broker_factory(config_text=SMALL_SEGMENTS)
    with Client(b.url) as c:
        stage(c, "b1", "p0", ["keep-1", "keep-2"])
        c.publish_stage("sink", "b1", ["p0"])
        with c.read_range("/queue/out") as rng:
            seqs = [m.seq for m in rng]
        for i in range(120):  # ~8 segments of consumed traffic behind them
            c.send("/queue/churn", "x" * 4000, {"i": str(i)})
        assert len(drain(c, "/queue/churn")) == 120
        eventually(lambda: not (b.data_dir / "journal" / segment_name(1)).exists(),
                   "segment 1 compacted away")
    b.kill()
    b.restart()
    with Client(b.url) as c:
        with c.read_range("/queue/out") as rng:
            assert [(m.seq, m.body) for m in rng] == list(zip(seqs, [b"keep-1", b"keep-2"],
                                                              strict=True))
        assert c.publish_stage("sink", "b1", ["p0"]) == ("duplicate", 2)
        assert drain(c) == [b"keep-1", b"keep-2"]


def test_a_publication_pipelined_right_behind_its_part_waits_for_the_part(broker, raw) -> None:
    r = raw()
    r.connect()
    frames = [("BEGIN", {"transaction": "t", "sluice-stage": "s/b/p"}, b""),
              ("SEND", {"transaction": "t", "destination": "/queue/pipe"}, b"m"),
              ("COMMIT", {"transaction": "t", "receipt": "part"}, b""),
              ("COMMIT", {"transaction": "x", "sluice-stage-commit": "s/b",
                          "sluice-stage-parts": "p", "receipt": "pub"}, b""),
              ("SEND", {"destination": "/queue/pipe", "receipt": "after"}, b"n")]
    from sluicemq.protocol.codec import encode_frame

    r.send_bytes(b"".join(encode_frame(Frame(cmd, h, body), "1.2") for cmd, h, body in frames))
    got = [r.recv() for _ in range(3)]
    assert [f.headers.get("receipt-id") for f in got] == ["part", "pub", "after"]
    assert got[1].headers["sluice-stage-result"] == "published"
    with Client(broker.url) as c:
        assert drain(c, "/queue/pipe") == [b"m", b"n"]


def test_a_publication_refused_by_a_full_disk_is_stored_once_space_returns(tmp_path) -> None:
    """The messages of a publication whose record hit ENOSPC are visible already, so the batch
    stays published and the record is written again: a restart must not forget it."""
    from sluice_testing import BrokerProcess, tmpfs

    with tmpfs(tmp_path / "tiny", "16m") as mnt:
        config = tmp_path / "tiny.toml"
        config.write_text("[journal]\nsegment_bytes = 1048576\npreallocate = false\n"
                          "snapshot_records = 0\n")
        b = BrokerProcess(mnt / "data", ["--config", str(config)]).start()
        try:
            parts = [f"p{i}" for i in range(300)]  # a publication record of several pages
            with Client(b.url) as c:
                for part in parts:
                    stage(c, "b1", part, [f"kept-{part}"])
                filler = mnt / "filler"
                fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
                for chunk in (1 << 20, 1 << 12):  # someone fills the disk to the last page
                    with contextlib.suppress(OSError):
                        while True:
                            os.write(fd, bytes(chunk))
                os.close(fd)
                with pytest.raises(ClientError, match="No space left"):
                    c.publish_stage("sink", "b1", parts)
                filler.unlink()  # space returns
                assert c.publish_stage("sink", "b1", parts) == ("duplicate", 300)
            b.kill()
            b.restart()
            with Client(b.url) as c:
                assert c.publish_stage("sink", "b1", parts) == ("duplicate", 300)
                assert sorted(drain(c)) == sorted(f"kept-{p}".encode() for p in parts)
        finally:
            b.kill()


def test_a_parked_part_does_not_hold_old_segments_on_disk(broker_factory) -> None:
    """Its records move to the head of the log when their segment becomes the oldest, so the
    journal behind it can be deleted; after kill -9 or a clean stop the moved part publishes."""
    b = broker_factory(config_text=SMALL_SEGMENTS)
    with Client(b.url) as c:
        stage(c, "b1", "p0", ["parked-1", "parked-2"])
        for i in range(120):  # ~8 segments of consumed traffic
            c.send("/queue/churn", "x" * 4000, {"i": str(i)})
        assert len(drain(c, "/queue/churn")) == 120
        eventually(lambda: not (b.data_dir / "journal" / segment_name(1)).exists(),
                   "segment 1 deleted (the parked part moved off it)")
    b.wait_for_log("moved off the oldest journal segment")
    b.kill()
    b.restart()
    b.stop()
    b.restart()
    assert "index snapshot used" in b.log()
    with Client(b.url) as c:
        assert c.publish_stage("sink", "b1", ["p0"]) == ("published", 2)
        assert drain(c) == [b"parked-1", b"parked-2"]


def batch_of(rows: list[tuple[dict[str, str], bytes]], priority: int = 4) -> bytes:
    import json

    from sluicemq.protocol.columns import ColumnWriter

    w = ColumnWriter()
    for headers, body in rows:
        w.add(0, 0, 0, priority, 0, json.dumps(headers).encode(), body)
    return b"".join(w.finish())


def test_a_column_batch_send_stages_many_messages_in_one_frame(broker) -> None:
    """``sluice-format:columns`` in a staged part: each row of the batch is one message, with
    the frame's headers under its own; published in row order after the part's other SENDs."""
    rows = [({"i": str(i), "shared": "own"}, f"row{i}".encode()) for i in range(500)]
    with Client(broker.url) as c:
        with c.stage("sink", "cb", "p0") as p:
            p.send("/queue/out", b"single", {"i": "s"})
            p.send_batch("/queue/out", batch_of(rows, priority=7), len(rows),
                         {"shared": "frame", "from": "frame"})
        assert (p.result, p.messages) == ("staged", 501)
        assert c.publish_stage("sink", "cb", ["p0"]) == ("published", 501)
        with c.read_range("/queue/out") as rng:
            got = list(rng)
    assert [m.body for m in got] == [b"single"] + [f"row{i}".encode() for i in range(500)]
    assert [m.headers["i"] for m in got[1:]] == [str(i) for i in range(500)]
    assert {(m.headers["shared"], m.headers["from"]) for m in got[1:]} == {("own", "frame")}
    assert all(m.headers["persistent"] == "true" for m in got)
    with Client(broker.url) as c, c.read_range("/queue/out", batch_bytes=1 << 20) as rng:
        priorities = b"".join(b.priority for b in rng.batches())
    assert priorities == bytes([4]) + bytes([7]) * 500


def test_column_batch_rows_keep_their_headers_whatever_json_they_came_as(broker) -> None:
    """Each row's JSON is stored with the frame's headers added (spliced, not re-encoded, when
    no key clashes): spacing, escapes, an empty object, a transport header or a
    ``persistent:false`` all come out as the row said, with ``persistent:true`` enforced."""
    import json

    from sluicemq.protocol.columns import ColumnWriter

    texts = [b'  { "a" : "1" ,\n "b":"\\u00e9\\n\\"q\\"" }  ', b"{}", b"{ }",
             b'{"receipt":"r-1","c":"3"}', b'{"persistent":"false","d":"4"}']
    want = [{"a": "1", "b": "\u00e9\n\"q\""}, {}, {}, {"c": "3"}, {"d": "4"}]
    w = ColumnWriter()
    for i, text in enumerate(texts):
        w.add(0, 0, 0, 4, 0, text, b"row%d" % i)
    with Client(broker.url) as c:
        with c.stage("sink", "json", "p0") as p:
            p.send_batch("/queue/json", b"".join(w.finish()), len(texts), {"from": "frame"})
        assert c.publish_stage("sink", "json", ["p0"]) == ("published", len(texts))
        with c.read_range("/queue/json") as rng:
            got = list(rng)
        with c.read_range("/queue/json", batch_bytes=1 << 20) as rng:
            stored = [json.loads(b.headers_json(i)) for b in rng.batches() for i in range(b.count)]
    for m, expected, raw_json in zip(got, want, stored, strict=True):
        assert {k: m.headers[k] for k in expected} == expected
        assert (m.headers["from"], m.headers["persistent"]) == ("frame", "true")
        assert "receipt" not in m.headers
        assert raw_json == {**expected, "from": "frame", "persistent": "true"}


@pytest.mark.parametrize(("body", "says"), [
    (b"not a batch", "bad column batch"),
    (batch_of([({"n": "1"}, b"x")])[:-1], "bad column batch"),
    (batch_of([({"n": "1"}, b"x")]).replace(b'{"n": "1"}', b'["n", 1  ]'), "not a JSON object"),
    (batch_of([({}, b"x")], priority=12), "priority above 9"),
])
def test_a_bad_column_batch_is_refused_and_the_part_keeps_what_it_had(raw, body, says) -> None:
    c = raw()
    c.connect()
    c.send("BEGIN", {"transaction": "t", "sluice-stage": "sink/bad/p0"})
    c.send("SEND", {"destination": "/queue/out", "transaction": "t"}, b"kept")
    c.send("SEND", {"destination": "/queue/out", "transaction": "t", "receipt": "b",
                    "sluice-format": "columns"}, body)
    err = c.recv()
    assert err.command == "ERROR" and says in err.headers["message"], err
    c.send("COMMIT", {"transaction": "t", "receipt": "c"})
    assert c.recv().headers["sluice-stage-messages"] == "1"


def test_a_column_batch_outside_a_staged_part_is_refused(raw) -> None:
    """Stored as one message it would look sent while its rows never arrive."""
    c = raw()
    c.connect()
    for extra in ({}, {"transaction": "t"}):
        if extra:
            c.send("BEGIN", {"transaction": "t"})
        c.send("SEND", {"destination": "/queue/out", "receipt": "r", "sluice-format": "columns",
                        **extra}, batch_of([({}, b"x")]))
        err = c.recv()
        assert err.command == "ERROR" and "for staged parts only" in err.headers["message"]
    c.send("SUBSCRIBE", {"destination": "/queue/out", "id": "r", "browser": "true",
                         "receipt": "s"})
    assert c.recv().command == "RECEIPT"
    assert c.recv().headers["sluice-count"] == "0", "nothing was stored"


def test_a_duplicate_answer_names_the_token_of_the_first_publication(broker_factory) -> None:
    """A publisher tells its own retry (same token) from another publisher's batch of the same
    name (another token); the token is remembered across kill -9, clean restarts and the memo
    record that outlives reclaimed segments."""
    b = broker_factory(config_text=SMALL_SEGMENTS)
    with Client(b.url) as c:
        stage(c, "b1", "p0", ["first"])
        first = c.publish_stage("sink", "b1", ["p0"], token="query-a:1:abc")
        assert (first, first.token) == (("published", 1), "query-a:1:abc")
        stage(c, "b2", "p0", ["untokened"])
        assert c.publish_stage("sink", "b2", ["p0"]).token is None
        with c.stage("sink", "b1", "p0") as p:
            p.send("/queue/out", b"second")
        assert (p.result, p.messages) == ("duplicate", 0)  # nothing parked
        again = c.publish_stage("sink", "b1", ["p0"], token="query-b:1:def")
        assert (again, again.token) == (("duplicate", 1), "query-a:1:abc")
        with pytest.raises(ClientError, match="sluice-stage-token"):
            c.publish_stage("sink", "b3", [], token="bad token")
    b.kill()
    b.restart()  # the STAGE_PUBLISH record is replayed
    with Client(b.url) as c:
        assert c.publish_stage("sink", "b1", []).token == "query-a:1:abc"
        assert c.publish_stage("sink", "b2", [], token="x").token is None
        for i in range(80):  # the memo record moves off the segments being reclaimed
            c.send("/queue/churn", "x" * 4000, {"i": str(i)})
        assert len(drain(c, "/queue/churn")) == 80
    assert segment_deleted(b.data_dir / "journal" / segment_name(1))
    b.kill()
    b.restart()
    with Client(b.url) as c:
        assert c.publish_stage("sink", "b1", []).token == "query-a:1:abc"
    b.stop()  # clean stop: the index snapshot carries the memory
    b.restart()
    with Client(b.url) as c:
        assert c.publish_stage("sink", "b1", []).token == "query-a:1:abc"
        assert drain(c) == [b"first", b"untokened"]
