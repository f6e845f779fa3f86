"""Broker-side stream semantics over raw STOMP, as any client in any language would see them."""

from __future__ import annotations

import hashlib

import pytest

from sluice_testing import eventually


def chunk_headers(sid: str, seq: int, offset: int, body: bytes, *, final: bool = False,
                  size: int | None = None, sha: str = "", dest: str = "/queue/files",
                  receipt: str | None = None) -> dict[str, str]:
    h = {"destination": dest, "persistent": "true", "sluice-stream-id": sid,
         "JMSXGroupID": sid, "sluice-stream-seq": str(seq), "sluice-stream-offset": str(offset),
         "sluice-stream-name": f"{sid}.bin", "receipt": receipt or f"{sid}-{seq}"}
    if final:
        h.update({"sluice-stream-final": "true", "sluice-stream-size": str(size),
                  "sluice-stream-sha256": sha})
    return h


def send_stream(conn, sid: str, chunks: list[bytes], dest: str = "/queue/files",
                final: bool = True) -> None:
    """Send chunks with receipts (waiting for each), the last one final."""
    offset = 0
    total = sum(len(c) for c in chunks)
    digest = hashlib.sha256(b"".join(chunks)).hexdigest()
    for seq, body in enumerate(chunks):
        is_final = final and seq == len(chunks) - 1
        conn.send("SEND", chunk_headers(sid, seq, offset, body, final=is_final, size=total,
                                        sha=digest, dest=dest), body)
        frame = conn.recv()
        assert frame.command == "RECEIPT", frame
        offset += len(body)


def subscribe(conn, dest: str = "/queue/files", max_streams: int = 1, prefetch: int = 2,
              sub: str = "s", credit: int | None = None) -> None:
    headers = {"destination": dest, "id": sub, "ack": "client-individual",
               "activemq.prefetchSize": str(prefetch), "sluice-max-streams": str(max_streams),
               "receipt": "sub"}
    if credit is not None:
        headers["sluice-stream-credit"] = str(credit)
    conn.send("SUBSCRIBE", headers)
    wait_receipt(conn, "sub")


def wait_receipt(conn, receipt_id: str) -> None:
    """Read up to the RECEIPT; MESSAGE frames that overtake it stay queued in order."""
    early = []
    while (frame := conn.recv()).command != "RECEIPT":
        early.append(frame)
    assert frame.headers["receipt-id"] == receipt_id
    conn.frames[:0] = early


def ack_and_wait(conn, ack_id: str) -> None:
    """ACK with a receipt; MESSAGE frames that overtake the RECEIPT stay queued in order."""
    conn.send("ACK", {"id": ack_id, "receipt": f"ack-{ack_id}"})
    wait_receipt(conn, f"ack-{ack_id}")


def test_duplicate_chunk_is_stored_once(raw) -> None:
    p = raw()
    p.connect()
    body = b"a" * 100
    for _ in range(2):
        p.send("SEND", chunk_headers("dup", 0, 0, body, receipt="r"), body)
        frame = p.recv()
        assert frame.command == "RECEIPT"
    assert frame.headers.get("sluice-stream-duplicate") == "true"
    c = raw()
    c.connect()
    subscribe(c)
    assert c.recv().headers["sluice-stream-seq"] == "0"
    assert c.nothing_delivered()


def test_gap_is_refused_with_the_expected_sequence(raw) -> None:
    p = raw()
    p.connect()
    send_stream(p, "gap", [b"x" * 10], final=False)
    p.send("SEND", chunk_headers("gap", 2, 20, b"y" * 10, receipt="g"), b"y" * 10)
    frame = p.recv()
    assert frame.command == "ERROR"
    assert frame.headers["message"].startswith("stream gap")
    assert frame.headers["sluice-stream-next-seq"] == "1"
    assert frame.headers["receipt-id"] == "g"
    p.send("SEND", chunk_headers("gap", 1, 10, b"z" * 10, receipt="ok"), b"z" * 10)
    assert p.recv().command == "RECEIPT"  # the connection is still usable


def test_resume_query_reports_where_to_continue(raw) -> None:
    p = raw()
    p.connect()
    p.send("SEND", {"destination": "/queue/files", "sluice-stream-query": "nope",
                    "receipt": "q0"})
    assert p.recv().headers["sluice-stream-state"] == "unknown"
    send_stream(p, "q", [b"1" * 10, b"2" * 7], final=False)
    p.send("SEND", {"destination": "/queue/files", "sluice-stream-query": "q", "receipt": "q1"})
    answer = p.recv()
    assert answer.headers["sluice-stream-next-seq"] == "2"
    assert answer.headers["sluice-stream-next-offset"] == "17"
    assert answer.headers["sluice-stream-state"] == "open"


def test_max_streams_one_never_interleaves(raw) -> None:
    a, b = raw(), raw()
    a.connect()
    b.connect()
    for seq in range(4):  # two producers, chunks interleaved in time
        for conn, sid in ((a, "A"), (b, "B")):
            body = f"{sid}{seq}".encode()
            final = seq == 3
            conn.send("SEND", chunk_headers(sid, seq, seq * 2, body, final=final, size=8,
                                            sha="x"), body)
            assert conn.recv().command == "RECEIPT"
    c = raw()
    c.connect()
    subscribe(c, prefetch=10)
    order = []
    for _ in range(8):
        f = c.recv()
        order.append(f.body.decode())
        c.send("ACK", {"id": f.headers["ack"]})
    first = order[0][0]
    second = "B" if first == "A" else "A"
    assert order == [f"{first}{i}" for i in range(4)] + [f"{second}{i}" for i in range(4)]


def test_streams_wait_for_a_busy_consumer_but_go_to_a_free_one(raw) -> None:
    p = raw()
    p.connect()
    send_stream(p, "S1", [b"a", b"b"])
    send_stream(p, "S2", [b"c", b"d"])
    c1, c2 = raw(), raw()
    c1.connect()
    c2.connect()
    subscribe(c1, prefetch=10)
    subscribe(c2, prefetch=10)
    got = {}
    for c in (c1, c2):
        frames = [c.recv(), c.recv()]
        got[frames[0].headers["sluice-stream-id"]] = [f.body for f in frames]
    assert got == {"S1": [b"a", b"b"], "S2": [b"c", b"d"]}


def _stream_then_die(raw, policy_broker, sid: str, n: int = 5):
    p = raw(policy_broker)
    p.connect()
    send_stream(p, sid, [bytes([65 + i]) * 4 for i in range(n)])
    c = raw(policy_broker)
    c.connect()
    subscribe(c, prefetch=1)
    for _ in range(2):  # consume and ack two chunks, take a third and die
        f = c.recv()
        ack_and_wait(c, f.headers["ack"])
    assert c.recv().headers["sluice-stream-seq"] == "2"
    c.close()
    eventually(lambda: len(policy_broker.api("connections")["connections"]) == 1,
               "the consumer's death seen by the broker (only the producer left)")
    nxt = raw(policy_broker)
    nxt.connect()
    return nxt


def test_consumer_death_resumes_from_first_unacked_chunk(raw, broker) -> None:
    nxt = _stream_then_die(raw, broker, "res")
    subscribe(nxt, prefetch=10)
    first = nxt.recv()
    assert first.headers["sluice-stream-seq"] == "2"
    assert first.headers["sluice-stream-offset"] == "8"
    assert first.headers["sluice-stream-resumed"] == "true"
    assert first.headers["redelivered"] == "true"
    assert [nxt.recv().headers["sluice-stream-seq"] for _ in range(2)] == ["3", "4"]


def test_restart_policy_redelivers_from_chunk_zero(raw, broker_factory) -> None:
    b = broker_factory(config_text='[[policy]]\nqueue = ">"\nstream_redelivery = "restart"\n',
                       name="restart")
    nxt = _stream_then_die(raw, b, "rst")
    subscribe(nxt, prefetch=10)
    seqs = [nxt.recv().headers["sluice-stream-seq"] for _ in range(5)]
    assert seqs == ["0", "1", "2", "3", "4"]


def test_discard_policy_moves_the_rest_to_the_dlq(raw, broker_factory) -> None:
    b = broker_factory(config_text='[[policy]]\nqueue = "files"\nstream_redelivery = "discard"\n',
                       name="discard")
    nxt = _stream_then_die(raw, b, "dsc")
    subscribe(nxt, prefetch=10)
    assert nxt.nothing_delivered()
    subscribe(nxt, dest="/queue/DLQ.files", max_streams=0, prefetch=10, sub="d")
    seqs = sorted(int(nxt.recv().headers["sluice-stream-seq"]) for _ in range(3))
    assert seqs == [2, 3, 4]


def test_complete_mode_dispatches_nothing_before_the_final_chunk(raw, broker_factory) -> None:
    b = broker_factory(config_text='[[policy]]\nqueue = ">"\nstream_dispatch = "complete"\n',
                       name="complete")
    c = raw(b)
    c.connect()
    subscribe(c, prefetch=10)
    p = raw(b)
    p.connect()
    send_stream(p, "cm", [b"1", b"2"], final=False)
    assert c.nothing_delivered()  # a complete stream only: nothing before its final chunk
    body = b"3"
    p.send("SEND", chunk_headers("cm", 2, 2, body, final=True, size=3, sha="x"), body)
    assert p.recv().command == "RECEIPT"
    assert [c.recv().body for _ in range(3)] == [b"1", b"2", b"3"]


def test_abandoned_stream_errors_its_consumer_and_goes_to_dlq(raw, broker_factory) -> None:
    b = broker_factory(config_text='[[policy]]\nqueue = ">"\nstream_timeout = 1.0\n',
                       name="abandon")
    c = raw(b)
    c.connect()
    subscribe(c, prefetch=10)
    p = raw(b)
    p.connect()
    send_stream(p, "ab", [b"1", b"2"], final=False)
    assert [c.recv().body for _ in range(2)] == [b"1", b"2"]
    err = c.recv(timeout=5)
    assert err.command == "ERROR"
    assert err.headers["message"].startswith("stream abandoned")
    assert err.headers["sluice-stream-id"] == "ab"
    subscribe(c, dest="/queue/DLQ.files", max_streams=0, prefetch=10, sub="d")
    assert sorted(c.recv().body for _ in range(2)) == [b"1", b"2"]
    p.send("SEND", chunk_headers("ab", 2, 2, b"3", receipt="late"), b"3")
    late = p.recv()
    assert late.command == "ERROR" and "abandoned" in late.headers["message"]


def test_broker_kill_mid_stream_then_both_ends_resume(raw, broker) -> None:
    p = raw()
    p.connect()
    send_stream(p, "k", [b"a" * 5, b"b" * 5, b"c" * 5], final=False)
    c = raw()
    c.connect()
    subscribe(c, prefetch=10)
    for _ in range(2):
        f = c.recv()
        ack_and_wait(c, f.headers["ack"])
    broker.kill()
    broker.restart()
    p = raw()
    p.connect()
    p.send("SEND", {"destination": "/queue/files", "sluice-stream-query": "k", "receipt": "q"})
    answer = p.recv()
    assert answer.headers["sluice-stream-next-seq"] == "3"
    assert answer.headers["sluice-stream-next-offset"] == "15"
    body = b"d" * 5
    p.send("SEND", chunk_headers("k", 3, 15, body, final=True, size=20, sha="x"), body)
    assert p.recv().command == "RECEIPT"
    c = raw()
    c.connect()
    subscribe(c, prefetch=10)
    assert [c.recv().body for _ in range(2)] == [b"c" * 5, b"d" * 5]


def test_wait_for_consumer_holds_the_answer_until_one_subscribes(raw) -> None:
    p = raw()
    p.connect()
    p.send("SEND", {"destination": "/queue/handshake", "sluice-stream-query": "w",
                    "sluice-stream-wait-consumer": "0.5", "receipt": "w0"})
    assert p.recv(timeout=5).headers["sluice-stream-consumers"] == "0"
    p.send("SEND", {"destination": "/queue/handshake", "sluice-stream-query": "w",
                    "sluice-stream-wait-consumer": "30", "receipt": "w1"})
    assert p.nothing_delivered()  # a round trip after it is answered first: w1 waits
    c = raw()
    c.connect()
    subscribe(c, dest="/queue/handshake")
    assert p.recv(timeout=5).headers["sluice-stream-consumers"] == "1"


def test_large_chunks_round_trip_through_the_journal(raw) -> None:
    p = raw()
    p.connect()
    chunks = [bytes([i]) * (1 << 20) for i in range(5)]
    send_stream(p, "big", chunks)
    c = raw()
    c.connect()
    subscribe(c, prefetch=2)
    got = []
    for _ in range(5):
        f = c.recv()
        got.append(f.body)
        c.send("ACK", {"id": f.headers["ack"]})
    assert got == chunks


def test_nack_gives_the_stream_back_in_order(raw) -> None:
    p = raw()
    p.connect()
    send_stream(p, "nk", [b"0", b"1", b"2"])
    c1 = raw()
    c1.connect()
    subscribe(c1, prefetch=10)
    frames = [c1.recv() for _ in range(3)]
    ack_and_wait(c1, frames[0].headers["ack"])
    c2 = raw()
    c2.connect()
    subscribe(c2, prefetch=10)
    c1.send("NACK", {"id": frames[1].headers["ack"], "receipt": "n"})
    wait_receipt(c1, "n")
    got = []
    for conn in (c1, c2):
        try:
            while True:
                got.append((conn, conn.recv(timeout=1)))
        except TimeoutError:
            pass
    assert [f.headers["sluice-stream-seq"] for _, f in got] == ["1", "2"]
    assert got[0][0] is got[1][0], "the rest of a stream goes to one consumer"


def test_stream_credit_ends_the_flow_at_the_last_wanted_streams_end(raw) -> None:
    """``sluice-stream-credit:N``: the consumer is given N streams in all; once it acked the
    Nth one's final chunk it gets no chunk of the next, however wide its window - the next
    consumer gets that stream whole, never delivered before."""
    p = raw()
    p.connect()
    for sid in ("c1", "c2", "c3"):
        send_stream(p, sid, [f"{sid}-{i}".encode() for i in range(3)])
    c = raw()
    c.connect()
    subscribe(c, prefetch=10, credit=2)
    got = []
    for _ in range(6):
        frame = c.recv()
        got.append(frame.body.decode())
        ack_and_wait(c, frame.headers["ack"])
    assert got == [f"{sid}-{i}" for sid in ("c1", "c2") for i in range(3)]
    assert c.nothing_delivered()
    nxt = raw()
    nxt.connect()
    subscribe(nxt, prefetch=10, credit=1)
    frames = [nxt.recv() for _ in range(3)]
    assert [f.body for f in frames] == [b"c3-0", b"c3-1", b"c3-2"]
    assert not any("redelivered" in f.headers for f in frames)


def test_a_stream_given_back_with_nack_does_not_use_up_the_credit(raw) -> None:
    p = raw()
    p.connect()
    send_stream(p, "g1", [b"a", b"b"])
    send_stream(p, "g2", [b"c", b"d"])
    c = raw()
    c.connect()
    subscribe(c, prefetch=10, credit=1)
    first = c.recv()
    assert c.recv().headers["sluice-stream-id"] == first.headers["sluice-stream-id"]
    c.send("NACK", {"id": first.headers["ack"], "receipt": "n"})  # the whole stream back
    wait_receipt(c, "n")
    again = [c.recv(), c.recv()]  # given again: the credit came back with it
    assert [f.headers["sluice-stream-seq"] for f in again] == ["0", "1"]
    for frame in again:
        ack_and_wait(c, frame.headers["ack"])
    assert c.nothing_delivered()


@pytest.mark.parametrize("credit", ["0", "-1", "two", "1.5", " 1", "99999999999", "9" * 5000])
def test_a_bad_stream_credit_gets_an_error_and_the_connection_keeps_serving(raw,
                                                                           credit) -> None:
    c = raw()
    c.connect()
    c.send("SUBSCRIBE", {"destination": "/queue/files", "id": "bad", "ack": "client-individual",
                         "sluice-stream-credit": credit, "receipt": "r"})
    err = c.recv()
    assert err.command == "ERROR" and "sluice-stream-credit" in err.headers["message"], err
    assert err.headers["receipt-id"] == "r"
    subscribe(c, credit=1)  # the same id is free: nothing was made for the refused one
