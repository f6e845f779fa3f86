"""Spec of large streams through the client library, against a real broker process.

Covers the writer and reader file objects, `send_file`/`receive_file`, resume on both
sides, integrity and gap detection, interoperability with a plain stomp.py consumer, and
the broker's answers the stream format defines (duplicate, gap, resume query).
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import stomp
from stomp_helpers import Collector

from sluice_testing import nothing_delivered
from sluicemq.client import AsyncClient, Client
from sluicemq.client.files import PARTIAL_DIR, save_stream
from sluicemq.streaming.chunker import Chunker
from sluicemq.streaming.errors import (
    NoConsumerError,
    StreamAbandonedError,
    StreamIntegrityError,
)

CHUNK = 64 * 1024
# How long a consumer waits for a stream that is on its way: a bound for a failing run only,
# generous because a loaded machine (xdist workers, Spark JVMs) can stall a broker for seconds.
ARRIVAL = 60.0


def send_bytes(client: Client, dest: str, data: bytes, **kw: object) -> str:
    with client.stream_writer(dest, name="blob.bin", chunk_size=CHUNK, **kw) as w:
        shutil.copyfileobj(io.BytesIO(data), w)
    assert w.bytes_written == len(data)
    return w.stream_id


def receive_bytes(client: Client, dest: str, timeout: float = ARRIVAL) -> tuple[bytes, object]:
    for stream in client.streams(dest, timeout=timeout):
        with stream:
            out = io.BytesIO()
            shutil.copyfileobj(stream, out)
        return out.getvalue(), stream
    raise AssertionError("no stream arrived")


def raw_chunks(data: bytes, stream_id: str, chunk_size: int = CHUNK) -> list[tuple[dict, bytes]]:
    """The (headers, body) of every chunk, as the wire format defines them."""
    c = Chunker(stream_id, "raw.bin", chunk_size)
    chunks = [*c.feed(data), c.finish()]
    return [({**ch.info.headers(), "persistent": "true"}, ch.body) for ch in chunks]


def raw_send(conn, dest: str, headers: dict, body: bytes, receipt: str):
    conn.send("SEND", {"destination": dest, "receipt": receipt, **headers}, body)
    return conn.recv()


def wait_for_receipt(conn: Any, receipt: str) -> None:
    """Wait until ``receipt`` arrives: the ACKs sent before it are durable. A MESSAGE that
    overtakes it is left unacknowledged - the consumer is about to die anyway."""
    while True:
        frame = conn.recv()
        if frame.command == "RECEIPT" and frame.headers.get("receipt-id") == receipt:
            return
        assert frame.command == "MESSAGE", frame


@pytest.mark.parametrize("size", [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 5])
def test_round_trip_keeps_every_byte(broker, size: int) -> None:
    data = os.urandom(size)
    with Client(broker.url) as c:
        sid = send_bytes(c, "/queue/rt", data)
        got, stream = receive_bytes(c, "/queue/rt")
    assert got == data
    assert (stream.id, stream.name, stream.size, stream.offset) == (sid, "blob.bin", size, 0)
    assert stream.verified


def test_hundred_mib_in_bounded_memory_and_small_chunks(broker, tmp_path: Path) -> None:
    src = tmp_path / "big.bin"
    with open(src, "wb") as f:
        for _ in range(100):
            f.write(os.urandom(1 << 20))
    with Client(broker.url) as producer, Client(broker.url) as consumer:
        result: dict[str, Path] = {}
        t = threading.Thread(target=lambda: result.setdefault(
            "path", consumer.receive_file("/queue/big", tmp_path / "out", timeout=ARRIVAL)))
        t.start()
        started = time.monotonic()
        producer.send_file("/queue/big", src, chunk_size=256 * 1024, window=8)
        t.join(60)
        elapsed = time.monotonic() - started
    out = result["path"]
    assert out == tmp_path / "out" / "big.bin"
    assert out.stat().st_size == 100 << 20
    assert _sha(out) == _sha(src)
    assert not list((tmp_path / "out" / PARTIAL_DIR).glob("*.part"))
    print(f"100 MiB through the broker in {elapsed:.1f}s ({100 / elapsed:.0f} MiB/s)")


def test_user_headers_ride_on_every_chunk(broker) -> None:
    with Client(broker.url) as c:
        send_bytes(c, "/queue/h", os.urandom(2 * CHUNK + 1), headers={"owner": "ana"})
        sub = c.subscribe("/queue/h")
        chunks = [sub.get(5) for _ in range(3)]
    assert all(m is not None and m.headers["owner"] == "ana" for m in chunks)
    assert all(m.headers["content-type"] == "application/octet-stream" for m in chunks)
    assert [m.headers["sluice-stream-seq"] for m in chunks] == ["0", "1", "2"]
    with Client(broker.url) as c, pytest.raises(ValueError, match="reserved"):
        c.stream_writer("/queue/h", headers={"sluice-stream-seq": "7"})


def test_streams_arrive_one_after_another(broker) -> None:
    blobs = [os.urandom(n) for n in (5, 3 * CHUNK, 0, CHUNK + 7)]
    with Client(broker.url) as c:
        ids = [send_bytes(c, "/queue/many", b) for b in blobs]
        got = []
        with c.streams("/queue/many", window=2, timeout=ARRIVAL) as streams:
            for stream in streams:
                got.append((stream.id, stream.read()))
                if len(got) == len(blobs):
                    break
        assert c.head("/queue/many").count == 0
    assert got == list(zip(ids, blobs, strict=True))


def test_wrong_sha_is_detected_and_never_lands_under_the_final_name(
        broker, raw, tmp_path: Path) -> None:
    data = os.urandom(2 * CHUNK + 3)
    chunks = raw_chunks(data, "corrupt1")
    headers, body = chunks[-1]
    chunks[-1] = ({**headers, "sluice-stream-sha256": hashlib.sha256(b"other").hexdigest()},
                  body)
    producer = raw()
    producer.connect()
    for i, (h, b) in enumerate(chunks):
        assert raw_send(producer, "/queue/bad", h, b, f"r{i}").command == "RECEIPT"
    with Client(broker.url) as c, pytest.raises(StreamIntegrityError, match="corrupt"):
        c.receive_file("/queue/bad", tmp_path, timeout=ARRIVAL)
    assert not (tmp_path / "raw.bin").exists()
    # The refused tail comes back (resumed), and the re-hashed part file fails it again.
    with Client(broker.url) as c, pytest.raises(StreamIntegrityError, match="corrupt"):
        c.receive_file("/queue/bad", tmp_path, timeout=ARRIVAL)
    assert not (tmp_path / "raw.bin").exists()


def test_a_plain_stomp_consumer_can_reassemble_a_stream(broker) -> None:
    data = os.urandom(3 * CHUNK + 11)
    with Client(broker.url) as c:
        sid = send_bytes(c, "/queue/plain", data)
    conn = stomp.Connection12([(broker.host, broker.port)], heartbeats=(0, 0),
                              auto_decode=False)
    listener = Collector()
    conn.set_listener("c", listener)
    conn.connect(wait=True)
    try:
        conn.subscribe("/queue/plain", id="1", ack="client-individual")
        parts: dict[int, bytes] = {}
        final = None
        while final is None:
            frame = listener.next()
            h = frame.headers
            assert h["sluice-stream-id"] == h["JMSXGroupID"] == sid
            assert h["sluice-stream-name"] == "blob.bin"
            body = frame.body
            assert int(h["sluice-stream-offset"]) == sum(len(p) for p in parts.values())
            parts[int(h["sluice-stream-seq"])] = body
            conn.ack(h["ack"])
            if h.get("sluice-stream-final") == "true":
                final = h
        whole = b"".join(parts[i] for i in sorted(parts))
        assert int(final["sluice-stream-size"]) == len(whole)
        assert final["sluice-stream-sha256"] == hashlib.sha256(whole).hexdigest()
        assert whole == data
    finally:
        conn.disconnect()


def test_leaving_a_stream_early_gives_the_rest_to_another_consumer(broker) -> None:
    data = os.urandom(4 * CHUNK)
    with Client(broker.url) as c:
        send_bytes(c, "/queue/early", data)
        with c.streams("/queue/early", window=2, timeout=ARRIVAL) as streams:
            stream = next(streams)
            with stream:
                assert stream.read(10) == data[:10]
    with Client(broker.url) as c:
        got, stream = receive_bytes(c, "/queue/early")
    assert got == data[stream.offset:]
    assert stream.verified or stream.offset > 0


# ---------------------------------------------------------------- broker stream semantics


def test_a_resent_chunk_is_receipted_as_duplicate_and_stored_once(broker, raw) -> None:
    data = os.urandom(2 * CHUNK + 1)
    chunks = raw_chunks(data, "dup1")
    producer = raw()
    producer.connect()
    first = raw_send(producer, "/queue/dup", *chunks[0], "r0")
    again = raw_send(producer, "/queue/dup", *chunks[0], "r0-again")
    assert first.command == again.command == "RECEIPT"
    assert again.headers.get("sluice-stream-duplicate") == "true"
    for i, (h, b) in enumerate(chunks[1:], 1):
        assert raw_send(producer, "/queue/dup", h, b, f"r{i}").command == "RECEIPT"
    with Client(broker.url) as c:
        got, stream = receive_bytes(c, "/queue/dup")
        assert got == data and stream.verified
        assert nothing_delivered(c, c.subscribe("/queue/dup"))


def test_a_chunk_past_the_next_seq_is_refused_as_a_gap(broker, raw) -> None:
    chunks = raw_chunks(os.urandom(3 * CHUNK), "gap1")
    producer = raw()
    producer.connect()
    assert raw_send(producer, "/queue/gap", *chunks[0], "r0").command == "RECEIPT"
    refused = raw_send(producer, "/queue/gap", *chunks[2], "r2")
    assert refused.command == "ERROR"
    assert refused.headers["receipt-id"] == "r2"
    assert refused.headers["message"].startswith("stream gap")
    assert refused.headers["sluice-stream-next-seq"] == "1"


def test_resume_query_reports_where_a_stream_stopped(broker) -> None:
    data = os.urandom(5 * CHUNK + 9)
    with Client(broker.url) as c:
        with pytest.raises(RuntimeError), c.stream_writer(
                "/queue/res", name="r.bin", chunk_size=CHUNK, stream_id="res1",
                window=1) as w:
            w.write(data[:3 * CHUNK + 100])  # chunks 0..2 go out; the 4th is still buffered
            raise RuntimeError("producer interrupted")
        with c.stream_writer("/queue/res", name="r.bin", chunk_size=CHUNK,
                             stream_id="res1", resume=True) as w2:
            assert w2.resume_point is not None
            assert (w2.resume_point.next_seq, w2.resume_point.state) == (3, "open")
            assert w2.resumed_at == 3 * CHUNK
            w2.write(data)
        with c.stream_writer("/queue/res", stream_id="res1", resume=True) as w3:
            assert w3.already_complete
            w3.write(data)
        got, stream = receive_bytes(c, "/queue/res")
    assert got == data and stream.verified


def test_send_file_rerun_resumes_instead_of_resending(broker, tmp_path: Path) -> None:
    src = tmp_path / "file.bin"
    src.write_bytes(os.urandom(10 * CHUNK + 1))

    def interrupt(done: int, total: int | None) -> None:
        if done >= 4 * CHUNK:
            raise KeyboardInterrupt

    with Client(broker.url) as c:
        with pytest.raises(KeyboardInterrupt):
            c.send_file("/queue/sf", src, chunk_size=CHUNK, window=1, progress=interrupt)
        writer = c.send_file("/queue/sf", src, chunk_size=CHUNK)
        assert writer.resumed_at >= 3 * CHUNK
        path = c.receive_file("/queue/sf", tmp_path / "out", timeout=ARRIVAL)
    assert path.read_bytes() == src.read_bytes()


def test_wait_for_consumer_holds_the_writer_until_someone_subscribes(broker) -> None:
    with Client(broker.url) as c:
        with pytest.raises(NoConsumerError):
            c.stream_writer("/queue/nobody", wait_for_consumer=0.5)
        consumer = Client(broker.url)
        timer = threading.Timer(0.5, lambda: consumer.streams("/queue/wait"))
        timer.start()
        started = time.monotonic()
        with c.stream_writer("/queue/wait", wait_for_consumer=10) as w:
            w.write(b"hello")
        assert time.monotonic() - started >= 0.4
        timer.join()
        consumer.close()


def test_a_delivery_resumed_after_a_consumer_died_continues_the_part_file(
        broker, raw, tmp_path: Path) -> None:
    data = os.urandom(6 * CHUNK + 5)
    with Client(broker.url) as c:
        sid = send_bytes(c, "/queue/died", data)
    first = raw()
    first.connect()
    first.send("SUBSCRIBE", {"destination": "/queue/died", "id": "1",
                             "ack": "client-individual", "activemq.prefetchSize": "2",
                             "sluice-max-streams": "1"})
    chunks = [first.recv(), first.recv()]  # takes two chunks, writes them, acks them, dies
    first.send("ACK", {"id": chunks[0].headers["ack"]})
    first.send("ACK", {"id": chunks[1].headers["ack"], "receipt": "acked"})
    wait_for_receipt(first, "acked")
    partial = tmp_path / PARTIAL_DIR
    partial.mkdir()
    (partial / f"{sid}.part").write_bytes(data[:2 * CHUNK] + b"unacknowledged junk")
    first.close()
    with Client(broker.url) as c:
        stream = next(c.streams("/queue/died", timeout=ARRIVAL))
        assert stream.offset == 2 * CHUNK
        assert stream.headers.get("sluice-stream-resumed") == "true"
        path = save_stream(stream, tmp_path)
    assert path.read_bytes() == data
    assert stream.verified


def test_a_resumed_delivery_without_its_part_file_is_refused(broker, raw, tmp_path) -> None:
    data = os.urandom(3 * CHUNK)
    with Client(broker.url) as c:
        send_bytes(c, "/queue/nopart", data)
    first = raw()
    first.connect()
    first.send("SUBSCRIBE", {"destination": "/queue/nopart", "id": "1",
                             "ack": "client-individual", "activemq.prefetchSize": "1"})
    first.send("ACK", {"id": first.recv().headers["ack"], "receipt": "acked"})
    wait_for_receipt(first, "acked")
    first.close()
    with Client(broker.url) as c, pytest.raises(Exception, match="cannot resume"):
        c.receive_file("/queue/nopart", tmp_path, timeout=ARRIVAL)
    assert not (tmp_path / "blob.bin").exists()


# ---------------------------------------------------------------- asyncio client


def test_async_round_trip_and_files(broker, tmp_path: Path) -> None:
    data = os.urandom(3 * CHUNK + 1)
    src = tmp_path / "a.bin"
    src.write_bytes(os.urandom(2 * CHUNK))

    async def scenario() -> tuple[bytes, Path]:
        c = await AsyncClient.connect(broker.url)
        try:
            async with c.stream_writer("/queue/aio", name="x", chunk_size=CHUNK) as w:
                for i in range(0, len(data), 1000):
                    await w.write(data[i:i + 1000])
            got = b""
            async with c.streams("/queue/aio", timeout=ARRIVAL) as streams:
                async for stream in streams:
                    async with stream:
                        while block := await stream.read(10_000):
                            got += block
                    assert stream.verified
                    break
            await c.send_file("/queue/aiof", src, chunk_size=CHUNK)
            path = await c.receive_file("/queue/aiof", tmp_path / "out", timeout=ARRIVAL)
            return got, path
        finally:
            await c.disconnect()

    got, path = asyncio.run(scenario())
    assert got == data
    assert path.read_bytes() == src.read_bytes()


def _sha(path: Path) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            sha.update(block)
    return sha.hexdigest()


def test_an_abandoned_stream_raises_and_leaves_no_file(broker_factory, tmp_path: Path) -> None:
    b = broker_factory(config_text='[[policy]]\nqueue = ">"\nstream_timeout = 1.0\n',
                       name="abandon")
    with Client(b.url) as c:
        with pytest.raises(RuntimeError), c.stream_writer(
                "/queue/ab", name="gone.bin", chunk_size=CHUNK, stream_id="ab1") as w:
            w.write(os.urandom(2 * CHUNK + 1))
            raise RuntimeError("producer vanished")
        with pytest.raises(StreamAbandonedError):
            c.receive_file("/queue/ab", tmp_path, timeout=ARRIVAL)
    assert not (tmp_path / "gone.bin").exists()


def test_restart_policy_redelivers_from_zero_and_the_part_file_starts_over(
        broker_factory, raw, tmp_path: Path) -> None:
    b = broker_factory(config_text='[[policy]]\nqueue = ">"\nstream_redelivery = "restart"\n',
                       name="restart")
    data = os.urandom(4 * CHUNK)
    with Client(b.url) as c:
        send_bytes(c, "/queue/rs", data)
    first = raw(b)
    first.connect()
    first.send("SUBSCRIBE", {"destination": "/queue/rs", "id": "1",
                             "ack": "client-individual", "activemq.prefetchSize": "1"})
    first.send("ACK", {"id": first.recv().headers["ack"], "receipt": "acked"})
    wait_for_receipt(first, "acked")
    first.close()
    with Client(b.url) as c:
        path = c.receive_file("/queue/rs", tmp_path, timeout=ARRIVAL)
    assert path.read_bytes() == data


def test_send_file_twice_sends_once_unless_again_with_both_clients(broker, tmp_path: Path) -> None:
    """A file the broker holds complete for a destination is not sent again (the writer says
    `already_complete`) unless `again=True`, which sends another copy as a stream of its own;
    another destination is always another stream. The asyncio client behaves the same."""
    src = tmp_path / "f.bin"
    src.write_bytes(os.urandom(200_000))
    with Client(broker.url) as c:
        first = c.send_file("/queue/twice", src, chunk_size=CHUNK)
        skipped = c.send_file("/queue/twice", src, chunk_size=CHUNK)
        copy = c.send_file("/queue/twice", src, chunk_size=CHUNK, again=True)
        other = c.send_file("/queue/twice-b", src, chunk_size=CHUNK)
    assert not first.already_complete and skipped.already_complete
    assert skipped.stream_id == first.stream_id and skipped.bytes_written == 0
    assert len({first.stream_id, copy.stream_id, other.stream_id}) == 3
    assert not copy.already_complete and copy.bytes_written == 200_000

    async def scenario() -> tuple[bool, bool, str]:
        c = await AsyncClient.connect(broker.url)
        try:
            again = await c.send_file("/queue/twice", src, chunk_size=CHUNK)
            third = await c.send_file("/queue/twice", src, chunk_size=CHUNK, again=True)
            return again.already_complete, third.already_complete, third.stream_id
        finally:
            await c.disconnect()

    skipped_aio, third_complete, third_id = asyncio.run(scenario())
    assert skipped_aio and not third_complete
    assert third_id not in {first.stream_id, copy.stream_id}
    with Client(broker.url) as c:
        paths = [c.receive_file("/queue/twice", tmp_path / f"out{i}", timeout=ARRIVAL)
                 for i in range(3)]
        assert c.head("/queue/twice").count == 0
    assert all(p.read_bytes() == src.read_bytes() for p in paths)


def test_streams_with_a_count_end_there_and_take_nothing_of_the_next_stream(
        broker, tmp_path: Path) -> None:
    """``streams(count=N)`` (both clients) ends after N streams without waiting for its
    timeout, and ``receive_file`` takes one: the broker hands them no chunk of the stream
    after (sluice-stream-credit), however wide the window."""
    blobs = [os.urandom(5 * 4096 + i) for i in range(5)]

    def delivered() -> list[int]:
        by_name = {s["name"]: s["delivered_bytes"] for s in broker.api("streams")["streams"]}
        return [by_name[f"b{i}"] for i in range(len(blobs))]

    with Client(broker.url) as c:
        for i, blob in enumerate(blobs):
            with c.stream_writer("/queue/counted", name=f"b{i}", chunk_size=4096) as w:
                w.write(blob)
        with c.streams("/queue/counted", window=16, timeout=None, count=2) as streams:
            got = [stream.read() for stream in streams]
        assert got == blobs[:2]
        assert delivered() == [len(b) for b in blobs[:2]] + [0, 0, 0]
        path = c.receive_file("/queue/counted", tmp_path / "sync", window=16, timeout=ARRIVAL)
        assert path.read_bytes() == blobs[2] and delivered()[3:] == [0, 0]

    async def scenario() -> tuple[list[bytes], Path]:
        async with await AsyncClient.connect(broker.url) as ac:
            got = []
            async with ac.streams("/queue/counted", window=16, count=1) as streams:
                async for stream in streams:
                    async with stream:
                        got.append(await stream.read())
            assert delivered()[4] == 0
            path = await ac.receive_file("/queue/counted", tmp_path / "aio", window=16,
                                         timeout=ARRIVAL)
            return got, path

    got_async, last = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert got_async == [blobs[3]] and last.read_bytes() == blobs[4]
    assert delivered() == [len(b) for b in blobs]
