"""Bad input gets a clear ERROR; the broker and every other connection keep working."""

from __future__ import annotations

import pytest


def _assert_error(frame, *words: str) -> None:
    assert frame.command == "ERROR", frame
    text = frame.headers["message"].lower()
    for w in words:
        assert w in text, (w, text)


def _broker_still_serves(raw) -> None:
    c = raw()
    c.connect()
    c.send("SEND", {"destination": "/queue/alive", "receipt": "ok", "persistent": "true"}, b"x")
    assert c.recv().headers["receipt-id"] == "ok"


@pytest.mark.parametrize(
    "payload,words",
    [
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", ["command"]),
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(range(40)), []),
        (b"CONNECT\nbad header line\n\n\x00", ["header"]),
        (b"FOO\n\n\x00", ["connect"]),
        (b"SEND\ndestination:/queue/x\n\n\x00", ["connect"]),
    ],
)
def test_garbage_before_connect(raw, payload: bytes, words: list[str]) -> None:
    c = raw()
    c.send_bytes(payload)
    frame = c.recv()
    _assert_error(frame, *words)
    c.expect_closed()
    _broker_still_serves(raw)


def test_unknown_command_after_connect(raw) -> None:
    c = raw()
    c.connect()
    c.send_bytes(b"FLY\n\n\x00")
    _assert_error(c.recv(), "unknown command")
    c.expect_closed()
    _broker_still_serves(raw)


def test_oversized_header_line(raw) -> None:
    c = raw()
    c.connect()
    c.send_bytes(b"SEND\ndestination:/queue/x\nbig:" + b"a" * 10_000 + b"\n\n\x00")
    _assert_error(c.recv(), "header")
    c.expect_closed()
    _broker_still_serves(raw)


def test_too_many_headers(raw) -> None:
    c = raw()
    c.connect()
    lines = b"".join(f"h{i}:v\n".encode() for i in range(1100))
    c.send_bytes(b"SEND\ndestination:/queue/x\n" + lines + b"\n\x00")
    _assert_error(c.recv(), "header")
    c.expect_closed()


def test_oversized_frame_is_refused_before_the_body_arrives(raw, broker_factory) -> None:
    b = broker_factory(config_text="[limits]\nmax_frame_bytes = 100000\n", name="small")
    c = raw(b)
    c.connect()
    c.send_bytes(b"SEND\ndestination:/queue/x\ncontent-length:5000000\n\n")
    _assert_error(c.recv(), "frame")
    c.expect_closed()


def test_a_content_length_of_thousands_of_digits_gets_the_clear_error(raw) -> None:
    """Past int()'s 4,300 digits: ``ERROR invalid content-length`` and the close, like any
    other bad content-length (was: ValueError, the connection closed without an ERROR)."""
    c = raw()
    c.connect()
    c.send_bytes(b"SEND\ndestination:/queue/x\ncontent-length:" + b"9" * 5000 + b"\n\nx\x00")
    _assert_error(c.recv(), "invalid content-length")
    c.expect_closed()
    _broker_still_serves(raw)


@pytest.mark.parametrize("ready_consumer", [False, True])
def test_an_expires_past_the_journal_s_range_is_as_good_as_never(raw, ready_consumer) -> None:
    """A persistent SEND with ``expires`` of 20 digits (past 2^63 - 1 ms): receipted and
    delivered, never expired - written at once (no consumer) or deferred (a ready consumer
    that does not ACK, so its write comes ``store_delay_ms`` later). Was: its record's
    encoding failed (struct's 'argument out of range'): ERROR internal broker error."""
    far = "9" * 20
    consumer = raw()
    consumer.connect()
    if ready_consumer:
        consumer.send("SUBSCRIBE", {"destination": "/queue/far", "id": "1", "ack": "client",
                                    "receipt": "sub"})
        assert consumer.recv().headers.get("receipt-id") == "sub"
    producer = raw()
    producer.connect()
    producer.send("SEND", {"destination": "/queue/far", "persistent": "true", "expires": far,
                           "receipt": "r"}, b"kept")
    answer = producer.recv()
    assert (answer.command, answer.headers.get("receipt-id")) == ("RECEIPT", "r"), answer
    if not ready_consumer:
        consumer.send("SUBSCRIBE", {"destination": "/queue/far", "id": "1", "ack": "auto"})
    msg = consumer.recv()
    assert msg.command == "MESSAGE" and msg.body == b"kept"
    assert msg.headers["expires"] in (far, str((1 << 63) - 1))


def test_body_shorter_than_content_length(raw) -> None:
    c = raw()
    c.connect()
    c.send_bytes(b"SEND\ndestination:/queue/x\ncontent-length:10\n\n12345\x00SEND\n\n\n\n\n\n\x00")
    _assert_error(c.recv(), "")
    c.expect_closed()
    _broker_still_serves(raw)


def test_missing_destination_keeps_connection(raw) -> None:
    c = raw()
    c.connect()
    c.send("SEND", {"receipt": "r"}, b"x")
    frame = c.recv()
    _assert_error(frame, "destination")
    assert frame.headers["receipt-id"] == "r"
    c.send("SEND", {"destination": "/queue/ok", "receipt": "r2"}, b"x")
    assert c.recv().headers["receipt-id"] == "r2"


@pytest.mark.parametrize("dest", ["/queue/", "/nowhere/x", "queue/x", "/queue/a b", "/topic/a/b",
                                  "/queue/" + "x" * 300])
def test_invalid_destination(raw, dest: str) -> None:
    c = raw()
    c.connect()
    c.send("SEND", {"destination": dest}, b"x")
    _assert_error(c.recv(), "destination")
    c.send("SEND", {"destination": "/queue/ok", "receipt": "r"}, b"x")
    assert c.recv().headers["receipt-id"] == "r"


def test_ack_for_unknown_id(raw) -> None:
    c = raw()
    c.connect()
    c.send("ACK", {"id": "12345-999"})
    _assert_error(c.recv(), "unknown ack id")
    c.send("ACK", {"id": "nonsense"})
    _assert_error(c.recv())
    c.send("NACK", {})
    _assert_error(c.recv(), "id")
    c.send("SEND", {"destination": "/queue/ok", "receipt": "r"}, b"x")
    assert c.recv().headers["receipt-id"] == "r"


def test_subscribe_errors(raw) -> None:
    c = raw()
    c.connect()
    c.send("SUBSCRIBE", {"destination": "/queue/s"})
    _assert_error(c.recv(), "id")
    c.send("SUBSCRIBE", {"destination": "/queue/s", "id": "1", "ack": "sometimes"})
    _assert_error(c.recv(), "ack mode")
    c.send("SUBSCRIBE", {"destination": "/queue/s", "id": "1", "selector": "a = = 1"})
    _assert_error(c.recv(), "selector")
    c.send("SUBSCRIBE", {"destination": "/queue/s", "id": "1", "activemq.prefetchSize": "x"})
    _assert_error(c.recv(), "prefetch")
    c.send("SUBSCRIBE", {"destination": "/queue/s", "id": "1", "receipt": "ok"})
    assert c.recv().headers["receipt-id"] == "ok"
    c.send("SUBSCRIBE", {"destination": "/queue/s", "id": "1"})
    _assert_error(c.recv(), "already in use")
    c.send("UNSUBSCRIBE", {"id": "nope"})
    _assert_error(c.recv(), "no subscription")


def test_transaction_errors(raw) -> None:
    c = raw()
    c.connect()
    c.send("COMMIT", {"transaction": "nope"})
    _assert_error(c.recv(), "unknown transaction")
    c.send("BEGIN", {})
    _assert_error(c.recv(), "transaction")
    c.send("BEGIN", {"transaction": "t"})
    c.send("BEGIN", {"transaction": "t"})
    _assert_error(c.recv(), "already open")
    c.send("SEND", {"destination": "/queue/x", "transaction": "other"}, b"x")
    _assert_error(c.recv(), "unknown transaction")


def test_bad_connection_does_not_disturb_a_busy_neighbour(raw) -> None:
    good = raw()
    good.connect()
    good.send("SUBSCRIBE", {"destination": "/queue/n", "id": "s", "receipt": "r"})
    good.recv()
    bad = raw()
    bad.send_bytes(b"\xff" * 5000)
    for i in range(50):
        good.send("SEND", {"destination": "/queue/n"}, str(i).encode())
    assert [good.recv().body for _ in range(50)] == [str(i).encode() for i in range(50)]
