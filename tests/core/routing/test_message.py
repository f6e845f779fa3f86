"""Spec of the broker's message object (core/routing/message.py): what a SEND's message
holds, what a copy keeps."""

from __future__ import annotations

from sluicemq.core.routing.message import (
    HEADER_ENTRY_COST,
    TRANSPORT_HEADERS,
    TYPICAL_HEADER_CHARS,
    TYPICAL_HEADERS,
    Message,
    from_send,
    header_cost,
)

# Every attribute a message has: its __slots__ pure, what mypyc keeps of them compiled.
FIELDS: tuple[str, ...] = vars(Message).get("__slots__") or vars(Message)["__mypyc_attrs__"]


def test_a_copy_keeps_identity_content_and_costs_but_not_the_store_ticket() -> None:
    headers = {"JMSXGroupID": "g", "big": "x" * 4096}
    msg = Message(7, "/topic/t", headers, b"body", persistent=True, priority=6, expires=99,
                  timestamp=5)
    msg.ticket, msg.inner, msg.deliveries, msg.size = object(), 0, 3, 1000
    copy = msg.copy_for("/queue/DLQ.t")
    built = Message(7, "/queue/DLQ.t", dict(headers), b"body", persistent=True, priority=6,
                    expires=99, timestamp=5)
    for slot in FIELDS:
        if slot not in ("ticket", "inner", "deliveries", "size"):
            assert getattr(copy, slot) == getattr(built, slot), slot
    assert copy.size == 1000 and copy.inner == 0  # as stored, not recounted
    assert copy.ticket is None and copy.deliveries == 0
    assert copy.body is msg.body and copy.headers == msg.headers
    assert copy.headers is not msg.headers  # its own: a DLQ move adds headers to it
    assert copy.group == "g" and copy.extra > 0


def test_headers_cost_only_what_they_take_beyond_a_typical_message() -> None:
    """Counted per SEND (a short loop for a few headers, joins for many); either way a
    header's key and value count, and each header past the eighth costs its entry too."""
    assert header_cost({}) == 0
    assert header_cost({"k": "v" * (TYPICAL_HEADER_CHARS - 1)}) == 0
    assert header_cost({"k": "v" * TYPICAL_HEADER_CHARS}) == 1
    assert header_cost({"key": "x" * 1000}) == 1003 - TYPICAL_HEADER_CHARS
    few = {f"h{i}": "v" for i in range(TYPICAL_HEADERS)}
    assert header_cost(few) == 0
    many = {f"h{i}": "v" for i in range(TYPICAL_HEADERS + 3)}  # short: only entries count
    assert header_cost(many) == 3 * HEADER_ENTRY_COST
    wide = {f"h{i:03d}": "v" * 100 for i in range(TYPICAL_HEADERS + 1)}
    chars = sum(len(k) + len(v) for k, v in wide.items())
    assert header_cost(wide) == chars - TYPICAL_HEADER_CHARS + HEADER_ENTRY_COST
    assert Message(1, "/queue/q", wide, b"", persistent=False).extra == header_cost(wide)


def test_a_sends_message_keeps_the_users_headers_less_the_transports_own() -> None:
    """Built once per SEND (``from_send``): the frame's headers are copied, never changed;
    the transport's headers are dropped, the arrival time is its timestamp unless the sender
    gave one, and the body of a kept input buffer is copied out."""
    h = {header: "x" for header in TRANSPORT_HEADERS}
    h.update({"destination": "/queue/q", "persistent": "true", "priority": "7",
              "expires": "1700000000000", "color": "red"})
    sent = dict(h)
    msg = from_send(42, "/queue/q", h, memoryview(b"body"), 1234, b"owner")
    assert h == sent
    assert msg.headers == {"persistent": "true", "priority": "7", "expires": "1700000000000",
                           "color": "red", "timestamp": "1234"}
    assert (msg.mid, msg.destination, msg.persistent, msg.priority, msg.expires) == (
        42, "/queue/q", True, 7, 1700000000000)
    assert msg.timestamp == 1234 and msg.owner == b"owner"
    assert type(msg.body) is bytes and msg.body == b"body" and msg.size == 4
    plain = from_send(43, "/queue/q", {"timestamp": "5", "priority": "high"}, b"", 1234, b"")
    assert plain.headers == {"timestamp": "5", "priority": "high"}
    assert (plain.persistent, plain.priority, plain.expires) == (False, 4, 0)
