"""SEND: a short pipeline of named steps, each of which may finish the frame.

    route -> authorize -> flow -> query -> dedup -> stream -> transaction -> publish

A SEND with none of the headers that need the middle steps (``_SPECIAL``) goes from flow
straight to publish; a queue it was routed and authorized to once is not asked again.

``route`` resolves temporaries and sends composite destinations and virtual topics down the
fan-out path (a copy per destination, one journal transaction); every other SEND names one
destination and goes through ``PIPELINE`` in order. A step returns True once it has answered
the frame (a receipt, a duplicate, a wait for room), False to hand it on.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass

from sluicemq.config import Policy
from sluicemq.core.dedup import producers as dedup
from sluicemq.core.limits import txlimits
from sluicemq.core.paging.flow import Pacing, TooLarge
from sluicemq.core.routing.message import Message, from_send
from sluicemq.core.routing.names import QUEUE, TOPIC, parse_composite, parse_destination
from sluicemq.core.routing.temporary import PREFIX as TEMP_PREFIX
from sluicemq.core.scheduling import scheduler as scheduled
from sluicemq.core.security.policy import WRITE
from sluicemq.core.sessions.context import SessionContext
from sluicemq.core.sessions.transactions import spool_send
from sluicemq.core.staging import frames as stage_frames
from sluicemq.core.streams.chunks import (
    DUPLICATE,
    GROUP,
    NEXT_SEQ,
    QUERY,
    STREAM_ID,
    WAIT_CONSUMER,
    ChunkError,
    parse_chunk,
)
from sluicemq.errors import ProtocolError
from sluicemq.protocol.frames import Frame

log = logging.getLogger("sluicemq.session")

_composite_ids = itertools.count(1)


@dataclass(slots=True)
class Send:
    """One SEND on its way through the pipeline."""

    frame: Frame
    kind: str
    name: str
    txid: str | None
    producer: tuple[str, int] | None = None  # (producer id, sequence) when numbered


# Headers that take a SEND off the plain path: a stream query, a numbered (deduplicated)
# producer, a stream chunk, a transaction, a staged column batch, a delay or schedule (so a
# plain SEND is published without asking the scheduler).
_SPECIAL = frozenset({QUERY, dedup.PRODUCER_ID, dedup.PRODUCER_SEQ, STREAM_ID, "transaction",
                      stage_frames.FORMAT, *scheduled.HEADERS})
MAX_KNOWN_TARGETS = 64  # destinations a session remembers as routed and authorized


def send(session: SessionContext, frame: Frame) -> None:
    h = frame.headers
    known = session.send_targets.get(h.get("destination", "")) if "reply-to" not in h else None
    if known is None:
        target = route(session, frame)
        if target is None:
            return
        kind, name = target
        authorize_target(session, kind, name)
        destination = remember(session, h["destination"], kind, name)
        policy = None
    else:  # routed and authorized before: only the queue may have gone meanwhile
        kind, (name, destination, policy) = QUEUE, known
        if name not in session.broker.queues:
            session.admit_destination(kind, name)
    if h.keys().isdisjoint(_SPECIAL):  # the plain path: what most SENDs are
        if (session.broker.room_for(kind, name, h.get("persistent") == "true", policy,
                                    len(frame.body), session.store_owner) is not None
                and no_room(session, frame, kind, name, policy)):
            return  # (``no_room`` asks again and says why: only when there is no room)
        session.received += 1
        session.broker.publish(kind, name,
                               message(session, kind, name, h, frame.body, destination), session)
        if "receipt" in h:
            session.receipt(frame)
        return
    s = Send(frame, kind, name, h.get("transaction"))
    for step in PIPELINE:
        if step(session, s):
            return


def remember(session: SessionContext, destination: str, kind: str, name: str) -> str | None:
    """Keep a plain queue a session sends to, routed and authorized, with its policy: whether
    it may write there, where the name leads and the config's policy for it do not change
    during a session (a temporary or a topic, whose virtual queues come and go, is routed
    every time). Bounded: a client naming thousands of queues only costs itself the routing.
    Returns the destination's name for its messages (one string shared by all of them), None
    when not kept."""
    if kind != QUEUE or name.startswith(TEMP_PREFIX) or destination != f"/queue/{name}":
        return None
    known = session.send_targets
    if len(known) >= MAX_KNOWN_TARGETS:
        known.clear()
    known[destination] = (name, destination, session.broker.policy(kind, name))
    return destination


def route(session: SessionContext, frame: Frame) -> tuple[str, str] | None:
    """The one destination this SEND goes to, or None when it fanned out (and was answered)."""
    h = frame.headers
    if h.get("destination", "").startswith(("/temp-", "/remote-temp-")) or "reply-to" in h:
        session.resolve_temporary(frame)
    if "," in h.get("destination", ""):
        send_composite(session, frame, parse_composite(h["destination"]))
        return None
    kind, name = parse_destination(h.get("destination"))
    scheduled.refuse_direct(kind, name)
    if name.startswith(TEMP_PREFIX):  # kept in memory only, as ActiveMQ's temporaries
        session.broker.temps.check(kind, name, session.id, consuming=False)
        h.pop("persistent", None)
    if kind == TOPIC and (groups := session.broker.subscriptions.virtual_queues(name)):
        # a virtual topic: its consumer groups' queues get a copy each, atomically
        send_composite(session, frame, [(kind, name), *((QUEUE, g) for g in groups)],
                       authorize_all=False)
        return None
    return kind, name


def authorize_target(session: SessionContext, kind: str, name: str) -> None:
    session.authorize(WRITE, kind, name)
    session.admit_destination(kind, name)
    session.broker.advisories.producer(session.id, kind, name)


def flow(session: SessionContext, s: Send) -> bool:
    """Producer flow control (a stream query takes no room); counts the SEND as received."""
    if QUERY not in s.frame.headers and no_room(session, s.frame, s.kind, s.name):
        return True
    session.received += 1
    return False


def query(session: SessionContext, s: Send) -> bool:
    """Where should a reconnecting producer resume?  Optionally wait for a consumer."""
    frame = s.frame
    if QUERY not in frame.headers:
        return False
    try:
        answer = session.broker.large_streams.query(s.kind, s.name, frame.headers[QUERY],
                                             session.owner())
    except ChunkError as exc:
        raise ProtocolError(str(exc), fatal=False) from None
    wait = frame.headers.get(WAIT_CONSUMER)
    if wait is None:
        session.receipt(frame, answer)
        return True
    try:
        timeout = float(wait)
    except ValueError:
        raise ProtocolError(f"invalid {WAIT_CONSUMER} {wait!r}", fatal=False) from None

    def ready(count: int) -> None:
        session.receipt(frame, dict(answer, **{"sluice-stream-consumers": str(count)}))

    session.broker.wait_for_consumer(s.kind, s.name, timeout, ready, owner=session)
    return True


def dedup_step(session: SessionContext, s: Send) -> bool:
    """A numbered SEND seen before (outside a transaction) is answered, not stored again."""
    s.producer = _producer(s.frame)
    if (s.producer is not None and s.txid is None
            and session.broker.producers.is_duplicate(*s.producer, session.broker.now_ms())):
        session.receipt(s.frame, {dedup.DUPLICATE: "true"})
        return True
    return False


def stream(session: SessionContext, s: Send) -> bool:
    """A chunk of a large stream: owner, sequence and offset checked; a re-sent one dropped."""
    h, frame = s.frame.headers, s.frame
    if STREAM_ID not in h:
        return False
    if GROUP in h:
        try:
            session.broker.large_streams.check_group(s.kind, s.name, h[GROUP], session.owner())
        except ChunkError as exc:
            raise ProtocolError(str(exc), fatal=False) from None
    if s.txid is not None:
        return False
    try:
        chunk = parse_chunk(h, len(frame.body))
        streams = session.broker.large_streams
        if not streams.accept_chunk(s.kind, s.name, chunk, len(frame.body), session.peer,
                                    session.owner()):
            session.receipt(frame, {DUPLICATE: "true"})
            return True
    except ChunkError as exc:
        extra = {NEXT_SEQ: str(exc.next_seq)} if exc.next_seq is not None else None
        session.error(str(exc), frame, fatal=False, extra=extra)
        return True
    return False


def transaction(session: SessionContext, s: Send) -> bool:
    """Inside a transaction (or a staged part) the SEND goes to the spool until COMMIT."""
    if s.txid is None:
        return False
    frame = s.frame
    if session.scheduler.wants(frame.headers):
        raise ProtocolError("a scheduled SEND inside a transaction is not supported",
                            fatal=False)
    spool = session.tx(s.txid)
    spools = session.transactions.values()
    txlimits.admit(spools, len(frame.body), session.tx_limit)
    txlimits.bound_memory(spools)
    now = session.broker.now_ms()
    if not stage_frames.add_send(session, spool, frame, s.kind, s.name, now):
        spool_send(spool, frame, s.kind, s.name, now)
    session.receipt(frame)
    return True


def publish(session: SessionContext, s: Send) -> bool:
    stage_frames.refuse_batch(s.frame.headers)
    _publish(session, s.kind, s.name, s.frame, s.producer)
    return True


def _publish(session: SessionContext, kind: str, name: str, frame: Frame,
             producer: tuple[str, int] | None) -> None:
    """Route the message now (or hand it to the scheduler when it asks for a delay)."""
    h = frame.headers
    msg = message(session, kind, name, h, frame.body)
    if not (session.scheduler.wants(h) and session.scheduler.schedule(kind, name, msg)):
        session.broker.publish(kind, name, msg, session)
    if producer is not None:
        session.broker.producers.accepted(*producer, msg.timestamp, msg.ticket)
    session.receipt(frame)


PIPELINE: tuple[Callable[[SessionContext, Send], bool], ...] = (
    flow, query, dedup_step, stream, transaction, publish)


def send_composite(session: SessionContext, frame: Frame, targets: list[tuple[str, str]], *,
                   authorize_all: bool = True) -> None:
    """SEND to ``/queue/a,/topic/b`` (or a virtual topic and its group queues): a copy to
    each destination, stored as one journal transaction when persistent (all copies or none
    survive a crash), each flow-controlled as if sent there alone and, unless the broker adds
    them itself (virtual topics), authorized."""
    h = frame.headers
    broker = session.broker
    for kind, name in targets if authorize_all else targets[:1]:
        session.authorize(WRITE, kind, name)
        session.admit_destination(kind, name)
        broker.advisories.producer(session.id, kind, name)
    for special in (QUERY, STREAM_ID, stage_frames.FORMAT):
        if special in h:
            raise ProtocolError(f"{special} is not supported on a composite destination",
                                fatal=False)
    if session.scheduler.wants(h):
        raise ProtocolError("a scheduled SEND to several destinations is not supported",
                            fatal=False)
    for kind, name in targets:
        if no_room(session, frame, kind, name):
            return  # the whole SEND runs again once there is room
    session.received += 1
    txid = h.get("transaction")
    producer = _producer(frame)
    if (producer is not None and txid is None
            and broker.producers.is_duplicate(*producer, broker.now_ms())):
        session.receipt(frame, {dedup.DUPLICATE: "true"})
        return
    if txid is not None:
        spool = session.tx(txid)
        spools = session.transactions.values()
        txlimits.admit(spools, len(frame.body) * len(targets), session.tx_limit)
        txlimits.bound_memory(spools)
        for kind, name in targets:
            spool_send(spool, frame, kind, name, broker.now_ms())
        session.receipt(frame)
        return
    copies = [(kind, name, message(session, kind, name, h, frame.body))
              for kind, name in targets]
    if copies[0][2].persistent:
        broker.commit(f"{session.id}:composite:{next(_composite_ids)}", copies, [], [])
    else:
        for kind, name, msg in copies:
            broker.publish(kind, name, msg, session)
    if producer is not None:
        broker.producers.accepted(*producer, copies[-1][2].timestamp, copies[-1][2].ticket)
    session.receipt(frame)


def no_room(session: SessionContext, frame: Frame, kind: str, name: str,
            policy: Policy | None = None) -> bool:
    """Producer flow control: True when this SEND was refused or must wait for room.

    Waiting pauses reading this connection (its later frames wait behind the SEND, in order)
    until the destination has room; other connections carry on. A transactional SEND only
    goes to the spool, so only its size is checked (its COMMIT meets the rest); a SEND into a
    staged part is journaled with the part, and persistent, so it meets them all.
    ``policy``: the destination's, when the caller has it (``remember``).
    """
    broker = session.broker
    flow_control = broker.flow
    if policy is None:
        policy = broker.policy(kind, name)
    txid = frame.headers.get("transaction")
    staged = txid is not None and isinstance(session.transactions.get(txid),
                                             stage_frames.StageSpool)
    if txid is not None and not staged:
        too_large = flow_control.too_large(policy, len(frame.body))
        if too_large is not None:
            raise ProtocolError(too_large, fatal=False)
        return False
    persistent = staged or frame.headers.get("persistent") == "true"
    size, owner = len(frame.body), session.store_owner
    reason = broker.room_for(kind, name, persistent, policy, size, owner)
    if reason is None:
        return False
    if isinstance(reason, TooLarge):
        raise ProtocolError(reason, fatal=False)
    if policy.fail_if_no_space:
        flow_control.failed_total += 1
        raise ProtocolError(f"/{kind}/{name} cannot take the message: {reason}", fatal=False)
    log.log(logging.DEBUG if isinstance(reason, Pacing) else logging.INFO,
            "flow control: %s waits for /%s/%s (%s)", session.peer, kind, name, reason)
    session.wait_behind(frame)

    def recheck() -> str | None:
        return None if session.closed else broker.room_for(kind, name, persistent, None, size,
                                                           owner)

    flow_control.wait(recheck, session.resume_waiting, reason)
    return True


def message(session: SessionContext, kind: str, name: str, h: dict[str, str],
            body: bytes | memoryview, destination: str | None = None) -> Message:
    broker = session.broker
    mid = broker.next_mid  # ``allocate_mid``, written out: once per SEND
    broker.next_mid = mid + 1
    return from_send(mid, destination or f"/{kind}/{name}", h, body, broker.now_ms(),
                     session.store_owner)


def _producer(frame: Frame) -> tuple[str, int] | None:
    h = frame.headers
    if dedup.PRODUCER_ID in h or dedup.PRODUCER_SEQ in h:
        return dedup.producer_of(h)
    return None
