"""The jobs behind range reads: a head query, a read (messages, column batches, whole
streams) and a ledger commit, each run a bounded step per loop turn (``ranges.py`` starts
them for a SUBSCRIBE and cancels them for an UNSUBSCRIBE or a closed connection).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol

from sluicemq.core.replay import columns as rangecolumns
from sluicemq.core.replay.commit import Committed, Removal
from sluicemq.core.replay.ledgers import LedgerBook
from sluicemq.core.replay.request import (
    BATCH,
    COUNT,
    END,
    LEDGER_COMMITTED,
    MISSING,
    SEQ,
    SEQ_END,
    SEQ_FIRST,
    SEQ_NEXT,
    SPLITS,
    RangeRequest,
)
from sluicemq.core.replay.seqindex import Fetcher, Found, SeqView
from sluicemq.core.replay.streams import (
    ChunkFacts,
    Facts,
    StreamPlanner,
    WholeStream,
    select,
    stream_cuts,
)
from sluicemq.core.routing.message import Message
from sluicemq.protocol.codec import encode_frame, encode_head, encode_head_lenient
from sluicemq.protocol.columns import CONTENT_TYPE as COLUMNS_TYPE
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


class Target:
    """What a request reads: a queue (None: no such queue yet, so nothing retained), the key
    its ledgers and commits are filed under, and the destination MESSAGE frames name."""

    __slots__ = ("destination", "key", "queue")

    def __init__(self, queue: Queue | None, key: str, destination: str) -> None:
        self.queue = queue
        self.key = key
        self.destination = destination


class JobHost(Protocol):
    """What a job needs of the range service: caches, ledgers, views of the queues."""

    broker: Broker
    ledgers: LedgerBook
    facts: ChunkFacts
    committed: Committed
    heads: dict[tuple[Any, ...], tuple[Any, ...]]
    plans: dict[tuple[Any, ...], tuple[Any, ...]]

    def view(self, queue: Queue) -> SeqView: ...

    def version(self, queue: Queue) -> tuple[int, ...]: ...

    def classify(self, found: Found, fetcher: Fetcher) -> Facts: ...

    def cached(self, store: dict[tuple[Any, ...], Any], key: tuple[Any, ...]) -> Any: ...

    def remember(self, store: dict[tuple[Any, ...], Any], key: tuple[Any, ...],
                 value: Any) -> None: ...

    def finished(self, session: Session, sub_id: str) -> None: ...


class Job:
    """One request's life: wait for durability, run in paced steps, answer, forget."""

    def __init__(self, svc: JobHost, session: Session, sub_id: str, frame: Frame,
                 req: RangeRequest, target: Target, head: int, start: int, to: int) -> None:
        self.svc = svc
        self.broker = svc.broker
        self.session = session
        self.sub_id = sub_id
        self.frame = frame
        self.req = req
        self.target = target
        self.head = head
        self.start = start
        self.to = to
        self.cancelled = False
        self.done = False
        q = target.queue
        self.fetcher = Fetcher(self.broker.store, self.broker.pager,
                               q.destination if q is not None else target.destination)
        self._planner: StreamPlanner | None = None
        self._plan_cursor = 0
        self._plan_version: tuple[int, ...] | None = None
        self.streams: list[WholeStream] | None = None

    def begin(self) -> None:
        self.broker.when_durable(self._durable)

    def _durable(self, exc: BaseException | None) -> None:
        if self._gone():
            return
        if exc is not None:
            self.session.error(f"not stored: {exc}", self.frame, fatal=False,
                               extra={"subscription": self.sub_id})
            self._finish()
            return
        self.started()
        self.run()

    def started(self) -> None:
        """Once durable, before the first step (reads answer their RECEIPT here)."""

    def run(self) -> None:
        if self._gone():
            return
        try:
            self.step()
        except Exception as exc:
            log.exception("range job %s on %s failed", self.sub_id, self.target.destination)
            self.session.error(f"range read of {self.target.destination} failed: {exc}",
                               self.frame, fatal=False, extra={"subscription": self.sub_id})
            self._finish()

    def step(self) -> None:
        raise NotImplementedError

    def cancel(self) -> None:
        self.cancelled = True
        self._finish()

    def _gone(self) -> bool:
        if self.done:
            return True
        if self.cancelled or self.session.closed:
            self._finish()
            return True
        return False

    def _finish(self) -> None:
        if not self.done:
            self.done = True
            self.svc.finished(self.session, self.sub_id)

    def again(self, *, paced: bool = True) -> None:
        """Run the next step on a later loop turn; a paced job also waits for the socket."""
        if paced and not self.session.writable and not self.session.closed:
            self.session.when_writable(self.run)
        else:
            self.broker.call_soon(self.run)

    # -- frames ------------------------------------------------------------------------------
    def write_receipt(self) -> None:
        receipt = self.frame.headers.get("receipt")
        if receipt is not None:
            self.session.out.write(encode_frame(Frame("RECEIPT", {"receipt-id": receipt}),
                                                self.session.version))

    def write_message(self, msg: Message) -> int:
        h = {"destination": msg.destination, "message-id": msg.message_id,
             "subscription": self.sub_id, SEQ: str(msg.mid)}
        h.update(msg.headers)
        body = msg.body if msg.body is not None else self.broker.body_of(msg)
        head = encode_head_lenient(Frame("MESSAGE", h, body), self.session.version)
        out = self.session.out
        if len(body) < 65536:
            out.write(b"".join((head, body, b"\x00")))
        else:
            out.write(head)
            out.write(body)
            out.write(b"\x00")
        return len(head) + len(body) + 1

    def write_end(self, first: int | None, seq_end: int, count: int,
                  cuts: list[int] | None = None, committed: int | None = None) -> None:
        h = {"subscription": self.sub_id, "destination": self.target.destination,
             "message-id": f"{self.sub_id}-end", "browser": END,
             SEQ_FIRST: str(self.head if first is None else first), SEQ_NEXT: str(self.head),
             SEQ_END: str(seq_end), COUNT: str(count)}
        if cuts is not None:
            h[SPLITS] = ",".join(map(str, cuts))
        if self.target.queue is None:
            h[MISSING] = "true"
        if self.req.ledger is not None:
            if committed is None:
                committed = self.svc.ledgers.position(self.target.key, self.req.ledger)
            h[LEDGER_COMMITTED] = str(committed)
        self.session.out.write(encode_frame(Frame("MESSAGE", h), self.session.version))
        self._finish()

    def lowest(self) -> int | None:
        q = self.target.queue
        return self.svc.view(q).lowest() if q is not None else None

    # -- streams mode: the plan ----------------------------------------------------------
    def plan(self, below: int) -> bool:
        """Advance the streams plan over retained seqs below ``below``; True once complete."""
        if self.streams is not None:
            return True
        q = self.target.queue
        if q is None:
            self.streams = []
            return True
        key = ("plan", q.key, below)
        version = self.svc.version(q)
        if self._planner is None:
            hit = self.svc.cached(self.svc.plans, key)
            if hit is not None and hit[0] == version:
                self.streams = hit[1]
                return True
            self._planner = StreamPlanner(below)
            self._plan_version = version
        view = self.svc.view(q)
        batch = view.batch(self._plan_cursor, below, CLASSIFY_STEP)
        for seq, found in batch:
            self._planner.feed(seq, self.svc.classify(found, self.fetcher))
            self._plan_cursor = seq + 1
        if len(batch) == CLASSIFY_STEP:
            return False
        self.streams = self._planner.result()
        if version == self._plan_version:
            self.svc.remember(self.svc.plans, key, (version, self.streams))
        return True


class Head(Job):
    """``sluice-head-only``: the end frame alone, computed without reading any message."""

    def started(self) -> None:
        self.write_receipt()

    def step(self) -> None:
        q = self.target.queue
        req = self.req
        if req.streams:
            if not self.plan(self.to):
                self.again(paced=False)
                return
            chosen, seq_end = select(self.streams or [], self.start, self.to, req.max)
            cuts = stream_cuts(chosen, req.splits) if req.splits else None
            self.write_end(self.lowest(), seq_end, len(chosen), cuts)
            return
        if q is None:
            self.write_end(None, self.to, 0, [] if req.splits else None)
            return
        key = ("head", q.key, self.start, self.to, req.max, req.splits)
        version = self.svc.version(q)
        hit = self.svc.cached(self.svc.heads, key)
        if hit is None or hit[0] != version:
            hit = (version, *self._compute(self.svc.view(q)))
            self.svc.remember(self.svc.heads, key, hit)
        _v, first, seq_end, count, cuts = hit
        self.write_end(first, seq_end, count, cuts)

    def _compute(self, view: SeqView) -> tuple[int | None, int, int, list[int] | None]:
        req = self.req
        count = view.count(self.start, self.to)
        seq_end = self.to
        if req.max is not None and count > req.max:
            last = view.nth(self.start, self.to, req.max - 1)
            assert last is not None
            seq_end, count = last + 1, req.max
        cuts = view.cuts(self.start, seq_end, req.splits) if req.splits else None
        return view.lowest(), seq_end, count, cuts


class Read(Job):
    """A range read: the retained messages of ``[start, to)`` in seq order, paced."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.cursor = self.start
        self.sent = 0
        self._stream_index = 0  # streams mode: next stream, next chunk within it
        self._chunk_index = 0

    def started(self) -> None:
        self.write_receipt()

    def step(self) -> None:
        if self.req.streams:
            self._step_streams()
            return
        if self.req.batch_bytes:
            self._step_columns()
            return
        q = self.target.queue
        written = messages = 0
        limit = self.req.max
        while True:
            if q is None:
                self.write_end(None, self.to, 0)
                return
            want = STEP_MESSAGES - messages
            if limit is not None:
                want = min(want, limit - self.sent)
            view = self.svc.view(q)
            batch = view.batch(self.cursor, self.to, want)
            if not batch:
                self.write_end(view.lowest(), self.to, self.sent)
                return
            selector = self.req.selector
            for seq, found in batch:
                msg = self.fetcher.message(found)
                messages += 1
                self.cursor = seq + 1
                if selector is not None and not selector.matches(msg.headers):
                    continue
                written += self.write_message(msg)
                self.sent += 1
                if limit is not None and self.sent >= limit:
                    self.write_end(self.lowest(), self.cursor, self.sent)
                    return
                if written >= STEP_BYTES:
                    break
            if written >= STEP_BYTES or messages >= STEP_MESSAGES or not self.session.writable:
                self.again()
                return

    def _step_columns(self) -> None:
        """One column batch per loop turn (``sluice-format:columns``)."""
        q = self.target.queue
        if q is None:
            self.write_end(None, self.to, 0)
            return
        limit = self.req.max
        want = rangecolumns.MAX_MESSAGES if limit is None else limit - self.sent
        view = self.svc.view(q)
        pending = q.pending
        average = pending.stored_bytes / len(pending) if pending.stored_bytes else 1024.0
        writer, cursor = rangecolumns.fill(view, self.fetcher, self.broker.body_of,
                                           self.cursor, self.to,
                                           max_bytes=self.req.batch_bytes, max_messages=want,
                                           average_size=max(1.0, average),
                                           spans=self.req.spans, selector=self.req.selector)
        if not writer:
            if cursor > self.cursor:  # looked at messages, none matched the selector
                self.cursor = cursor
                self.again()
                return
            self.write_end(view.lowest(), self.to, self.sent)
            return
        parts = writer.finish()  # written as they are: the bodies are views of the journal
        h = {"subscription": self.sub_id, "destination": self.target.destination,
             "message-id": f"{self.sub_id}-{self.cursor}", BATCH: str(len(writer)),
             "content-type": COLUMNS_TYPE}
        out = self.session.out
        out.write(encode_head(Frame("MESSAGE", h), self.session.version,
                              body_length=sum(map(len, parts))))
        for part in parts:
            out.write(part)
        out.write(b"\x00")
        self.sent += len(writer)
        self.cursor = cursor
        if limit is not None and self.sent >= limit:
            self.write_end(self.lowest(), self.cursor, self.sent)
            return
        self.again()

    def _step_streams(self) -> None:
        if not self.plan(self.to):
            self.again(paced=False)
            return
        chosen, seq_end = select(self.streams or [], self.start, self.to, self.req.max)
        q = self.target.queue
        written = 0
        while self._stream_index < len(chosen):
            assert q is not None
            stream = chosen[self._stream_index]
            view = self.svc.view(q)
            while self._chunk_index < len(stream.chunks):
                found = view.find(stream.chunks[self._chunk_index])
                self._chunk_index += 1
                if found is not None:  # else removed meanwhile: the reader sees the gap
                    written += self.write_message(self.fetcher.message(found))
                if written >= STEP_BYTES or not self.session.writable:
                    if self._chunk_index >= len(stream.chunks):
                        self._next_stream()
                    self.again()
                    return
            self._next_stream()
        self.write_end(self.lowest(), seq_end, self.sent)

    def _next_stream(self) -> None:
        self._stream_index += 1
        self._chunk_index = 0
        self.sent += 1


class Commit(Job):
    """``sluice-commit-upto``: remove, make durable, move the ledger, answer."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.removal: Removal | None = None
        self.count = 0

    def step(self) -> None:
        q = self.target.queue
        if self.removal is None:
            if q is None:
                self._removed()
                return
            lo, hi, only = self.start, self.to, None
            if self.req.streams:
                if not self.plan(self.to):
                    self.again(paced=False)
                    return
                chosen, _end = select(self.streams or [], self.start, self.to, None)
                self.count = len(chosen)
                only = {seq for s in chosen for seq in s.chunks}
                if not only:
                    self._removed()
                    return
                lo, hi = min(only), max(only) + 1
            self.svc.committed.add(self.target.key, lo, hi)
            self.removal = Removal(self.broker, q, lo, hi, only, self.svc.facts)
        if not self.removal.step(REMOVE_STEP):
            self.again(paced=False)
            return
        if not self.req.streams:
            self.count = self.removal.removed
        self._removed()

    def _removed(self) -> None:
        self.broker.when_durable(self._durable_again)

    def _durable_again(self, exc: BaseException | None) -> None:
        if self.done:
            return
        session = self.session
        if exc is not None:
            if not session.closed:
                session.error(f"not stored: {exc}", self.frame, fatal=False,
                              extra={"subscription": self.sub_id})
            self._finish()
            return
        ledger = self.req.ledger
        assert ledger is not None
        try:
            if self.req.start is None:
                position = self.svc.ledgers.advance(self.target.key, ledger, self.to)
            else:
                position = self.svc.ledgers.position(self.target.key, ledger)
        except OSError as exc:
            log.error("ledger %s of %s not stored: %s", ledger, self.target.key, exc)
            if not session.closed:
                session.error(f"ledger not stored: {exc}", self.frame, fatal=False,
                              extra={"subscription": self.sub_id})
            self._finish()
            return
        if session.closed:
            self._finish()
            return
        self.write_end(self.lowest(), self.to, self.count, committed=position)
        self.write_receipt()

    def cancel(self) -> None:
        """A commit runs to its end: an UNSUBSCRIBE cannot leave it half done."""

    def _gone(self) -> bool:
        return self.done  # commits finish even if the connection went
