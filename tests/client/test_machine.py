"""Spec of the sans-IO client machine: frames it builds, events it reports, heart-beat timing."""

from __future__ import annotations

import pytest

from sluicemq.client.machine import (
    ClientMachine,
    Connected,
    ErrorReceived,
    MessageReceived,
    ReceiptReceived,
)
from sluicemq.errors import ClientError
from sluicemq.protocol.codec import FrameParser, encode_frame
from sluicemq.protocol.frames import Frame


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def decode(data: bytes, version: str = "1.2") -> Frame:
    """The single frame a machine call produced."""
    frames = FrameParser(version=version).feed(data)
    assert len(frames) == 1
    return frames[0]


def server(command: str, headers: dict[str, str], body: bytes = b"",
           version: str = "1.2") -> bytes:
    return encode_frame(Frame(command, headers, body), version)


def connected(version: str = "1.2", heart_beat: str = "0,0", *, client_hb=(0, 0),
              clock: FakeClock | None = None, **kwargs) -> ClientMachine:
    m = ClientMachine(host="broker.example", heartbeat=client_hb, version=version,
                      clock=clock or FakeClock(), **kwargs)
    m.connect()
    [event] = m.receive_data(server("CONNECTED", {"version": version, "heart-beat": heart_beat}))
    assert isinstance(event, Connected)
    return m


def deliver(m: ClientMachine, sub: str, **headers: str) -> MessageReceived:
    base = {"destination": "/queue/a", "message-id": "m-1", "subscription": sub}
    base.update({k.replace("_", "-"): v for k, v in headers.items()})
    [event] = m.receive_data(server("MESSAGE", base, b"hi", m.version or "1.2"))
    assert isinstance(event, MessageReceived)
    return event


# ------------------------------------------------------------------ connecting


def test_connect_offers_every_version_up_to_the_requested_one() -> None:
    m = ClientMachine(host="h", login="u", passcode="p", client_id="c1", heartbeat=(5, 7))
    frame = decode(m.connect())
    assert frame.command == "CONNECT"
    assert frame.headers == {"accept-version": "1.0,1.1,1.2", "host": "h", "heart-beat": "5,7",
                             "login": "u", "passcode": "p", "client-id": "c1"}


def test_stomp_10_connect_has_no_heart_beat_and_omits_absent_credentials() -> None:
    frame = decode(ClientMachine(host="h", version="1.0").connect(), "1.0")
    assert frame.headers == {"accept-version": "1.0", "host": "h"}


def test_unknown_version_is_refused_up_front() -> None:
    with pytest.raises(ValueError):
        ClientMachine(host="h", version="2.0")


def test_connected_fixes_the_version_and_session() -> None:
    m = ClientMachine(host="h")
    m.connect()
    [event] = m.receive_data(server("CONNECTED", {"version": "1.1", "session": "s-9",
                                                  "server": "SluiceMQ/0.1"}))
    assert event == Connected("1.1", "SluiceMQ/0.1", "s-9", 0.0, 0.0)
    assert (m.state, m.version) == ("connected", "1.1")


def test_connected_without_version_means_stomp_10() -> None:
    m = ClientMachine(host="h")
    m.connect()
    [event] = m.receive_data(server("CONNECTED", {}))
    assert isinstance(event, Connected) and event.version == "1.0"


def test_broker_choosing_a_version_we_did_not_offer_is_an_error() -> None:
    m = ClientMachine(host="h", version="1.1")
    m.connect()
    with pytest.raises(ClientError, match=r"1\.2"):
        m.receive_data(server("CONNECTED", {"version": "1.2"}))


def test_heart_beat_negotiation_takes_the_slower_side_of_each_direction() -> None:
    m = connected(heart_beat="3000,500", client_hb=(1000, 2000))
    assert m.send_interval == 1.0  # we promised 1000, broker wants >= 500
    assert m.receive_interval == 3.0  # broker promises 3000, we wanted 2000


@pytest.mark.parametrize(("client_hb", "server_hb"), [((0, 1000), "1000,1000"),
                                                      ((1000, 1000), "0,0")])
def test_heart_beats_are_off_when_either_side_says_zero(client_hb, server_hb) -> None:
    m = connected(heart_beat=server_hb, client_hb=client_hb)
    assert m.send_interval == 0.0
    check = m.heartbeat()
    assert (check.data, check.dead) == (b"", False)


def test_nothing_but_connect_may_be_sent_before_connected() -> None:
    m = ClientMachine(host="h")
    with pytest.raises(ClientError, match="not connected"):
        m.send("/queue/a", b"x")
    m.connect()
    with pytest.raises(ClientError):
        m.subscribe("/queue/a")


def test_error_instead_of_connected_is_a_connection_error() -> None:
    m = ClientMachine(host="h")
    m.connect()
    [event] = m.receive_data(server("ERROR", {"message": "bad credentials"}))
    assert isinstance(event, ErrorReceived)
    assert event.receipt_id is None
    assert str(event.error) == "bad credentials"


# ------------------------------------------------------------------ sending and receipts


def test_send_builds_a_persistent_send_with_a_receipt() -> None:
    m = connected()
    out = m.send("/queue/a", b"\x00\x01", {"k": "v"})
    frame = decode(out.data)
    assert frame == Frame("SEND", {"k": "v", "destination": "/queue/a", "persistent": "true",
                                   "receipt": out.receipt, "content-length": "2"}, b"\x00\x01")
    assert out.receipt in m.pending_receipts


def test_text_bodies_are_utf8_and_labelled_as_text() -> None:
    m = connected()
    frame = decode(m.send("/queue/a", "héllo", receipt=False, persistent=False).data)
    assert frame.body == "héllo".encode()
    assert frame.headers["content-type"] == "text/plain;charset=utf-8"
    assert frame.headers["persistent"] == "false"
    assert "receipt" not in frame.headers


def test_user_headers_cannot_redirect_the_destination() -> None:
    m = connected()
    frame = decode(m.send("/queue/a", headers={"destination": "/queue/evil"}).data)
    assert frame.headers["destination"] == "/queue/a"


def test_send_in_a_transaction_names_it() -> None:
    m = connected()
    assert decode(m.send("/queue/a", transaction="tx-7").data).headers["transaction"] == "tx-7"


def test_receipt_ids_are_unique_and_resolved_once() -> None:
    m = connected()
    a, b = m.send("/queue/a").receipt, m.send("/queue/a").receipt
    assert a != b
    assert m.receive_data(server("RECEIPT", {"receipt-id": a})) == [
        ReceiptReceived(a, {"receipt-id": a})]
    assert m.receive_data(server("RECEIPT", {"receipt-id": a})) == []  # unknown now: ignored
    assert m.pending_receipts == {b}


def test_frames_split_across_reads_are_reassembled() -> None:
    m = connected()
    receipt = m.send("/queue/a").receipt
    data = server("RECEIPT", {"receipt-id": receipt})
    assert m.receive_data(data[:5]) == []
    assert m.receive_data(data[5:]) == [ReceiptReceived(receipt, {"receipt-id": receipt})]


def test_receipts_keep_their_extra_headers_for_answers() -> None:
    m = connected()
    receipt = m.send("/queue/a").receipt
    (event,) = m.receive_data(server("RECEIPT", {"receipt-id": receipt,
                                                 "sluice-stream-next-seq": "3"}))
    assert isinstance(event, ReceiptReceived)
    assert event.headers["sluice-stream-next-seq"] == "3"


def test_error_answering_a_receipt_goes_to_that_call() -> None:
    m = connected()
    receipt = m.send("/queue/a").receipt
    [event] = m.receive_data(server("ERROR", {"receipt-id": receipt, "message": "denied"},
                                    b"details"))
    assert isinstance(event, ErrorReceived)
    assert event.receipt_id == receipt
    assert str(event.error) == "denied"
    assert event.error.body == b"details"
    assert not m.pending_receipts


def test_error_without_message_header_uses_its_body() -> None:
    m = connected()
    [event] = m.receive_data(server("ERROR", {}, b"something broke\n"))
    assert isinstance(event, ErrorReceived)
    assert (str(event.error), event.receipt_id) == ("something broke", None)


def test_disconnect_closes_once_its_receipt_arrives() -> None:
    m = connected()
    out = m.disconnect()
    assert decode(out.data) == Frame("DISCONNECT", {"receipt": out.receipt})
    assert m.state == "disconnecting"
    m.receive_data(server("RECEIPT", {"receipt-id": out.receipt}))
    assert m.state == "closed"
    with pytest.raises(ClientError):
        m.send("/queue/a")


# ------------------------------------------------------------------ subscriptions and acks


def test_subscribe_maps_options_to_activemq_headers() -> None:
    m = connected(client_id="app-1")
    out = m.subscribe("/topic/t", ack="client-individual", prefetch=10, selector="x > 1",
                      durable_name="d1", exclusive=True, headers={"extra": "1"})
    frame = decode(out.data)
    assert frame.command == "SUBSCRIBE"
    assert frame.headers == {"extra": "1", "destination": "/topic/t", "id": out.ident,
                             "ack": "client-individual", "activemq.prefetchSize": "10",
                             "selector": "x > 1", "activemq.subscriptionName": "d1",
                             "activemq.exclusive": "true", "receipt": out.receipt}


def test_subscription_ids_are_generated_unless_given() -> None:
    m = connected()
    a, b = m.subscribe("/queue/a").ident, m.subscribe("/queue/a").ident
    assert a != b
    assert m.subscribe("/queue/a", id="mine").ident == "mine"
    with pytest.raises(ValueError, match="in use"):
        m.subscribe("/queue/b", id="mine")


def test_durable_subscription_needs_a_client_id() -> None:
    with pytest.raises(ValueError, match="client_id"):
        connected().subscribe("/topic/t", durable_name="d1")


def test_unknown_ack_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="ack mode"):
        connected().subscribe("/queue/a", ack="sometimes")


def test_durable_unsubscribe_names_the_subscription() -> None:
    m = connected(client_id="app-1")
    sub = m.subscribe("/topic/t", durable_name="d1").ident
    frame = decode(m.unsubscribe(sub, durable=True).data)
    assert frame.headers["activemq.subscriptionName"] == "d1"
    assert frame.headers["id"] == sub


def test_messages_for_a_dropped_subscription_are_ignored() -> None:
    m = connected()
    sub = m.subscribe("/queue/a").ident
    m.unsubscribe(sub)
    assert m.receive_data(server("MESSAGE", {"destination": "/queue/a", "message-id": "1",
                                             "subscription": sub})) == []


def test_stomp_10_messages_without_subscription_route_by_destination() -> None:
    m = connected("1.0")
    sub = m.subscribe("/queue/a", ack="client").ident
    [event] = m.receive_data(server("MESSAGE", {"destination": "/queue/a", "message-id": "7"},
                                    version="1.0"))
    assert isinstance(event, MessageReceived)
    assert (event.subscription, event.ack_id) == (sub, "7")


@pytest.mark.parametrize(("version", "expected"), [
    ("1.2", {"id": "ack-42", "transaction": "tx"}),
    ("1.1", {"message-id": "m-1", "subscription": "S", "transaction": "tx"}),
    ("1.0", {"message-id": "m-1", "transaction": "tx"}),
])
def test_ack_speaks_the_dialect_of_the_negotiated_version(version, expected) -> None:
    m = connected(version)
    m.subscribe("/queue/a", ack="client", id="S")
    event = deliver(m, "S", ack="ack-42")
    assert event.ack_id == ("ack-42" if version == "1.2" else "m-1")
    frame = decode(m.ack(event.ack_id, event.subscription, transaction="tx").data, version)
    assert frame == Frame("ACK", expected)


def test_nack_mirrors_ack_and_does_not_exist_in_stomp_10() -> None:
    m = connected("1.2")
    m.subscribe("/queue/a", ack="client-individual", id="S")
    event = deliver(m, "S", ack="a1")
    assert decode(m.nack(event.ack_id, "S").data) == Frame("NACK", {"id": "a1"})
    old = connected("1.0")
    old.subscribe("/queue/a", ack="client", id="S")
    with pytest.raises(ClientError, match=r"1\.0"):
        old.nack("m-1", "S")


def test_acks_on_auto_subscriptions_send_nothing() -> None:
    m = connected()
    m.subscribe("/queue/a", id="S")
    event = deliver(m, "S", ack="a1")
    assert event.ack_mode == "auto"
    assert m.ack(event.ack_id, "S").data == b""


def test_ack_can_ask_for_a_receipt() -> None:
    m = connected()
    m.subscribe("/queue/a", ack="client", id="S")
    out = m.ack("a1", "S", receipt=True)
    assert decode(out.data).headers["receipt"] == out.receipt


def test_transactions_frames() -> None:
    m = connected()
    begin = m.begin()
    assert decode(begin.data) == Frame("BEGIN", {"transaction": begin.ident,
                                                 "receipt": begin.receipt})
    assert decode(m.commit(begin.ident, receipt=False).data) == Frame(
        "COMMIT", {"transaction": begin.ident})
    assert decode(m.abort("tx-x", receipt=False).data) == Frame("ABORT", {"transaction": "tx-x"})
    assert m.begin("mine").ident == "mine"


# ------------------------------------------------------------------ heart-beats


def test_heart_beat_eol_is_sent_before_the_promised_interval_runs_out() -> None:
    clock = FakeClock()
    m = connected(heart_beat="1000,1000", client_hb=(1000, 0), clock=clock)
    first = m.heartbeat()
    assert first.data == b""
    assert 0 < first.wait <= 1.0
    clock.now += first.wait + 1e-6
    assert m.heartbeat().data == b"\n"
    assert m.heartbeat().data == b""  # just sent: not due again yet


def test_any_frame_we_send_counts_as_a_heart_beat() -> None:
    clock = FakeClock()
    m = connected(heart_beat="1000,1000", client_hb=(1000, 0), clock=clock)
    clock.now += 0.7
    m.send("/queue/a", receipt=False)
    clock.now += 0.7
    assert m.heartbeat().data == b""


def test_silent_broker_is_declared_dead_after_the_grace_period() -> None:
    clock = FakeClock()
    m = connected(heart_beat="1000,1000", client_hb=(0, 1000), clock=clock)
    check = m.heartbeat()
    assert not check.dead
    clock.now += 1.5
    m.receive_data(b"\n")  # an EOL from the broker proves it alive
    clock.now += 1.5
    assert not m.heartbeat().dead
    clock.now += 0.6
    assert m.heartbeat().dead


def test_no_heart_beat_timer_before_connected_or_after_close() -> None:
    m = ClientMachine(host="h")
    assert m.heartbeat().wait is None
    m.connect()
    m.receive_data(server("CONNECTED", {"version": "1.2", "heart-beat": "100,100"}))
    assert m.heartbeat().wait is not None
    m.connection_lost()
    assert m.heartbeat().wait is None
    with pytest.raises(ClientError):
        m.send("/queue/a")


def test_eof_after_an_unclaimed_error_is_explained_by_it() -> None:
    m = connected()
    assert str(m.closed_by_peer()) == "connection closed by the broker"
    m.receive_data(server("ERROR", {"message": "frame too large"}))
    assert "frame too large" in str(m.closed_by_peer())
    assert m.last_error is not None and str(m.last_error) == "frame too large"
