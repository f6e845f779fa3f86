"""Spec: range reads answered with column batches (``sluice-format:columns``,
docs/replay-protocol.md section 2b) carry exactly what the per-message form carries - the same
messages, in seq order, with their stored headers and bodies - wherever each message is: paged
out to the journal, in memory, inside a committed transaction's record, redelivered, or
non-persistent."""

from __future__ import annotations

import json
import time
from typing import Any

from sluice_testing import RawStomp
from sluicemq.buffers import BufferPool
from sluicemq.client import Client
from sluicemq.client.sync_conn import BODIES_KEPT
from sluicemq.protocol import columns

PAGED = """
[[policy]]
queue = ">"
cursor_window = 50
"""
FRAME_HEADERS = {"destination", "message-id", "subscription", "sluice-seq", "ack",
                 "content-length", "redelivered", "sluice-delivery-count"}


def per_message(c: Client, destination: str, **kw: Any) -> list[tuple[int, dict, bytes]]:
    with c.read_range(destination, **kw) as rng:
        return [(m.seq, {k: v for k, v in m.headers.items() if k not in FRAME_HEADERS},
                 bytes(m.body)) for m in rng]


def as_columns(c: Client, destination: str, batch_bytes: int = 1 << 20,
               **kw: Any) -> tuple[list[tuple[int, dict, bytes]], list[columns.Columns]]:
    out: list[tuple[int, dict, bytes]] = []
    with c.read_range(destination, batch_bytes=batch_bytes, **kw) as rng:
        batches = list(rng.batches())
    for b in batches:
        for i, seq in enumerate(b.seq):
            out.append((seq, json.loads(b.headers_json(i)), b.body_of(i)))
    return out, batches


def test_messages_wherever_they_are_come_as_in_the_per_message_form(broker_factory) -> None:
    b = broker_factory(config_text=PAGED)
    with Client(b.url) as c:
        for i in range(300):  # most paged out: the cursor keeps 50 in memory
            c.send("/queue/cols", f"p{i}".encode(), {"i": str(i), "kind": "paged"})
        with c.transaction() as tx:  # one TX record holding several messages
            for i in range(5):
                tx.send("/queue/cols", f"t{i}".encode(), {"i": str(i), "kind": "tx"})
        c.send("/queue/cols", b"x" * 200_000, {"kind": "large"})  # body only in the journal
        for i in range(3):
            c.send("/queue/cols", f"n{i}".encode(), {"kind": "transient"}, persistent=False)
        with c.subscribe("/queue/cols", ack="client-individual", prefetch=1) as sub:
            first = next(iter(sub))
            first.nack()  # back to the queue as a redelivered message object
        expect = per_message(c, "/queue/cols")
        got, batches = as_columns(c, "/queue/cols")
    assert len(expect) == 300 + 5 + 1 + 3
    assert got == expect
    seqs = [seq for seq, _h, _b in got]
    assert seqs == sorted(seqs)
    flags = {seq: b.flags[i] for b in batches for i, seq in enumerate(b.seq)}
    assert flags[seqs[0]] & columns.REDELIVERED, "the NACKed message is marked redelivered"
    assert {flags[s] & columns.PERSISTENT for s in seqs[-3:]} == {0}, "non-persistent ones"
    assert all(flags[s] & columns.PERSISTENT for s in seqs[1:-3])


def test_batches_stay_near_their_byte_size_and_respect_max_messages(broker) -> None:
    with Client(broker.url) as c:
        for i in range(100):
            c.send("/queue/sized", bytes(1000), {"i": str(i)})
        got, batches = as_columns(c, "/queue/sized", batch_bytes=8192)
        assert len(got) == 100
        assert max(sum(len(b.body_of(i)) for i in range(b.count)) for b in batches) <= 8192
        assert len(batches) >= 100 * 1000 // 8192
        with c.read_range("/queue/sized", batch_bytes=8192, max_messages=17) as rng:
            n = sum(b.count for b in rng.batches())
            head = rng.head
        assert n == 17 and head is not None and head.count == 17
        assert head.end == got[16][0] + 1


def test_an_empty_or_missing_queue_answers_with_the_end_frame_only(raw) -> None:
    c: RawStomp = raw()
    c.connect()
    for dest in ("/queue/never-made", "/queue/made-empty"):
        c.send("SEND", {"destination": "/queue/made-empty", "receipt": "s"}, b"gone")
        c.recv()
        c.send("SUBSCRIBE", {"destination": "/queue/made-empty", "id": "eat", "ack": "auto"})
        assert c.recv().body == b"gone"
        c.send("UNSUBSCRIBE", {"id": "eat", "receipt": "u"})
        assert c.recv().command == "RECEIPT"
        c.send("SUBSCRIBE", {"destination": dest, "id": "r", "browser": "true",
                             "sluice-format": "columns", "receipt": "go"})
        assert c.recv().headers == {"receipt-id": "go"}
        end = c.recv()
        assert end.headers["browser"] == "end" and end.headers["sluice-count"] == "0"


def test_a_batch_frame_is_an_ordinary_stomp_message_any_client_can_read(raw) -> None:
    """Clients that do not know the layout still read a well-formed MESSAGE: the batch is its
    body, with a content-type and the message count in a header."""
    c: RawStomp = raw()
    c.connect()
    for i in range(3):
        c.send("SEND", {"destination": "/queue/plain", "receipt": str(i), "n": str(i)},
               f"b{i}".encode())
        c.recv()
    c.send("SUBSCRIBE", {"destination": "/queue/plain", "id": "r", "browser": "true",
                         "sluice-format": "columns"})
    frame = c.recv()
    assert frame.command == "MESSAGE"
    assert frame.headers["content-type"] == columns.CONTENT_TYPE
    assert frame.headers["sluice-batch"] == "3"
    batch = columns.decode(frame.body)
    assert list(batch.bodies()) == [b"b0", b"b1", b"b2"]
    assert c.recv().headers["browser"] == "end"
    assert batch.layout == columns.PACKED, "the packed layout unless the reader asks for spans"


def raw_batches(c: RawStomp, destination: str, layout: str | None) -> list[bytes]:
    """The bodies of the column-batch frames of one raw range read of ``destination``."""
    h = {"destination": destination, "id": f"r-{layout}", "browser": "true",
         "sluice-format": "columns", "sluice-batch-bytes": "65536"}
    if layout is not None:
        h["sluice-layout"] = layout
    c.send("SUBSCRIBE", h)
    bodies = []
    while (frame := c.recv()).headers.get("browser") != "end":
        assert frame.command == "MESSAGE", frame
        bodies.append(frame.body)
    return bodies


def test_both_layouts_carry_the_same_messages(broker_factory) -> None:
    b = broker_factory(config_text=PAGED)
    with Client(b.url) as c:
        for i in range(400):
            c.send("/queue/both", f"m{i}".encode() * (i % 9), {"i": str(i)})
    r = RawStomp(b.host, b.port)
    r.connect()

    def rows(bodies: list[bytes]) -> list[tuple[int, bytes, bytes]]:
        out = []
        for body in bodies:
            cols = columns.decode(body)
            out += zip(cols.seq, cols.all_headers_json(), cols.bodies(), strict=True)
        return out

    packed, spans = raw_batches(r, "/queue/both", None), raw_batches(r, "/queue/both", "spans")
    r.close()
    assert {columns.decode(x).layout for x in spans} == {columns.SPANS}
    assert rows(spans) == rows(packed)
    assert len(rows(spans)) == 400


def test_a_spans_batch_carries_no_byte_of_another_destinations_records(broker_factory) -> None:
    """Records of two queues lie interleaved in the journal; a spans batch sends records as
    they were read, so it must cut out every record that is not the reader's own."""
    b = broker_factory(config_text=PAGED)
    with Client(b.url) as c:
        for i in range(300):
            c.send("/queue/mine", b"mine-%d" % i)
            c.send("/queue/theirs", b"SECRET-%d" % i, {"secret": "SECRET"})
    r = RawStomp(b.host, b.port)
    r.connect()
    bodies = raw_batches(r, "/queue/mine", "spans")
    r.close()
    assert sum(columns.decode(x).count for x in bodies) == 300
    assert not any(b"SECRET" in x or b"theirs" in x for x in bodies)


def test_an_unknown_layout_is_refused_with_a_readable_error(raw) -> None:
    c: RawStomp = raw()
    c.connect()
    c.send("SUBSCRIBE", {"destination": "/queue/x", "id": "r", "browser": "true",
                         "sluice-format": "columns", "sluice-layout": "diagonal"})
    frame = c.recv()
    assert frame.command == "ERROR"
    assert "sluice-layout" in frame.headers["message"]


def test_a_slow_reader_gets_every_byte_of_every_batch_intact(broker) -> None:
    """The broker reads the journal into buffers it reuses and sends pieces of them without a
    copy; while a slow reader keeps its transport backed up, a buffer still being sent must
    never be overwritten by the next read."""
    def body(i: int) -> bytes:
        return b"%08d" % i * (64 + i % 200)

    with Client(broker.url) as c:
        for r in [c.send_async("/queue/slow", body(i)) for i in range(20_000)]:
            r.result(60)
        got = 0
        with c.read_range("/queue/slow", batch_bytes=1 << 20) as rng:
            for cols in rng.batches():
                for b in cols.bodies():
                    assert b == body(int(b[:8]))
                    got += 1
                time.sleep(0.02)  # the slowness under test, not a wait for an event
        assert got == 20_000


def test_a_reader_reusing_its_buffers_never_sees_a_held_batch_overwritten(broker) -> None:
    """With ``reuse_buffers`` the client gathers each large batch frame into one of a few kept
    buffers, written again only once nothing views it: batches held while more arrive stay
    intact, and a reader that drops each batch reuses the same few buffers."""
    def body(i: int) -> bytes:
        return b"%08d" % i * (64 + i % 200)

    n = 40_000
    with Client(broker.url) as c:
        for r in [c.send_async("/queue/reuse", body(i)) for i in range(n)]:
            r.result(60)
    with Client(broker.url, reuse_buffers=True) as c:
        with c.read_range("/queue/reuse", batch_bytes=4 << 20) as rng:
            held = [(m.body, columns.decode(m.body)) for m in rng]  # all held at once
        pooled = {id(b.obj) for b, _cols in held if isinstance(b, memoryview)}
        assert len(held) > BODIES_KEPT and 0 < len(pooled) <= BODIES_KEPT
        seen = [b for _body, cols in held for b in cols.bodies()]
        assert [int(b[:8]) for b in seen] == list(range(n))
        assert all(b == body(int(b[:8])) for b in seen)
        del held, seen
        kept: set[int] = set()
        views = count = batches = 0
        with c.read_range("/queue/reuse", batch_bytes=4 << 20) as rng:
            for m in rng:  # each batch dropped before the next is taken
                batches += 1
                if isinstance(m.body, memoryview):
                    views += 1
                    kept.add(id(m.body.obj))
                count += columns.decode(m.body).count
                del m
        # Every 4 MiB batch spans several socket reads, so each is gathered into a kept
        # buffer (a short last one may arrive whole); more batches than buffers: reused.
        assert count == n and views >= batches - 1 > BODIES_KEPT >= len(kept)


def test_successive_connections_sharing_a_pool_fill_the_same_buffers(broker) -> None:
    """A BufferPool given as ``reuse_buffers`` outlives each connection: once a reader is done,
    the next connection of the process (a Spark worker's next task) fills a buffer the first
    one filled, not fresh memory. (How many a reader needs at once depends on how far it falls
    behind, so only the first batch of the second read is pinned down.)"""
    n = 20_000
    with Client(broker.url) as c:
        for r in [c.send_async("/queue/shared-pool", b"x" * 1024) for _ in range(n)]:
            r.result(60)
    pool = BufferPool(keep=BODIES_KEPT, largest=64 << 20)

    def read() -> tuple[int, list[int]]:
        buffers: list[int] = []
        count = 0
        with Client(broker.url, reuse_buffers=pool) as c, \
                c.read_range("/queue/shared-pool", batch_bytes=4 << 20) as rng:
            for m in rng:
                if isinstance(m.body, memoryview):
                    buffers.append(id(m.body.obj))
                count += columns.decode(m.body).count
                del m
        return count, buffers

    count, first = read()
    again, second = read()
    assert count == again == n and first and second
    assert second[0] in first and len(set(first) | set(second)) <= BODIES_KEPT
