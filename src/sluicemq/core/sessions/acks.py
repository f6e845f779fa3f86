"""ACK and NACK: find what a frame acknowledges, then acknowledge or hand it back.

A 1.2 ``id`` names the consumer and message (``<index>-<seq>``); 1.0/1.1 name the
``message-id`` (and maybe the subscription). In ``client`` mode an ACK is cumulative.
Inside a transaction the ACK is spooled and resolved at COMMIT.
"""

from __future__ import annotations

from sluicemq.core.routing.message import Message
from sluicemq.core.routing.queue import CLIENT, Consumer
from sluicemq.core.sessions.context import SessionContext
from sluicemq.core.staging import frames as stage_frames
from sluicemq.errors import ProtocolError
from sluicemq.protocol.frames import Frame


def ack(session: SessionContext, frame: Frame, nack: bool = False) -> None:
    h = frame.headers
    txid = h.get("transaction")
    if txid is not None:
        spool = session.tx(txid)
        stage_frames.check_op(spool, frame)
        spool.add_ack({k: h[k] for k in ("id", "message-id", "subscription") if k in h}, nack)
        session.receipt(frame)
        return
    consumer, msgs = resolve(session, h, nack)
    if nack:
        returned = list(msgs)
        for group in {m.group for m in msgs if m.group in consumer.open_streams}:
            returned += consumer.queue.release_stream(consumer, group)
        returned.sort(key=lambda m: m.mid)  # a stream's chunks go back in sequence order
        consumer.queue.return_messages(returned)
    else:
        consumer.queue.acknowledge(msgs, consumer=consumer)
    session.receipt(frame)


def nack(session: SessionContext, frame: Frame) -> None:
    ack(session, frame, nack=True)


def resolve(session: SessionContext, h: dict[str, str],
            nack: bool) -> tuple[Consumer, list[Message]]:
    """Find what an ACK/NACK refers to, by 1.2 `id` or 1.0/1.1 `message-id`, and take it
    out of the consumer's in-flight messages."""
    ack_id = h.get("id")
    if ack_id is not None and "-" in ack_id and not ack_id.startswith("ID:"):
        idx, _, mid_text = ack_id.partition("-")
        try:
            consumer = session.by_index.get(int(idx))
            mid = int(mid_text)
        except ValueError:
            consumer = None
        if consumer is not None:
            return consumer, _take(session, consumer, mid)
        raise ProtocolError(f"unknown ack id {ack_id!r}", fatal=False)
    message_id = h.get("message-id") or ack_id
    if not message_id:
        raise ProtocolError(f"{'NACK' if nack else 'ACK'} requires an 'id' "
                            "(or 'message-id') header", fatal=False)
    if not message_id.startswith("ID:sluice-"):
        raise ProtocolError(f"unknown message-id {message_id!r}", fatal=False)
    try:
        mid = int(message_id[len("ID:sluice-"):])
    except ValueError:
        raise ProtocolError(f"unknown message-id {message_id!r}", fatal=False) from None
    sub = h.get("subscription")
    consumers = session.consumers
    candidates = [consumers[sub]] if sub in consumers else consumers.values()
    for consumer in candidates:
        if mid in consumer.inflight:
            return consumer, _take(session, consumer, mid)
    committed = session.ranges.ignorable_ack
    for consumer in candidates:
        if committed(consumer.queue, mid):  # a ledger commit took it away
            return consumer, _take(session, consumer, mid)
    raise ProtocolError(f"no unacknowledged message {message_id!r} on this connection",
                        fatal=False)


def _take(session: SessionContext, consumer: Consumer, mid: int) -> list[Message]:
    if mid not in consumer.inflight:
        if session.ranges.ignorable_ack(consumer.queue, mid):
            # A ledger commit took it away; a cumulative ACK still covers older ones.
            return consumer.take_inflight_below(mid) if consumer.ack_mode == CLIENT else []
        raise ProtocolError(f"message {mid} is not awaiting acknowledgement on subscription "
                            f"{consumer.sub_id!r}", fatal=False)
    if consumer.ack_mode == CLIENT:
        return consumer.take_inflight_upto(mid)
    return [consumer.inflight.pop(mid)]
