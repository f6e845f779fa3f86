"""Spec of the broker's large-stream table (core/routing/streams.py), in process: while a
stream is open its newest chunk's record stays on disk even when every chunk was consumed (a
restarted broker still knows where the producer resumes); each newer chunk takes that over,
and the finished stream lets go of it (Store.keep_appended / let_go)."""

from __future__ import annotations

from pathlib import Path

from inprocess import InProcessBroker, config_for


def pins(node: InProcessBroker) -> int:
    return sum(n for _seg, n in node.core.store.journal.live_counts())


def settle_at(node: InProcessBroker, expected: int) -> None:
    node.loop.run_until(lambda: node.core.store.idle and pins(node) == expected)


def chunk(seq: int, *, final: bool = False) -> dict[str, str]:
    headers = {"destination": "/queue/files", "persistent": "true",
               "sluice-stream-id": "s1", "JMSXGroupID": "s1", "sluice-stream-seq": str(seq),
               "sluice-stream-offset": str(seq * 4), "sluice-stream-name": "f.bin"}
    if final:
        headers |= {"sluice-stream-final": "true", "sluice-stream-size": str(seq * 4 + 4)}
    return headers


def test_an_open_stream_keeps_its_newest_chunk_and_a_finished_one_nothing(
        tmp_path: Path) -> None:
    node = InProcessBroker(config_for(tmp_path / "data"))
    producer, consumer = node.connect(), node.connect(peer="spec:2")
    consumer.request("SUBSCRIBE", {"destination": "/queue/files", "id": "s"})
    for seq in range(3):
        assert producer.request("SEND", chunk(seq), b"data").command == "RECEIPT"
    assert len(consumer.messages(3)) == 3  # auto ack: the queue let go of all three
    settle_at(node, 1)  # the third chunk, kept by the stream alone
    node = node.restart()
    try:
        [st] = node.broker.large_streams.open.values()
        assert (st.next_seq, st.next_offset) == (3, 12)  # where the producer resumes
        producer, consumer = node.connect(), node.connect(peer="spec:2")
        consumer.request("SUBSCRIBE", {"destination": "/queue/files", "id": "s"})
        assert producer.request("SEND", chunk(3, final=True), b"tail").command == "RECEIPT"
        [last] = consumer.messages(1)
        assert last.headers["sluice-stream-final"] == "true"
        settle_at(node, 0)
        assert not node.broker.large_streams.open
    finally:
        node.close()
