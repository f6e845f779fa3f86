"""Range reads, head queries and ledger commits: docs/replay-protocol.md, sections 1 and 2.

A ``browser:true`` SUBSCRIBE is not a consumer: it is a one-shot job on one queue (or durable
subscription) that reads without consuming, answers with an end frame, and is gone.

* The **seq** of a message is its broker-wide id, allocated when it becomes visible in its
  destination; the **head** is the next id to be allocated, so nothing can appear below it.
* Jobs start once everything appended before the request is durable: what a read sends and
  what an end frame counts is on disk, and the RECEIPT keeps its usual meaning.
* A read is paced by its connection: a step writes at most ~1 MiB, then the job waits for
  the next loop turn, or for the transport to drain (``Session.when_writable``). Each step
  looks the queue up afresh (``SeqView``), so nothing is materialised and concurrent acks
  or deliveries are simply seen.
* Head queries on an unchanged queue are answered from a small cache (a Spark driver polls
  an idle queue dozens of times a second).
* Commits remove through the ACK path in paced steps, wait for durability, then move the
  ledger (``LedgerBook``), then answer.

This module is the service a session talks to (``RangeService``); the jobs are in
``jobs.py``.
"""

from __future__ import annotations

import logging
import weakref
from collections import deque
from typing import TYPE_CHECKING, Any

from sluicemq.core.replay.commit import Committed
from sluicemq.core.replay.jobs import Commit, Head, Job, Read, Target
from sluicemq.core.replay.ledgers import LedgerBook
from sluicemq.core.replay.request import (
    CLIENT_ID,
    RangeError,
    parse_request,
)
from sluicemq.core.replay.seqindex import Fetcher, Found, SeqView
from sluicemq.core.replay.streams import (
    ChunkFacts,
    Facts,
    facts_of,
)
from sluicemq.core.routing import keys
from sluicemq.core.routing.message import Message
from sluicemq.core.routing.names import QUEUE
from sluicemq.errors import ProtocolError
from sluicemq.protocol.frames import Frame

if TYPE_CHECKING:
    from sluicemq.core.routing.broker import Broker
    from sluicemq.core.routing.queue import Queue
    from sluicemq.core.sessions.peer import SessionPeer as Session

log = logging.getLogger("sluicemq.ranges")

STEP_BYTES = 1 << 20  # written per loop turn by one read
STEP_MESSAGES = 1000
CLASSIFY_STEP = 4096  # messages classified per loop turn (streams mode)
REMOVE_STEP = 4096  # messages removed per loop turn (commits)
CACHE_SIZE = 256
DONE_IDS = 256  # finished range ids remembered per connection (a late UNSUBSCRIBE is fine)


class RangeService:
    """The broker's range reads, ledgers and chunk classifications (one per broker)."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.ledgers = LedgerBook(broker.config.data_dir)
        self.facts = ChunkFacts()
        self.committed = Committed()
        self.heads: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        self.plans: dict[tuple[Any, ...], tuple[Any, ...]] = {}  # (version, streams)
        self._jobs: weakref.WeakKeyDictionary[Session, dict[str, Job]] = (
            weakref.WeakKeyDictionary())
        self._done: weakref.WeakKeyDictionary[Session, deque[str]] = weakref.WeakKeyDictionary()

    # -- session hooks ---------------------------------------------------------------------
    def subscribe(self, session: Session, frame: Frame, kind: str, name: str) -> None:
        """A ``browser:true`` SUBSCRIBE (already authorized for READ): check it, start it."""
        h = frame.headers
        try:
            req = parse_request(h)
        except RangeError as exc:
            raise ProtocolError(str(exc), fatal=False) from None
        sub_id = h.get("id") or (h.get("destination", "") if session.version == "1.0" else None)
        if sub_id is None:
            raise ProtocolError("SUBSCRIBE requires an 'id' header", fatal=False)
        jobs = self._jobs.setdefault(session, {})
        if sub_id in session.consumers or sub_id in jobs:
            raise ProtocolError(f"subscription id {sub_id!r} already in use", fatal=False)
        limit = self.broker.config.limits.max_subscriptions
        if len(session.consumers) + len(jobs) >= limit:
            raise ProtocolError(f"too many subscriptions on this connection (limit {limit})",
                                fatal=False)
        target = self._target(session, h, kind, name)
        head = self.broker.next_mid
        start = req.start
        if start is None:
            start = self.ledgers.position(target.key, req.ledger) if req.ledger else 0
        to = max(min(head if req.to is None else req.to, head), start)
        if req.commit_upto is not None:
            if req.commit_upto > head:
                raise ProtocolError(f"sluice-commit-upto {req.commit_upto} is above the head "
                                    f"{head} of {target.destination}", fatal=False)
            job: Job = Commit(self, session, sub_id, frame, req, target, head,
                                req.start or 0, req.commit_upto)
        else:
            if req.ledger is not None and req.start is not None:
                position = self.ledgers.position(target.key, req.ledger)
                if req.start < position:
                    raise ProtocolError(
                        f"range [{req.start}, {to}) of {target.destination} was already "
                        f"committed by ledger {req.ledger} up to {position}", fatal=False)
            kind_of = Head if req.head_only else Read
            job = kind_of(self, session, sub_id, frame, req, target, head, start, to)
        jobs[sub_id] = job
        job.begin()

    def unsubscribe(self, session: Session, sub_id: str) -> bool:
        """UNSUBSCRIBE of a range id: stops a read; harmless once finished. False: not ours."""
        job = self._jobs.get(session, {}).get(sub_id)
        if job is not None:
            job.cancel()
            return True
        return sub_id in self._done.get(session, ())

    def ignorable_ack(self, queue: Queue, seq: int) -> bool:
        """An ACK/NACK for a message a commit took away from its consumer: ignore it."""
        return self.committed.covers(queue.key, seq)

    # -- targets -----------------------------------------------------------------------------
    def _target(self, session: Session, h: dict[str, str], kind: str, name: str) -> Target:
        durable = h.get("activemq.subscriptionName") or h.get("durable-subscription-name")
        if kind == QUEUE:
            if durable:
                raise ProtocolError("activemq.subscriptionName names a durable subscription of "
                                    "a /topic/ destination, not of a queue", fatal=False)
            return Target(self.broker.queues.get(name), keys.queue_key(name), f"/queue/{name}")
        if not durable:
            raise ProtocolError(f"a range read of /topic/{name} needs activemq.subscriptionName "
                                "(a topic retains messages only for durable subscriptions)",
                                fatal=False)
        client_id = h.get(CLIENT_ID) or session.client_id
        if not client_id:
            raise ProtocolError(f"a range read of a durable subscription needs {CLIENT_ID} "
                                "or a client-id on CONNECT", fatal=False)
        key = keys.durable_key(client_id, durable)
        entry = self.broker.durables.get(key)
        if entry is None or entry[0].topic != name:
            raise ProtocolError(f"no durable subscription {durable!r} of /topic/{name} for "
                                f"client-id {client_id!r}", fatal=False)
        owners = session.security.durables
        owner = owners.owner(key) if owners is not None else None
        if owner is not None and (session.user is None or session.user.name != owner):
            raise ProtocolError(f"durable subscription {durable!r} belongs to another user",
                                fatal=False)
        return Target(entry[1], key, f"/topic/{name}")

    # -- shared by the jobs ------------------------------------------------------------------
    def held(self, queue: Queue) -> list[Message]:
        """Chunks of this queue held back until their stream's final chunk arrives."""
        return [m for st in self.broker.streams.values()
                for hq, m in st.held if hq is queue]

    def view(self, queue: Queue) -> SeqView:
        return SeqView(queue, self.held(queue))

    def version(self, queue: Queue) -> tuple[int, ...]:
        """Changes whenever the queue's retained set may have changed."""
        s = queue.stats
        return (self.broker.next_mid, id(queue), s.enqueued, s.dequeued, s.expired,
                s.dead_lettered, len(queue.pending), queue.inflight_count)

    def classify(self, found: Found, fetcher: Fetcher) -> Facts:
        if isinstance(found, Message):
            return facts_of(found.headers)
        seq = found.tail.id_at(found.index)
        known = self.facts.get(seq)
        if known is not False:
            return known
        facts = facts_of(fetcher.headers(found))
        self.facts.remember(seq, facts)
        return facts

    def cached(self, store: dict[tuple[Any, ...], Any], key: tuple[Any, ...]) -> Any:
        return store.get(key)

    def remember(self, store: dict[tuple[Any, ...], Any], key: tuple[Any, ...],
                 value: Any) -> None:
        if len(store) >= CACHE_SIZE:
            store.clear()
        store[key] = value

    def finished(self, session: Session, sub_id: str) -> None:
        self._jobs.get(session, {}).pop(sub_id, None)
        done = self._done.get(session)
        if done is None:
            done = self._done[session] = deque(maxlen=DONE_IDS)
        done.append(sub_id)
