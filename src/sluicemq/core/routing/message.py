"""The broker's in-memory view of one message."""

from __future__ import annotations

from typing import Any

# Headers the broker sets or consumes itself; never copied from a SEND into the stored message.
TRANSPORT_HEADERS = frozenset(
    {"receipt", "transaction", "content-length", "destination", "message-id", "subscription",
     "ack", "redelivered", "sluice-delivery-count", "sluice-seq"}
)
MIN_PRIORITY, MAX_PRIORITY, DEFAULT_PRIORITY = 0, 9, 4
MAX_EXPIRES = (1 << 63) - 1  # ms since the epoch: the journal keeps 8 bytes
ORIGINAL_ID = "sluice-original-id"  # on a moved message: the id it was first sent with
TYPICAL_HEADER_CHARS = 512  # header text the flat per-message estimate already covers
TYPICAL_HEADERS = 8
HEADER_ENTRY_COST = 128  # two str objects and a dict slot, beyond their characters
MESSAGE_ID_PREFIX = "ID:sluice-"  # + the message's mid: its STOMP message-id


class Message:
    """A message as queues hold it: identity, routing facts and the user's headers and body.

    ``mid`` is broker-wide and survives restarts for persistent messages. ``ticket`` is the
    journal ticket of the record that stores the message (None for non-persistent ones).
    ``deliveries`` counts how often it was handed out (redelivery and DLQ decisions).
    ``body`` is None when the body lives only in the journal (large persistent messages):
    memory then holds the headers and ``size``, and delivery reads the body back.
    ``inner`` is where the message's encoding starts inside its record (0: a plain message
    record; > 0: inside a transaction record; -1: unknown, so the store cursor keeps the
    object rather than paging it out).
    ``extra`` is what its headers cost in RAM beyond a typical message's (``header_cost``).
    ``owner`` is the login that sent it as its record stores it (``records.encode_owner``;
    b"": anonymous), which the per-user share of the store is counted by.
    """

    __slots__ = (
        "body", "deliveries", "destination", "expires", "extra", "group", "headers", "inner",
        "mid", "owner", "persistent", "priority", "size", "ticket", "timestamp",
    )

    def __init__(
        self,
        mid: int,
        destination: str,
        headers: dict[str, str],
        body: bytes | None,
        persistent: bool,
        priority: int = DEFAULT_PRIORITY,
        expires: int = 0,
        timestamp: int = 0,
        extra: int = -1,
    ) -> None:
        self.mid = mid
        self.destination = destination
        self.headers = headers
        self.body = body
        self.size = len(body) if body is not None else 0
        self.persistent = persistent
        self.priority = priority
        self.expires = expires
        self.timestamp = timestamp
        self.group = headers.get("JMSXGroupID")
        self.extra = header_cost(headers) if extra < 0 else extra  # -1: read them
        self.ticket: Any = None
        self.inner = -1
        self.deliveries = 0
        self.owner = b""

    @property
    def message_id(self) -> str:
        return f"{MESSAGE_ID_PREFIX}{self.mid}"

    @property
    def loaded_body(self) -> bytes:
        """The body of a message that still holds it: one being stored or routed (a body
        dropped after storing is read back with ``Broker.body_of`` instead)."""
        assert self.body is not None, f"{self.message_id} keeps its body only in the journal"
        return self.body

    def expired(self, now_ms: int) -> bool:
        return 0 < self.expires <= now_ms

    def copy_for(self, destination: str) -> Message:
        """A copy routed elsewhere (DLQ moves, each topic subscription); identity and content
        are kept. The headers' cost is carried over, not re-read (``header_cost`` was a third
        of a copy: a SEND to a topic makes one per subscriber)."""
        m = Message(self.mid, destination, dict(self.headers), self.body, self.persistent,
                    self.priority, self.expires, self.timestamp, self.extra)
        m.size = self.size  # the body may live only in the journal
        m.inner = self.inner
        m.owner = self.owner
        return m

    def moved_to(self, destination: str, mid: int) -> Message:
        """A copy entering another destination under a fresh id (= seq, so that it becomes
        visible there above the head); the id it was first sent with goes along as
        ``sluice-original-id``."""
        m = self.copy_for(destination)
        m.mid = mid
        m.headers.setdefault(ORIGINAL_ID, self.message_id)
        return m

    def __repr__(self) -> str:
        return f"<Message {self.mid} {self.destination} {self.size}B>"


def from_send(mid: int, destination: str, h: dict[str, str], body: bytes | memoryview,
              now: int, owner: bytes) -> Message:
    """The message a plain SEND with headers ``h`` stores, received at ``now`` (ms): its
    headers less the transport's own. Here, not in the SEND path's interpreted module,
    because every SEND builds one: compiled, the copy, the header look-ups and the
    construction cost a third of what they did there."""
    headers = h.copy()
    headers.pop("destination", None)  # on every SEND, as content-length on nearly every one
    headers.pop("content-length", None)  # and receipt on every persistent one at full speed:
    headers.pop("receipt", None)  # the rest are looked for in one C call, rarely found
    if not _OTHER_TRANSPORT_HEADERS.isdisjoint(headers):
        for key in _OTHER_TRANSPORT_HEADERS.intersection(headers):
            del headers[key]
    if "timestamp" not in headers:
        headers["timestamp"] = str(now)  # as ActiveMQ: when the broker got it
    priority = h.get("priority")
    expires = h.get("expires")
    msg = Message(mid, destination, headers, body if type(body) is bytes else bytes(body),
                  h.get("persistent") == "true",
                  DEFAULT_PRIORITY if priority is None else parse_priority(priority),
                  0 if expires is None else parse_expires(expires), now)
    msg.owner = owner
    return msg


_OTHER_TRANSPORT_HEADERS = TRANSPORT_HEADERS - {"destination", "content-length", "receipt"}


def header_cost(headers: dict[str, str]) -> int:
    """RAM that ``headers`` take beyond what a typical message's headers take (0 for most).

    Why: memory limits would otherwise see a message with a thousand 8 KB headers as a small
    one, and a few hundred of them would take gigabytes under a 256 MiB limit.
    """
    if len(headers) <= TYPICAL_HEADERS:  # once per SEND: a short loop beats two joins here
        chars = 0
        for key, value in headers.items():
            chars += len(key) + len(value)
        if chars <= TYPICAL_HEADER_CHARS:
            return 0
    else:
        chars = len("".join(headers)) + len("".join(headers.values()))  # in C
    entries = max(0, len(headers) - TYPICAL_HEADERS)
    return max(0, chars - TYPICAL_HEADER_CHARS) + HEADER_ENTRY_COST * entries


def parse_priority(value: str | None) -> int:
    """STOMP `priority` header → 0..9 (JMS range); bad values fall back to the default."""
    if value is None:
        return DEFAULT_PRIORITY
    try:
        p = int(value)
    except ValueError:
        return DEFAULT_PRIORITY
    return min(MAX_PRIORITY, max(MIN_PRIORITY, p))


def parse_expires(value: str | None) -> int:
    """`expires` is an absolute time in ms since the epoch (ActiveMQ); 0 means never. A time
    past 2^63 - 1 ms (the journal keeps 8 bytes) is that time: as good as never (was: the
    record's encoding failed, and the SEND with it)."""
    if not value:
        return 0
    try:
        return min(max(0, int(value)), MAX_EXPIRES)
    except ValueError:
        return 0
