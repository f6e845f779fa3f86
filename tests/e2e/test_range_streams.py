"""Spec: streams mode of range reads (docs/replay-protocol.md, section 2, "Streams mode"):
whole large streams, placed by their final chunk's seq, read and committed as units."""

from __future__ import annotations

import hashlib
import json
import urllib.request
from typing import Any

from sluicemq.client import Client

PAGED = """
[[policy]]
queue = ">"
cursor_window = 2
"""
HELD = """
[[policy]]
queue = "held.>"
stream_dispatch = "complete"
"""


def chunk_headers(sid: str, n: int, offset: int) -> dict[str, str]:
    return {"sluice-stream-id": sid, "JMSXGroupID": sid, "sluice-stream-seq": str(n),
            "sluice-stream-offset": str(offset), "sluice-stream-name": f"{sid}.bin"}


def send_chunks(c: Client, destination: str, sid: str, chunks: list[bytes], *, first: int = 0,
                offset: int = 0, whole: bytes | None = None) -> None:
    """Chunks ``first``.. of stream ``sid``; with ``whole`` the last one is final."""
    for i, data in enumerate(chunks, start=first):
        h = chunk_headers(sid, i, offset)
        if whole is not None and i == first + len(chunks) - 1:
            h.update({"sluice-stream-final": "true", "sluice-stream-size": str(len(whole)),
                      "sluice-stream-sha256": hashlib.sha256(whole).hexdigest()})
        c.send(destination, data, h)
        offset += len(data)


def write_stream(c: Client, destination: str, name: str, data: bytes) -> None:
    with c.stream_writer(destination, name=f"{name}.bin", stream_id=name, chunk_size=1000,
                         window=4) as w:
        w.write(data)


def stream_states(console_url: str) -> dict[str, str]:
    with urllib.request.urlopen(f"{console_url}/api/streams", timeout=10) as resp:
        return {st["id"]: st["state"] for st in json.loads(resp.read())["streams"]}


def streams_read(c: Client, destination: str, **kw: Any) -> list[tuple[str, int]]:
    with c.read_range(destination, streams=True, **kw) as rng:
        return [(m.headers["sluice-stream-name"], int(m.headers["sluice-stream-seq"]))
                for m in rng]


def test_whole_streams_are_read_and_committed_as_units(broker_factory) -> None:
    b = broker_factory(config_text=PAGED)  # chunks mostly paged out: classified from disk
    q = "/queue/files"
    with Client(b.url) as c:
        c.send(q, "plain before")
        write_stream(c, q, "a", b"a" * 2500)  # 3 chunks
        send_chunks(c, q, "c", [b"c" * 1000])  # c starts ...
        write_stream(c, q, "b", b"b" * 1500)  # 2 chunks, complete before c
        send_chunks(c, q, "c", [b"c" * 1000], first=1, offset=1000)  # ... c is unfinished
        c.send(q, "plain after")

        h = c.head(q, streams=True, splits=2)
        assert h.count == 2
        assert streams_read(c, q) == [("a.bin", 0), ("a.bin", 1), ("a.bin", 2),
                                      ("b.bin", 0), ("b.bin", 1)]
        with c.read_range(q, streams=True, max_messages=1) as rng:
            assert len(list(rng)) == 3
        assert rng.head is not None and rng.head.count == 1
        b_final = list(c.read_range(q, streams=True))[-1].seq
        assert h.splits == [b_final]  # stream b starts the second slice
        assert streams_read(c, q, start=rng.head.end) == [("b.bin", 0), ("b.bin", 1)]

        assert stream_states(b.console_url) == {"a": "dispatching", "b": "dispatching",
                                                "c": "receiving"}
        done = c.commit_upto(q, h.next, ledger="files", streams=True)
        assert done.count == 2 and done.committed == h.next
        assert stream_states(b.console_url) == {"a": "complete", "b": "complete",
                                                "c": "receiving"}
        with c.read_range(q) as rest:  # plain messages and the unfinished stream stay
            left = [m.headers.get("sluice-stream-name", m.text()) for m in rest]
        assert left == ["plain before", "c.bin", "c.bin", "plain after"]

        whole = b"c" * 2500
        send_chunks(c, q, "c", [b"c" * 500], first=2, offset=2000, whole=whole)
        assert c.head(q, streams=True, ledger="files").count == 1
    b.kill()
    b.restart()  # classification starts cold: chunk headers are peeked from the journal
    with Client(b.url) as c:
        assert streams_read(c, q, ledger="files") == [("c.bin", 0), ("c.bin", 1), ("c.bin", 2)]
        with c.read_range(q, ledger="files", streams=True) as rng:
            assert b"".join(m.body for m in rng) == whole


def test_a_stream_a_consumer_partly_acknowledged_is_not_whole(broker) -> None:
    q = "/queue/partial"
    with Client(broker.url) as c:
        write_stream(c, q, "p", b"p" * 3000)
        with c.subscribe(q, ack="client-individual") as sub:
            first = sub.get(5)
            assert first is not None
            first.ack(receipt=True)
        assert c.head(q, streams=True).count == 0
        assert c.head(q).count == 2  # its other chunks are still there for a consumer


def test_held_chunks_of_an_unfinished_stream_are_retained_but_not_a_stream(broker_factory) -> None:
    b = broker_factory(config_text=HELD)
    q = "/queue/held.x"
    with Client(b.url) as c:
        send_chunks(c, q, "h", [b"1" * 10, b"2" * 10])  # held until the final chunk comes
        assert c.head(q).count == 2
        assert c.head(q, streams=True).count == 0
        send_chunks(c, q, "h", [b"3"], first=2, offset=20, whole=b"1" * 10 + b"2" * 10 + b"3")
        assert streams_read(c, q) == [("h.bin", 0), ("h.bin", 1), ("h.bin", 2)]
        assert c.commit_upto(q, c.head(q).next, ledger="L", streams=True).count == 1
        assert c.head(q).count == 0
