"""Spec of a stream receiver's credit across a failover (sans-IO): a SUBSCRIBE that asked for
N streams (`sluice-stream-credit`) is replayed asking for N less the streams read - those whose
final chunk's ACK the broker confirmed - so the new master hands the receiver no stream past
its Nth; one that read all N is not replayed at all. Anything unconfirmed counts as unread:
the receiver may then be given one stream's chunks more (never lost), never one too few."""

from __future__ import annotations

from sluicemq.client.credit import StreamCredit
from sluicemq.client.machine import ClientMachine, MessageReceived
from sluicemq.client.tracker import Tracker
from sluicemq.errors import ClientError
from sluicemq.protocol.codec import FrameParser, encode_frame
from sluicemq.protocol.frames import Frame

CREDIT = "sluice-stream-credit"


def machine() -> ClientMachine:
    m = ClientMachine(host="a", heartbeat=(0, 0))
    m.connect()
    m.receive_data(encode_frame(Frame("CONNECTED", {"version": "1.2"}), "1.2"))
    return m


def chunk(m: ClientMachine, ack_id: str, *, final: bool, destination: str = "/queue/files",
          sub: str = "s") -> MessageReceived:
    headers = {"subscription": sub, "message-id": ack_id, "ack": ack_id,
               "destination": destination, "sluice-stream-id": "x"}
    if final:
        headers["sluice-stream-final"] = "true"
    [event] = m.receive_data(encode_frame(Frame("MESSAGE", headers), "1.2"))
    assert isinstance(event, MessageReceived)
    return event


def confirm(m: ClientMachine, receipt: str | None) -> None:
    assert receipt is not None
    m.receive_data(encode_frame(Frame("RECEIPT", {"receipt-id": receipt}), "1.2"))


def read_stream(m: ClientMachine, ack_id: str, *, destination: str = "/queue/files") -> None:
    """One stream read to its end: its final chunk ACKed with a receipt, confirmed."""
    chunk(m, ack_id, final=True, destination=destination)
    confirm(m, m.ack(ack_id, "s", receipt=True).receipt)


def replayed(m: ClientMachine) -> list[Frame]:
    """What a failover sends the next broker for ``m``'s subscriptions."""
    track: Tracker[str] = Tracker(m, failover=True)
    loss = track.lose(ClientError("reset"), "stomp://a:1")
    return FrameParser(version="1.2").feed(track.replay(machine(), loss, lambda: "w").data)


def subscribe(m: ClientMachine, credit: str | None, destination: str = "/queue/files") -> None:
    headers = {CREDIT: credit} if credit is not None else {}
    out = m.subscribe(destination, ack="client-individual", id="s", headers=headers)
    confirm(m, out.receipt)


def test_a_replayed_subscribe_asks_for_the_streams_not_yet_read() -> None:
    m = machine()
    subscribe(m, "3")
    chunk(m, "c1", final=False)
    m.ack("c1", "s")
    read_stream(m, "c2")
    [sub] = replayed(m)
    assert sub.command == "SUBSCRIBE" and sub.headers[CREDIT] == "2"
    assert (sub.headers["id"], sub.headers["ack"]) == ("s", "client-individual")


def test_the_stream_being_read_counts_as_unread_the_new_master_gives_it_again() -> None:
    m = machine()
    subscribe(m, "2")
    read_stream(m, "c1")
    chunk(m, "c2", final=False)  # the second stream, mid-way at the failover
    m.ack("c2", "s", receipt=True)
    [sub] = replayed(m)
    assert sub.headers[CREDIT] == "1"


def test_a_final_ack_without_a_confirmation_counts_as_unread() -> None:
    m = machine()
    subscribe(m, "2")
    chunk(m, "c1", final=True)
    m.ack("c1", "s", receipt=True)  # in flight when the connection was lost
    chunk(m, "c2", final=True)
    m.ack("c2", "s")  # no receipt asked for
    chunk(m, "c3", final=True)
    m.nack("c3", "s", receipt=True)  # given back: the broker returned the credit
    [sub] = replayed(m)
    assert sub.headers[CREDIT] == "2"


def test_a_final_ack_inside_a_transaction_counts_as_unread() -> None:
    m = machine()
    subscribe(m, "2")
    chunk(m, "c1", final=True)
    confirm(m, m.ack("c1", "s", transaction="tx", receipt=True).receipt)  # COMMIT may fail
    [sub] = replayed(m)
    assert sub.headers[CREDIT] == "2"


def test_what_was_read_carries_over_more_than_one_failover() -> None:
    m = machine()
    subscribe(m, "3")
    read_stream(m, "c1")
    track: Tracker[str] = Tracker(m, failover=True)
    track.replay(nxt := machine(), track.lose(ClientError("reset"), "stomp://a:1"), lambda: "w")
    read_stream(nxt, "d1")
    [sub] = replayed(nxt)
    assert sub.headers[CREDIT] == "1"


def test_a_receiver_that_read_all_it_asked_for_is_not_replayed_and_leaves_quietly() -> None:
    m = machine()
    subscribe(m, "1")
    read_stream(m, "c1")
    track: Tracker[str] = Tracker(m, failover=True)
    replay = track.replay(nxt := machine(), track.lose(ClientError("reset"), "stomp://a:1"),
                          lambda: "w")
    assert (replay.data, replay.resubscribed) == (b"", 0)
    assert "s" in nxt.subscriptions  # still the caller's: its UNSUBSCRIBE sends nothing
    assert nxt.unsubscribe("s").data == b"" and "s" not in nxt.subscriptions


def test_each_part_of_a_composite_owes_its_own_n_and_a_wildcard_asks_for_n_again() -> None:
    m = machine()
    subscribe(m, "2", "/queue/a,/queue/b")
    read_stream(m, "c1", destination="/queue/a")
    read_stream(m, "c2", destination="/queue/a")
    read_stream(m, "c3", destination="/queue/b")
    [sub] = replayed(m)
    assert sub.headers[CREDIT] == "1"  # /queue/b may still give one

    w = machine()
    subscribe(w, "2", "/queue/files.>")
    read_stream(w, "c1", destination="/queue/files.x")
    [sub] = replayed(w)
    assert sub.headers[CREDIT] == "2"


def test_subscriptions_without_a_credit_are_replayed_as_they_were() -> None:
    m = machine()
    subscribe(m, None)
    read_stream(m, "c1")
    [sub] = replayed(m)
    assert CREDIT not in sub.headers


def test_only_a_value_the_broker_accepts_is_a_credit() -> None:
    assert StreamCredit.asked({CREDIT: "7"}, "/queue/q") is not None
    for bad in ("two", "-1", "1.5", "9" * 5000):
        assert StreamCredit.asked({CREDIT: bad}, "/queue/q") is None
    assert StreamCredit.asked({}, "/queue/q") is None

