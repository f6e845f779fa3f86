"""Start-up replay: the journal's records, in order, rebuild queues and durable subscriptions.

Replay keeps, per journal key, an insertion-ordered dict of live messages so that an ACK
removes in O(1); queues are filled only at the end, in journal order, which is the order the
messages were sent. Transaction parts are applied only when their final record is present.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from typing import TYPE_CHECKING, Any

from sluicemq.core.message import Message
from sluicemq.core.selectors import compile_selector
from sluicemq.core.streams import (
    COMPLETE_FIRST,
    DISPATCHING,
    FINAL,
    NAME,
    OFFSET,
    SEQ,
    SHA256,
    SIZE,
    STREAM_ID,
    StreamState,
)
from sluicemq.storage import records

if TYPE_CHECKING:
    from sluicemq.core.broker import Broker

log = logging.getLogger("sluicemq.recovery")


class _Replay:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.live: dict[str, dict[int, Message]] = defaultdict(dict)
        self.subs: dict[str, records.DurableSub] = {}
        self.selectors: dict[str, Any] = {}
        self.tx_parts: dict[str, list[Any]] = defaultdict(list)
        self.max_mid = 0
        self.records = 0
        self.streams: dict[str, StreamState] = {}
        self.spill = broker.config.journal.spill_bytes

    def message(self, payload: bytes | memoryview, ticket: Any, in_tx: bool = False) -> None:
        sm = records.decode_message(payload)
        self.max_mid = max(self.max_mid, sm.mid)
        if STREAM_ID in sm.headers:
            self._stream_chunk(sm, ticket)
        body: bytes | None = sm.body
        if not in_tx and len(sm.body) >= self.spill:
            body = None  # read back from the journal when delivered
        kind, _, name = sm.key.partition(":")
        if kind == "t":
            keys = [k for k, s in self.subs.items() if s.topic == name and self._matches(k, sm)]
            destination = f"/topic/{name}"
        else:
            keys = [sm.key]
            destination = f"/queue/{name}" if kind == "q" else sm.key
        for key in keys:
            msg = Message(sm.mid, destination, sm.headers, body, persistent=True,
                          priority=sm.priority, expires=sm.expires, timestamp=sm.timestamp)
            msg.size = len(sm.body)
            msg.ticket = ticket
            self.live[key][sm.mid] = msg

    def _stream_chunk(self, sm: records.StoredMessage, ticket: Any) -> None:
        """A chunk on disk tells how far its stream got, even if it was consumed since."""
        h = sm.headers
        sid = h[STREAM_ID]
        st = self.streams.get(sid)
        if st is None:
            kind, _, name = sm.key.partition(":")
            st = StreamState(sid, h.get(NAME, sid), f"/{'topic' if kind == 't' else 'queue'}/"
                             f"{name}", sm.key)
            self.streams[sid] = st
        try:
            seq, offset = int(h.get(SEQ, "0")), int(h.get(OFFSET, "0"))
        except ValueError:
            return
        if seq + 1 > st.next_seq:
            st.next_seq = seq + 1
            st.next_offset = offset + len(sm.body)
            st.last_ticket = ticket
        st.chunks += 1
        st.received_bytes += len(sm.body)
        if h.get(FINAL) == "true":
            st.size = int(h.get(SIZE, st.next_offset))
            st.sha256 = h.get(SHA256)
            st.state = DISPATCHING

    def _matches(self, key: str, sm: records.StoredMessage) -> bool:
        selector = self.selectors.get(key)
        return selector is None or selector.matches(sm.headers)

    def acks(self, payload: bytes | memoryview) -> None:
        for key, mid in records.decode_acks(payload):
            live = self.live.get(key)
            if live is not None:
                live.pop(mid, None)

    def tx(self, payload: bytes | memoryview, ticket: Any) -> None:
        txid, final, ops = records.decode_tx(payload)
        if not final:
            self.tx_parts[txid].append(ticket)
            return
        for part in self.tx_parts.pop(txid, []):
            _, _, part_ops = records.decode_tx(self.broker.store.read(part.loc))
            self.apply_ops(part_ops, part)
        self.apply_ops(ops, ticket)

    def apply_ops(self, ops: list[tuple[int, memoryview]], ticket: Any) -> None:
        for rtype, op in ops:
            if rtype == records.MSG:
                self.message(op, ticket, in_tx=True)
            elif rtype == records.ACK:
                self.acks(op)

    def sub(self, payload: bytes | memoryview) -> None:
        sub = records.decode_sub(payload)
        self.subs[sub.key] = sub
        self.selectors[sub.key] = compile_selector(sub.selector) if sub.selector else None
        self.live[sub.key] = {}

    def unsub(self, payload: bytes | memoryview) -> None:
        key = records.decode_unsub(payload)
        self.subs.pop(key, None)
        self.selectors.pop(key, None)
        self.live.pop(key, None)

    def install(self) -> int:
        broker = self.broker
        for sub in self.subs.values():
            broker._install_durable(sub)
        restored = 0
        for key, msgs in self.live.items():
            kind, _, name = key.partition(":")
            if kind == "q":
                queue = broker.queue(name)
            elif key in broker.durables:
                queue = broker.durables[key][1]
            else:
                continue
            complete_first = queue.policy.stream_dispatch == COMPLETE_FIRST
            for msg in msgs.values():
                broker.store.hold(msg.ticket)
                restored += 1
                st = self.streams.get(msg.group) if msg.group is not None else None
                if complete_first and st is not None and not st.final_stored:
                    st.held.append((queue, msg))  # type: ignore[arg-type]
                else:
                    queue.pending.push(msg)
        self._install_streams()
        # Ids never repeat across restarts, even after every segment was reclaimed: start no
        # lower than the clock in microseconds (ids are allocated far slower than 1 per µs).
        broker.next_mid = max(self.max_mid + 1, int(time.time() * 1_000_000))
        return restored


    def _install_streams(self) -> None:
        """Open streams (and finished ones with chunks left) keep their state; the rest are
        remembered as finished so a late resume query still gets a true answer."""
        broker = self.broker
        live_groups = {m.group for msgs in self.live.values() for m in msgs.values()}
        for sid, st in self.streams.items():
            if st.final_stored and sid not in live_groups and not st.held:
                st.state = "complete"
                broker.finished_streams[sid] = st
                st.last_ticket = None
                continue
            broker.streams[sid] = st
            if st.last_ticket is not None:
                broker.store.hold(st.last_ticket)  # re-pin the tail, as while running


def replay(broker: Broker) -> dict[str, int]:
    """Replay every intact record; returns what was restored, for the start-up log line."""
    started = time.monotonic()
    r = _Replay(broker)
    for rtype, payload, ticket in broker.store.recover():
        r.records += 1
        if rtype == records.MSG:
            r.message(payload, ticket)
        elif rtype == records.ACK:
            r.acks(payload)
        elif rtype == records.TX:
            r.tx(payload, ticket)
        elif rtype == records.SUB:
            r.sub(payload)
        elif rtype == records.UNSUB:
            r.unsub(payload)
        else:
            log.warning("skipping journal record of unknown type %d", rtype)
    restored = r.install()
    broker.store.journal.reclaim()
    if r.tx_parts:
        log.warning("discarded %d uncommitted transaction(s) found in the journal",
                    len(r.tx_parts))
    return {"records": r.records, "messages": restored, "durable_subscriptions": len(r.subs),
            "elapsed_ms": int((time.monotonic() - started) * 1000)}
