"""Destination keys: the one string that names where a message or a subscription lives.

The journal's message and ACK records, the index snapshot and the broker's tables all name a
queue by its key, so the format is fixed (a data directory written by any earlier version must
still start): a one-letter kind, a colon, then the names.

    q:NAME           a queue                              queue_key("orders")
    t:NAME           a topic: what a topic message is      topic_key("prices")
                     journaled under; durable subscriptions take it from there
    d:CLIENT:SUB     a durable topic subscription          durable_key("c1", "audit")
    s:SESSION:N      a session's plain topic subscription  session_key("7", 2) (never journaled)

Keys are plain ``str`` at run time (``DestKey`` is a type for readers and mypy, free on the
per-message path); build and read them here, never by hand.
"""

from __future__ import annotations

from typing import NewType

DestKey = NewType("DestKey", str)

QUEUE_KIND, TOPIC_KIND, DURABLE_KIND, SESSION_KIND = "q", "t", "d", "s"
_QUEUE, _TOPIC, _DURABLE, _SESSION = "q:", "t:", "d:", "s:"


def queue_key(name: str) -> DestKey:
    return DestKey(_QUEUE + name)


def topic_key(name: str) -> DestKey:
    return DestKey(_TOPIC + name)


def durable_key(client_id: str, subscription: str) -> DestKey:
    return DestKey(f"{_DURABLE}{client_id}:{subscription}")


def durable_prefix(client_id: str) -> str:
    """What every durable key of ``client_id`` starts with (to count a client's durables)."""
    return f"{_DURABLE}{client_id}:"


def session_key(session_id: str, index: int) -> DestKey:
    return DestKey(f"{_SESSION}{session_id}:{index}")


def destination_key(destination: str) -> DestKey:
    """``/queue/x`` -> ``q:x``, ``/topic/x`` -> ``t:x``."""
    kind, _, name = destination[1:].partition("/")
    return kind_key(kind, name)


def kind_key(kind: str, name: str) -> DestKey:
    """The key of ``name`` of kind ``"queue"`` or ``"topic"`` (routing.names.QUEUE/TOPIC)."""
    return topic_key(name) if kind == "topic" else queue_key(name)


def is_queue(key: str) -> bool:
    return key.startswith(_QUEUE)


def is_topic(key: str) -> bool:
    return key.startswith(_TOPIC)


def is_session(key: str) -> bool:
    return key.startswith(_SESSION)


def name_of(key: str) -> str:
    """The queue or topic name of a ``q:`` or ``t:`` key."""
    return key[2:]


def kind_of(key: str) -> str:
    """``"queue"`` or ``"topic"`` for a ``q:`` or ``t:`` key (routing.names.QUEUE/TOPIC)."""
    return "topic" if key.startswith(_TOPIC) else "queue"


def destination_of(key: str) -> str:
    """``q:x`` -> ``/queue/x``, ``t:x`` -> ``/topic/x``."""
    return f"/{kind_of(key)}/{key[2:]}"


def subscription_of(key: str) -> str:
    """The subscription name of a ``d:CLIENT:SUB`` key."""
    return key.split(":", 2)[-1]
