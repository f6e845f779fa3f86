"""Spec of recovery, in process (tests/inprocess.py): what a broker core rebuilt on the same
data directory holds - from the index snapshot and from the journal - without a subprocess."""

from __future__ import annotations

from pathlib import Path

import pytest

from inprocess import InProcessBroker, config_for


def test_persistent_messages_survive_a_restart_in_order_and_acked_ones_stay_gone(
        tmp_path: Path) -> None:
    node = InProcessBroker(config_for(tmp_path / "data"))
    producer = node.connect()
    for i in range(6):
        producer.request("SEND", {"destination": "/queue/keep", "persistent": "true"},
                         str(i).encode())
    producer.request("SEND", {"destination": "/queue/keep"}, b"memory only")
    consumer = node.connect(peer="spec:2")
    consumer.request("SUBSCRIBE", {"destination": "/queue/keep", "id": "s", "ack": "client",
                                   "activemq.prefetchSize": "2"})
    first_two = consumer.messages(2)
    consumer.request("ACK", {"id": first_two[-1].headers["ack"]})
    node.loop.run()
    node = node.restart()
    try:
        assert node.core.counts["messages"] == 4
        again = node.connect()
        again.request("SUBSCRIBE", {"destination": "/queue/keep", "id": "s"})
        assert [m.body for m in again.messages(4)] == [b"2", b"3", b"4", b"5"]
    finally:
        node.close()


def test_a_committed_transaction_is_restored_whole_and_an_open_one_not_at_all(
        tmp_path: Path) -> None:
    node = InProcessBroker(config_for(tmp_path / "data"))
    conn = node.connect()
    conn.request("BEGIN", {"transaction": "done"})
    conn.request("BEGIN", {"transaction": "open"})
    for i in range(3):
        conn.request("SEND", {"destination": "/queue/tx", "persistent": "true",
                              "transaction": "done"}, f"d{i}".encode())
        conn.request("SEND", {"destination": "/queue/tx", "persistent": "true",
                              "transaction": "open"}, f"o{i}".encode())
    conn.request("COMMIT", {"transaction": "done"})
    node = node.restart()
    try:
        again = node.connect()
        again.request("SUBSCRIBE", {"destination": "/queue/tx", "id": "s"})
        assert [m.body for m in again.messages(3)] == [b"d0", b"d1", b"d2"]
        node.loop.run()
        assert again.take("MESSAGE") == []
    finally:
        node.close()


def test_a_durable_subscription_keeps_what_was_published_while_it_was_away(
        tmp_path: Path) -> None:
    node = InProcessBroker(config_for(tmp_path / "data"))
    sub = node.connect({"client-id": "c1"})
    sub.request("SUBSCRIBE", {"destination": "/topic/t", "id": "s",
                              "activemq.subscriptionName": "d"})
    sub.request("UNSUBSCRIBE", {"id": "s"})
    node.connect(peer="spec:2").request("SEND", {"destination": "/topic/t",
                                                 "persistent": "true"}, b"while away")
    node = node.restart()
    try:
        back = node.connect({"client-id": "c1"})
        back.request("SUBSCRIBE", {"destination": "/topic/t", "id": "s",
                                   "activemq.subscriptionName": "d"})
        assert [m.body for m in back.messages(1)] == [b"while away"]
    finally:
        node.close()


def test_the_user_share_is_counted_from_the_snapshot_without_reading_records(
        tmp_path: Path) -> None:
    """With ``user_store_limit`` set, a restart charges every stored message to its sender
    again (here security off: ``anonymous``), the senders taken from the index snapshot -
    paged-out lanes over several journal segments column-wise - with no record read; what
    was consumed before stays given back."""
    from dataclasses import replace

    from sluicemq.app import STATE_PARTS
    from sluicemq.config import JournalSettings, Limits
    from sluicemq.core.persistence.capture import save_snapshot

    config = replace(config_for(tmp_path / "data"),
                     limits=replace(Limits(), user_store_limit=1 << 40),
                     journal=JournalSettings(segment_bytes=64 << 10, preallocate=False))
    node = InProcessBroker(config)
    producer = node.connect()
    for i in range(300):
        producer.request("SEND", {"destination": f"/queue/q{i % 2}", "persistent": "true"},
                         b"%04d" % i + b"x" * 1020)
    consumer = node.connect(peer="spec:2")
    consumer.request("SUBSCRIBE", {"destination": "/queue/q1", "id": "s"})
    assert len(consumer.messages(150)) == 150
    node.loop.run()
    save_snapshot(node.broker, STATE_PARTS)  # (as the checkpointer or a clean stop does)
    node = node.restart()
    try:
        shares = node.broker.shares
        assert shares is not None
        assert shares.by_user() == {"anonymous": {"bytes": 150 * 1024, "messages": 150}}
        assert node.core.counts["user_shares"] == 150
        assert node.core.counts["user_shares_read"] == 0, node.core.counts
        again = node.connect()
        again.request("SUBSCRIBE", {"destination": "/queue/q0", "id": "s"})
        assert [m.body[:4] for m in again.messages(150)] == [
            b"%04d" % i for i in range(0, 300, 2)]
        node.loop.run()
        assert shares.used(b"") == 0 and not shares.book.blocks
    finally:
        node.close()


def test_the_user_share_of_a_lane_of_many_blocks_is_counted_block_by_block(
        tmp_path: Path) -> None:
    """A lane longer than a block of slots (``spill.BLOCK``: packed ones, then the open
    one), records in the snapshot's own segment, and records appended after the snapshot:
    every message is charged, and only the senders of those after it are read."""
    from dataclasses import replace

    from sluicemq.app import STATE_PARTS
    from sluicemq.config import JournalSettings, Limits
    from sluicemq.core.paging.spill import BLOCK
    from sluicemq.core.persistence.capture import save_snapshot

    config = replace(config_for(tmp_path / "data"),
                     limits=replace(Limits(), user_store_limit=1 << 40),
                     journal=JournalSettings(segment_bytes=256 << 10, preallocate=False,
                                             sync=False))  # (a clean restart: read back)
    node = InProcessBroker(config)
    producer = node.connect()
    total, after = BLOCK + 1000, 40
    send = {"destination": "/queue/long", "persistent": "true"}
    for i in range(total):
        if i in (total - after - 1, total - 1):  # a receipt: all before it are stored
            producer.request("SEND", send, b"%05d" % i)
        else:
            producer.send_frame("SEND", send, b"%05d" % i)
        if i == total - after - 1:
            save_snapshot(node.broker, STATE_PARTS)
    node = node.restart()
    try:
        shares = node.broker.shares
        assert shares is not None
        assert shares.by_user() == {"anonymous": {"bytes": 5 * total, "messages": total}}
        assert node.core.counts["user_shares"] == total
        assert node.core.counts["user_shares_read"] == after, node.core.counts
        again = node.connect()
        again.request("SUBSCRIBE", {"destination": "/queue/long", "id": "s"})
        assert [m.body for m in again.messages(total)] == [b"%05d" % i for i in range(total)]
        node.loop.run()
        assert shares.used(b"") == 0 and not shares.book.blocks
    finally:
        node.close()


def test_a_start_from_the_snapshot_unpacks_each_packed_block_of_a_backlog_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A paged-out backlog is in the index snapshot as the cursor's packed blocks. The start
    unpacks each whole block once - the segment count that decides whether the snapshot is
    usable learns what the cursor needs to take the block packed - and the queue comes back
    whole and in order."""
    from sluicemq.app import STATE_PARTS
    from sluicemq.core.paging.spill import BLOCK
    from sluicemq.core.persistence.capture import save_snapshot
    from sluicemq.protocol.codec import encode_frame
    from sluicemq.protocol.frames import Frame
    from sluicemq.storage import slotpack, snapshot

    count = 7 * BLOCK + 100  # the cursor seals blocks beyond the few it keeps open
    node = InProcessBroker(config_for(tmp_path / "data"))
    producer = node.connect()
    for start in range(0, count, 1000):  # a thousand frames a read, as a fast producer's
        producer.session.feed(b"".join(
            encode_frame(Frame("SEND", {"destination": "/queue/backlog", "persistent": "true"},
                               b"%05d" % i)) for i in range(start, min(count, start + 1000))))
        node.loop.run()
    producer.request("SEND", {"destination": "/queue/other", "persistent": "true"}, b"last")
    save_snapshot(node.broker, STATE_PARTS)
    node.close()
    snap, why = snapshot.load(tmp_path / "data" / "journal")
    assert snap is not None, why
    blocks = [run for lane in snap.lanes for run in lane.packed]
    assert len(blocks) >= 2 and all(run.skip == 0 for run in blocks)
    real = slotpack.unpack
    unpacked: list[bytes] = []

    def counting(packed: bytes) -> slotpack.Fields:
        unpacked.append(packed)
        return real(packed)

    monkeypatch.setattr(slotpack, "unpack", counting)
    node = InProcessBroker(node.config, node.clock)
    monkeypatch.setattr(slotpack, "unpack", real)
    try:
        assert node.core.counts["snapshot"] == 1
        assert sorted(unpacked) == sorted(run.packed for run in blocks)  # each block once
        consumer = node.connect()
        consumer.request("SUBSCRIBE", {"destination": "/queue/backlog", "id": "s"})
        assert [m.body for m in consumer.messages(count)] == [b"%05d" % i
                                                              for i in range(count)]
    finally:
        node.close()


def test_what_replay_built_is_freed_and_the_heap_trimmed_before_the_broker_serves(
        tmp_path: Path) -> None:
    """Replay's columns of every message it found are garbage once the cursors took them,
    partly in reference cycles: the start collects them and trims the C heap once (a server's
    ``malloc_trim``; here a counter), so a deep backlog's start-up bookkeeping does not stay
    resident."""
    import gc

    from sluicemq.core.persistence.live import LiveSlots
    from sluicemq.core.persistence.recovery import Replay

    node = InProcessBroker(config_for(tmp_path / "data"))
    producer = node.connect()
    for i in range(20):
        producer.request("SEND", {"destination": "/queue/kept", "persistent": "true"},
                         b"%02d" % i)
    node.close()
    trims: list[int] = []
    node = InProcessBroker(node.config, node.clock, trim_heap=lambda: trims.append(1))
    try:
        assert trims == [1]
        assert not [o for o in gc.get_objects() if isinstance(o, Replay | LiveSlots)]
        consumer = node.connect()
        consumer.request("SUBSCRIBE", {"destination": "/queue/kept", "id": "s"})
        assert [m.body for m in consumer.messages(20)] == [b"%02d" % i for i in range(20)]
    finally:
        node.close()


def test_records_two_durable_subscriptions_hold_are_counted_shared_after_a_restart(
        tmp_path: Path) -> None:
    """A topic's persistent messages held by two durable subscriptions, paged out over more
    than a block of slots: the restart finds every record held twice (``Store.shared``, read
    a block at a time), and each subscription still gets all of them."""
    from dataclasses import replace

    from sluicemq.app import STATE_PARTS
    from sluicemq.config import JournalSettings
    from sluicemq.core.paging.spill import BLOCK
    from sluicemq.core.persistence.capture import save_snapshot

    config = replace(config_for(tmp_path / "data"),
                     journal=JournalSettings(segment_bytes=256 << 10, preallocate=False,
                                             sync=False))  # (a clean restart: read back)
    node = InProcessBroker(config)
    durable = {"destination": "/topic/t", "id": "s", "activemq.subscriptionName": "d"}
    for client_id in ("c1", "c2"):
        sub = node.connect({"client-id": client_id}, peer=f"spec:{client_id}")
        sub.request("SUBSCRIBE", durable)
        sub.request("UNSUBSCRIBE", {"id": "s"})
    producer = node.connect()
    total = BLOCK + 500
    send = {"destination": "/topic/t", "persistent": "true"}
    for i in range(total - 1):
        producer.send_frame("SEND", send, b"%05d" % i)
    producer.request("SEND", send, b"%05d" % (total - 1))
    save_snapshot(node.broker, STATE_PARTS)
    node = node.restart()
    try:
        assert node.core.counts["shared_records"] == total
        for client_id in ("c1", "c2"):
            back = node.connect({"client-id": client_id}, peer=f"spec:{client_id}")
            back.request("SUBSCRIBE", durable)
            assert [m.body for m in back.messages(total)] == [b"%05d" % i
                                                             for i in range(total)]
    finally:
        node.close()
