"""Spec of the bookkeeping both clients share (sans-IO): what a lost connection settles and
what the next one is given, in order, so a failover loses nothing and repeats nothing."""

from __future__ import annotations

import pytest

from sluicemq.client.failover import AckInDoubt, PendingSend, TransactionRolledBack
from sluicemq.client.machine import ClientMachine, MessageReceived, Outgoing
from sluicemq.client.tracker import FrameTags, Loss, Tracker
from sluicemq.errors import ClientError
from sluicemq.protocol.codec import FrameParser, encode_frame
from sluicemq.protocol.frames import Frame


def machine() -> ClientMachine:
    m = ClientMachine(host="a", client_id="c1", heartbeat=(0, 0))
    m.connect()
    m.receive_data(encode_frame(Frame("CONNECTED", {"version": "1.2"}), "1.2"))
    return m


def frames(data: bytes) -> list[Frame]:
    return FrameParser(version="1.2").feed(data)


def send(track: Tracker[str], body: str, waiter: str) -> Outgoing:
    headers = {"sluice-producer-id": "p", "sluice-producer-seq": body}
    out = track.machine.send("/queue/q", body, headers)
    track.sent(out, waiter, FrameTags(PendingSend("/queue/q", body, headers, True)))
    return out


def deliver(track: Tracker[str], sub: str, message_id: str, ack: str = "client-individual"):
    frame = Frame("MESSAGE", {"subscription": sub, "message-id": message_id,
                              "destination": "/queue/q"})
    return MessageReceived(frame, sub, message_id, ack)


def test_unconfirmed_sends_go_again_in_order_under_their_numbers_and_keep_their_waiters(
) -> None:
    track: Tracker[str] = Tracker(machine(), failover=True)
    outs = [send(track, str(n), f"w{n}") for n in range(4)]
    assert track.receipt(outs[1].receipt) == "w1"  # confirmed: not sent again
    loss = track.lose(ClientError("reset"), "stomp://a:1")
    assert loss.failed == []  # the others wait for the new connection's receipts
    replay = track.replay(machine(), loss, lambda: "new")
    sent = frames(replay.data)
    assert [f.headers["sluice-producer-seq"] for f in sent] == ["0", "2", "3"]
    assert replay.resent == 3
    assert sorted(track.receipts.values()) == ["w0", "w2", "w3"]
    assert track.receipt(sent[1].headers["receipt"]) == "w2"


def test_subscriptions_are_replayed_with_their_ids_and_a_pending_subscribe_keeps_its_waiter(
) -> None:
    track: Tracker[str] = Tracker(machine(), failover=True)
    done = track.machine.subscribe("/topic/t", ack="client", durable_name="feed", id="s-1")
    track.sent(done, "w-done", FrameTags(subscription="s-1"))
    track.receipt(done.receipt)
    pending = track.machine.subscribe("/queue/q", ack="client-individual", id="s-2")
    track.sent(pending, "w-pending", FrameTags(subscription="s-2"))
    loss = track.lose(ClientError("reset"), "stomp://a:1")
    replay = track.replay(machine(), loss, lambda: "fresh")
    subs = frames(replay.data)
    assert [(f.headers["id"], f.headers["ack"]) for f in subs] == \
        [("s-1", "client"), ("s-2", "client-individual")]
    assert subs[0].headers["activemq.subscriptionName"] == "feed"
    assert [track.receipts[f.headers["receipt"]] for f in subs] == ["fresh", "w-pending"]


def test_other_frames_in_flight_fail_naming_the_broker_and_an_ack_is_in_doubt() -> None:
    track: Tracker[str] = Tracker(machine(), failover=True)
    begin = track.machine.begin("tx-1")
    track.sent(begin, "w-begin")
    ack = track.machine.ack("7", "s-1", receipt=True)
    track.sent(ack, "w-ack", FrameTags(acked=("s-1", "ID:7")))
    loss = track.lose(ClientError("reset"), "stomp://a:1")
    failed = dict(loss.failed)
    assert "lost before the broker confirmed" in str(failed["w-begin"])
    assert "stomp://a:1" in str(failed["w-begin"])
    assert isinstance(failed["w-ack"], AckInDoubt)
    track.replay(machine(), loss, lambda: "x")
    assert not track.message(deliver(track, "s-1", "ID:7"))  # its redelivery: acked again
    assert track.message(deliver(track, "s-1", "ID:8"))


def test_open_transactions_are_rolled_back_and_say_so() -> None:
    track: Tracker[str] = Tracker(machine(), failover=True)
    track.begun("tx-1")
    track.begun("tx-2")
    assert track.finishing("tx-2", committing=True)  # committed before the loss
    loss = track.lose(ClientError("reset"), "stomp://a:1")
    assert loss.rolled_back == ("tx-1",)
    with pytest.raises(TransactionRolledBack):
        track.check_transaction("tx-1")
    with pytest.raises(TransactionRolledBack):
        track.finishing("tx-1", committing=True)
    assert track.lost_tx == set()  # told once; the caller retries under a new transaction


def test_an_abort_of_a_lost_transaction_has_nothing_to_send() -> None:
    track: Tracker[str] = Tracker(machine(), failover=True)
    track.begun("tx-1")
    track.lose(ClientError("reset"), "stomp://a:1")
    assert not track.finishing("tx-1", committing=False)


def test_a_commit_lost_in_flight_is_reported_as_rolled_back_only_on_a_failover_client() -> None:
    lost = ClientError("connection lost")
    refused = ClientError("no such transaction", {"message": "no such transaction"})
    with_failover: Tracker[str] = Tracker(machine(), failover=True)
    assert isinstance(with_failover.commit_failed("tx", lost, True), TransactionRolledBack)
    assert with_failover.commit_failed("tx", refused, True) is refused
    plain: Tracker[str] = Tracker(machine(), failover=False)
    assert plain.commit_failed("tx", lost, True) is lost


def test_range_reads_end_instead_of_being_replayed() -> None:
    track: Tracker[str] = Tracker(machine(), failover=True)
    track.machine.subscribe("/queue/q", headers={"browser": "true"}, id="r-1")
    track.machine.subscribe("/queue/q", id="s-1")
    loss = track.lose(ClientError("reset"), "stomp://a:1")
    assert loss.ranges == ["r-1"]
    replay = track.replay(machine(), loss, lambda: "x")
    assert [f.headers["id"] for f in frames(replay.data)] == ["s-1"]


def test_what_was_delivered_and_not_acknowledged_comes_back_redelivered() -> None:
    track: Tracker[str] = Tracker(machine(), failover=True)
    for mid in ("1", "2", "3"):
        assert track.message(deliver(track, "s", mid))
    assert track.acknowledging("ACK", "s", "1", "client-individual", track.epoch, False)
    track.replay(machine(), track.lose(ClientError("reset"), "a"), lambda: "x")
    again = [deliver(track, "s", mid) for mid in ("2", "3", "4")]
    for event in again:
        track.message(event)
    assert [e.frame.headers.get("redelivered") for e in again] == ["true", "true", None]


def test_client_mode_acknowledges_everything_before_the_acked_message() -> None:
    track: Tracker[str] = Tracker(machine(), failover=True)
    for mid in ("1", "2", "3"):
        track.message(deliver(track, "s", mid, ack="client"))
    track.acknowledging("ACK", "s", "2", "client", track.epoch, False)
    track.replay(machine(), track.lose(ClientError("reset"), "a"), lambda: "x")
    again = [deliver(track, "s", mid, ack="client") for mid in ("1", "3")]
    for event in again:
        track.message(event)
    assert [e.frame.headers.get("redelivered") for e in again] == [None, "true"]


def test_an_ack_of_a_message_from_the_lost_connection_is_not_written() -> None:
    track: Tracker[str] = Tracker(machine(), failover=True)
    track.message(deliver(track, "s", "1"))
    track.message(deliver(track, "s", "2"))
    old = track.epoch
    track.lose(ClientError("reset"), "a")
    assert track.stale(old, "client-individual") and not track.stale(old, "auto")
    assert not track.acknowledging("ACK", "s", "1", "client-individual", old, False)
    with pytest.raises(AckInDoubt):
        track.acknowledging("ACK", "s", "2", "client-individual", old, True)
    assert not track.acknowledging("NACK", "s", "3", "client-individual", old, True)
    track.replay(machine(), _no_loss(track), lambda: "x")
    assert not track.message(deliver(track, "s", "1"))  # acknowledged for the caller
    assert not track.message(deliver(track, "s", "2"))
    assert track.message(deliver(track, "s", "3"))


def _no_loss(track: Tracker[str]) -> Loss[str]:
    return Loss("a", [], {}, (), [])


def test_a_client_without_failover_keeps_no_sends_and_fails_every_waiter_at_the_end() -> None:
    track: Tracker[str] = Tracker(machine(), failover=False)
    out = send(track, "1", "w1")
    assert track.inflight == {} and track.receipts == {out.receipt: "w1"}
    assert track.fail() == ["w1"]
    assert track.receipts == {}


def test_sends_held_while_failing_over_go_out_with_the_replay_and_fail_with_the_client(
) -> None:
    track: Tracker[str] = Tracker(machine(), failover=True)
    loss = track.lose(ClientError("reset"), "a")
    track.hold(PendingSend("/queue/q", "late", {}, True), "w-late")
    replay = track.replay(machine(), loss, lambda: "x")
    assert [bytes(f.body) for f in frames(replay.data)] == [b"late"]
    assert track.fail() == ["w-late"]
