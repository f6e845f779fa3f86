"""Spec of the broker's message object (core/routing/message.py): what a copy keeps."""

from __future__ import annotations

from sluicemq.core.routing.message import Message


def test_a_copy_keeps_identity_content_and_costs_but_not_the_store_ticket() -> None:
    headers = {"JMSXGroupID": "g", "big": "x" * 4096}
    msg = Message(7, "/topic/t", headers, b"body", persistent=True, priority=6, expires=99,
                  timestamp=5)
    msg.ticket, msg.inner, msg.deliveries, msg.size = object(), 0, 3, 1000
    copy = msg.copy_for("/queue/DLQ.t")
    built = Message(7, "/queue/DLQ.t", dict(headers), b"body", persistent=True, priority=6,
                    expires=99, timestamp=5)
    for slot in Message.__slots__:
        if slot not in ("ticket", "inner", "deliveries", "size"):
            assert getattr(copy, slot) == getattr(built, slot), slot
    assert copy.size == 1000 and copy.inner == 0  # as stored, not recounted
    assert copy.ticket is None and copy.deliveries == 0
    assert copy.body is msg.body and copy.headers == msg.headers
    assert copy.headers is not msg.headers  # its own: a DLQ move adds headers to it
    assert copy.group == "g" and copy.extra > 0
