"""MESSAGE heads for STOMP 1.2 peers, written straight into one string (the common case of
``SessionContext.deliver``; other versions, and a NUL, take ``message_head``), and whole
frames for a run of them (``SessionContext.deliver_run``)."""

from __future__ import annotations

from sluicemq.core.routing.message import DEFAULT_PRIORITY, MESSAGE_ID_PREFIX, Message
from sluicemq.core.routing.queue import Consumer
from sluicemq.core.streams.chunks import RESUMED
from sluicemq.protocol.codec import encode_head_lenient, header_lines_12
from sluicemq.protocol.frames import Frame
from sluicemq.protocol.headers import escape

_WIRE_ID_PREFIX = escape(MESSAGE_ID_PREFIX, "1.2")
_DEFAULT = f"\npriority:{DEFAULT_PRIORITY}\nexpires:0\npersistent:false\n"
_DEFAULT_PERSISTENT = f"\npriority:{DEFAULT_PRIORITY}\nexpires:0\npersistent:true\n"


def message_head_12(consumer: Consumer, msg: Message, size: int, resumed: bool) -> bytes:
    """``_message_head`` for a 1.2 peer, written straight into one string: the broker's own
    headers are digits or names escaped once per consumer (``Consumer.wire``), and only the
    producer's go through the general escaping (``header_lines_12``) - a fifth of the cost of
    building a dict and encoding it. A producer's ``priority``, ``expires``, ``timestamp``
    or ``persistent`` replaces the broker's, as in ``_message_head``. ValueError for a NUL
    in a header."""
    stored = msg.headers
    mid = msg.mid
    wire = consumer.wire
    if wire is None or wire[0] != msg.destination:
        wire = consumer.wire = _wire_start(consumer, msg.destination)
    _, start, sub, ack = wire
    if ("timestamp" in stored and msg.deliveries <= 1 and not resumed and "priority" not in stored
            and "expires" not in stored and "persistent" not in stored):
        # a first delivery of a message with the broker's timestamp: nearly every MESSAGE
        if msg.priority == DEFAULT_PRIORITY and not msg.expires:  # the constant middle
            middle = _DEFAULT_PERSISTENT if msg.persistent else _DEFAULT
        else:
            persistent = "true" if msg.persistent else "false"
            middle = (f"\npriority:{msg.priority}\nexpires:{msg.expires}\npersistent:"
                      f"{persistent}\n")
        lines = header_lines_12(stored)
        length = f"\ncontent-length:{size}" if size else ""
        digits = str(mid)  # written three times, formatted once
        return f"{start}{digits}{sub}{digits}{ack}{digits}{middle}{lines}{length}\n\n".encode()
    head = f"{start}{mid}{sub}{mid}{ack}{mid}"
    if "priority" not in stored:
        head += f"\npriority:{msg.priority}"
    if "expires" not in stored:
        head += f"\nexpires:{msg.expires}"
    if "timestamp" not in stored:
        head += f"\ntimestamp:{msg.timestamp}"
    if "persistent" not in stored:
        head += "\npersistent:true" if msg.persistent else "\npersistent:false"
    if msg.deliveries > 1:
        head += f"\nredelivered:true\nsluice-delivery-count:{msg.deliveries}"
    if resumed and RESUMED not in stored:
        head += f"\n{RESUMED}:true"
    if stored:
        head += "\n" + header_lines_12(stored)
    if size:
        head += f"\ncontent-length:{size}"
    return (head + "\n\n").encode()


def run_frames_12(consumer: Consumer, msgs: list[Message], start: int, room: int,
                  share_from: int, deferring: bool) -> tuple[list[bytes], int]:
    """Whole MESSAGE frames (head, body, NUL) for ``msgs[start:]`` to a 1.2 ``consumer``, as
    ``SessionContext.deliver`` writes them, until ``room`` bytes are taken, with their length.
    Stops before a message that needs ``deliver``'s other ways: a body not held as ``bytes``
    or one from ``share_from`` bytes (written apart), a group (streams), a NUL in a header,
    or, while ``deferring`` (concurrent store and dispatch), a persistent message not yet
    stored. Counts each one's delivery."""
    frames: list[bytes] = []
    total = 0
    for i in range(start, len(msgs)):
        if total >= room:
            break
        msg = msgs[i]
        body = msg.body
        if (body is None or type(body) is not bytes or len(body) >= share_from
                or msg.group is not None
                or (deferring and msg.persistent and msg.ticket is None)):
            break
        msg.deliveries += 1
        try:
            head = message_head_12(consumer, msg, len(body), False)
        except ValueError:
            msg.deliveries -= 1
            break
        frame = b"".join((head, body, b"\x00"))
        frames.append(frame)
        total += len(frame)
    return frames, total


def _wire_start(consumer: Consumer, destination: str) -> tuple[str, str, str, str]:
    """The fixed parts of ``consumer``'s MESSAGE heads from ``destination``, escaped for 1.2:
    what comes before the message-id's number, before sluice-seq's and before ack's."""
    dest, sub = escape(destination, "1.2"), escape(consumer.sub_id, "1.2")
    if "\0" in dest or "\0" in sub:
        raise ValueError("a NUL in a header")
    return (destination, f"MESSAGE\ndestination:{dest}\nmessage-id:{_WIRE_ID_PREFIX}",
            f"\nsubscription:{sub}\nsluice-seq:", f"\nack:{consumer.index}-")


def message_head(consumer: Consumer, msg: Message, body: bytes | memoryview, version: str,
                 resumed: bool) -> bytes:
    """A MESSAGE head for any version, leaving out a header the version cannot carry."""
    # What ActiveMQ puts on every MESSAGE (clients read priority, expiry and persistence
    # from here); the producer's own headers, stored with the message, come last.
    h = {"destination": msg.destination, "message-id": msg.message_id,
         "subscription": consumer.sub_id, "sluice-seq": str(msg.mid),
         "priority": str(msg.priority), "expires": str(msg.expires),
         "timestamp": str(msg.timestamp),
         "persistent": "true" if msg.persistent else "false"}
    if version == "1.2":
        h["ack"] = f"{consumer.index}-{msg.mid}"
    if msg.deliveries > 1:
        h["redelivered"] = "true"
        h["sluice-delivery-count"] = str(msg.deliveries)
    if resumed:
        h[RESUMED] = "true"
    h.update(msg.headers)  # stored headers never use the keys above (filtered at SEND)
    return encode_head_lenient(Frame("MESSAGE", h, body), version)
