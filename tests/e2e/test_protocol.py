"""STOMP conversation rules, checked byte-for-byte against a real broker process."""

from __future__ import annotations

import time

import pytest


def test_connect_negotiates_highest_common_version(raw) -> None:
    c = raw()
    frame = c.connect(version="1.0,1.1,1.2")
    assert frame.headers["version"] == "1.2"
    assert frame.headers["server"].startswith("SluiceMQ/")
    assert "session" in frame.headers


@pytest.mark.parametrize("offered,expected", [("1.0", "1.0"), ("1.1", "1.1"), ("1.0,1.1", "1.1")])
def test_older_versions_are_spoken(raw, offered: str, expected: str) -> None:
    c = raw()
    assert c.connect(version=offered).headers["version"] == expected


def test_connect_without_accept_version_is_stomp_1_0(raw) -> None:
    c = raw()
    c.send_bytes(b"CONNECT\n\n\x00")
    frame = c.recv()
    assert frame.command == "CONNECTED"
    assert frame.headers["version"] == "1.0"


def test_stomp_command_is_accepted_as_connect(raw) -> None:
    c = raw()
    c.send("STOMP", {"accept-version": "1.2", "host": "x"})
    assert c.recv().headers["version"] == "1.2"


def test_unsupported_version_gets_error_listing_supported_ones(raw) -> None:
    c = raw()
    c.send("CONNECT", {"accept-version": "2.0"})
    frame = c.recv()
    assert frame.command == "ERROR"
    assert frame.headers["version"] == "1.0,1.1,1.2"
    c.expect_closed()


def test_send_subscribe_roundtrip_with_binary_body(raw) -> None:
    c = raw()
    c.connect()
    body = bytes(range(256)) * 4 + b"\x00tail"
    c.send("SUBSCRIBE", {"destination": "/queue/rt", "id": "s1", "receipt": "r1"})
    assert c.recv().headers["receipt-id"] == "r1"
    c.send("SEND", {"destination": "/queue/rt", "content-type": "application/octet-stream",
                    "x-custom": "a:b\nc"}, body)
    msg = c.recv()
    assert msg.command == "MESSAGE"
    assert msg.body == body
    assert msg.headers["destination"] == "/queue/rt"
    assert msg.headers["subscription"] == "s1"
    assert msg.headers["x-custom"] == "a:b\nc"  # escaped on the wire, decoded here
    assert msg.headers["message-id"].startswith("ID:")
    assert "ack" in msg.headers


@pytest.mark.parametrize("version", ["1.2", "1.1"])
def test_a_message_carries_the_brokers_headers_and_the_producers_win_where_both_set_one(
        raw, version: str) -> None:
    """priority, expires, timestamp and persistent come from the broker unless the producer
    set them (then as the producer wrote them); names with ':', '\\' or a newline
    round-trip escaped; a redelivery says so and counts."""
    c = raw()
    c.connect(version=version)
    sub = "s:1\\x\ny"
    c.send("SUBSCRIBE", {"destination": "/queue/hd:1", "id": sub, "ack": "client-individual",
                         "receipt": "r1"})
    assert c.recv().headers["receipt-id"] == "r1"
    c.send("SEND", {"destination": "/queue/hd:1", "priority": "07", "timestamp": "123",
                    "x-a": "1:2", "receipt": "r2"}, b"one")
    c.send("SEND", {"destination": "/queue/hd:1", "persistent": "true", "expires": "0"}, b"two")
    frames = [c.recv(), c.recv(), c.recv()]
    first, second = (f for f in frames if f.command == "MESSAGE")
    h = first.headers
    assert h["destination"] == "/queue/hd:1" and h["subscription"] == sub
    assert h["message-id"] == f"ID:sluice-{h['sluice-seq']}"
    assert (h["priority"], h["timestamp"], h["x-a"]) == ("07", "123", "1:2")
    assert (h["expires"], h["persistent"]) == ("0", "false")
    assert "redelivered" not in h and h["content-length"] == "3"
    h2 = second.headers
    assert (h2["priority"], h2["persistent"], h2["expires"]) == ("4", "true", "0")
    assert int(h2["timestamp"]) > 1_700_000_000_000
    if version == "1.2":
        assert h["ack"].endswith(f"-{h['sluice-seq']}")
        c.send("NACK", {"id": h["ack"]})
    else:
        c.send("NACK", {"message-id": h["message-id"], "subscription": sub})
    again = c.recv()
    assert again.command == "MESSAGE" and again.body == b"one"
    assert again.headers["redelivered"] == "true"
    assert again.headers["sluice-delivery-count"] == "2"
    assert again.headers["priority"] == "07"


def test_frames_split_byte_by_byte_and_coalesced(raw) -> None:
    c = raw()
    c.connect()
    c.send("SUBSCRIBE", {"destination": "/queue/split", "id": "s", "receipt": "r"})
    c.recv()
    frames = b"".join(
        b"SEND\ndestination:/queue/split\ncontent-length:3\n\n" + f"m{i:02d}".encode()[:3]
        + b"\x00\n" for i in range(20))
    for i in range(0, 200):  # first part one byte at a time
        c.send_bytes(frames[i:i + 1])
        if i % 50 == 0:
            time.sleep(0.01)  # under test: the broker reads the frames in separate pieces
    c.send_bytes(frames[200:])  # the rest coalesced in one write
    bodies = [c.recv().body for _ in range(20)]
    assert bodies == [f"m{i:02d}".encode()[:3] for i in range(20)]


def test_receipt_for_disconnect_then_close(raw) -> None:
    c = raw()
    c.connect()
    c.send("DISCONNECT", {"receipt": "bye"})
    frame = c.recv()
    assert frame.command == "RECEIPT"
    assert frame.headers["receipt-id"] == "bye"
    c.expect_closed()


def test_heartbeats_are_sent_by_the_broker(raw) -> None:
    c = raw()
    c.send("CONNECT", {"accept-version": "1.2", "heart-beat": "0,200"})
    frame = c.recv()
    assert frame.headers["heart-beat"].split(",")[0] != "0"
    send_every = int(frame.headers["heart-beat"].split(",")[0])
    assert send_every >= 200
    c.sock.settimeout(send_every / 1000 * 3 + 1)
    data = c.sock.recv(16)
    assert data.strip(b"\r\n") == b"" and data, "expected an EOL heart-beat"


def test_silent_client_is_disconnected_after_heartbeat_timeout(raw, broker_factory) -> None:
    b = broker_factory(config_text="[limits]\nheartbeat_ms = 200\n", name="hb")
    c = raw(b)
    c.send("CONNECT", {"accept-version": "1.2", "heart-beat": "200,0"})
    frame = c.recv()
    assert frame.headers["heart-beat"].split(",")[1] == "200"
    started = time.monotonic()
    with pytest.raises(ConnectionError):
        while True:
            f = c.recv(timeout=5)
            assert f.command == "ERROR"
            assert "heart-beat" in f.headers["message"]
    assert time.monotonic() - started < 3


def test_client_heartbeats_keep_connection_alive(raw, broker_factory) -> None:
    b = broker_factory(config_text="[limits]\nheartbeat_ms = 200\n", name="hb2")
    c = raw(b)
    c.send("CONNECT", {"accept-version": "1.2", "heart-beat": "200,0"})
    c.recv()
    for _ in range(8):
        time.sleep(0.1)  # under test: real heart-beats, 0.8 s in all, 4x the broker's 200 ms
        c.send_bytes(b"\n")
    c.send("SEND", {"destination": "/queue/alive", "receipt": "still"})
    assert c.recv().headers["receipt-id"] == "still"
