"""BEGIN, COMMIT and ABORT: a transaction's SENDs and ACKs wait in a spool until COMMIT.

COMMIT replays the spool: numbered SENDs seen before are dropped, ACKs are resolved, and the
whole is handed to the broker as one transaction. A staged part (``stage_frames``) commits
through the stager instead. Producer flow control applies at COMMIT, which is what stores the
SENDs (a spooled SEND takes no room): a COMMIT to a destination without room waits as a SEND
would, or with ``fail_if_no_space`` gets an ERROR and the transaction stays open - else a
user could pass her destinations' ``store_limit`` and the broker's through transactions. A
staged batch's publication, which makes its messages ready at once, meets the same check.
A COMMIT's ``store_limit`` checks count its own ACKs as applied (``flow.Credit``): found by
resolving them against copies of the consumers' in-flight messages, so a consume-transform-
produce loop on a full destination does not wait for room only its COMMIT would make.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from sluicemq.core.dedup import producers as dedup
from sluicemq.core.paging.flow import Credit, Pacing
from sluicemq.core.routing import keys
from sluicemq.core.routing.message import (
    TRANSPORT_HEADERS,
    Message,
    parse_expires,
    parse_priority,
)
from sluicemq.core.routing.names import destination_of
from sluicemq.core.routing.queue import Consumer, Queue
from sluicemq.core.sessions import acks
from sluicemq.core.sessions.context import SessionContext
from sluicemq.core.staging import frames as stage_frames
from sluicemq.core.staging.book import STAGE_ABORT, STAGE_COMMIT
from sluicemq.errors import ProtocolError
from sluicemq.protocol.frames import Frame
from sluicemq.storage.txspool import StoredMessage, TxSpool

log = logging.getLogger("sluicemq.session")


def begin(session: SessionContext, frame: Frame) -> None:
    txid = _tx_id(frame)
    if txid in session.transactions:
        raise ProtocolError(f"transaction {txid!r} already open", fatal=False)
    config = session.broker.config
    limit = config.limits.max_transactions
    if len(session.transactions) >= limit:
        raise ProtocolError(f"too many open transactions on this connection (limit {limit}, "
                            "max_transactions)", fatal=False)
    directory = Path(config.data_dir) / "tmp"
    directory.mkdir(parents=True, exist_ok=True)
    session.transactions[txid] = stage_frames.open_spool(directory, txid, frame.headers)
    session.receipt(frame)


def abort(session: SessionContext, frame: Frame) -> None:
    if STAGE_ABORT in frame.headers:
        stage_frames.abort(session, frame)
        return
    txid = _tx_id(frame)
    session.tx(txid).close()
    del session.transactions[txid]
    session.receipt(frame)


def commit(session: SessionContext, frame: Frame) -> None:
    if STAGE_COMMIT in frame.headers:
        targets = [(kind, name, True) for kind, name in stage_frames.targets(session, frame)]
        if not no_room(session, frame, f"publication of {frame.headers[STAGE_COMMIT]}",
                       targets):
            stage_frames.publish(session, frame)
        return
    txid = _tx_id(frame)
    spool = session.tx(txid)
    if no_room(session, frame, f"COMMIT of {txid}",
               [(keys.kind_of(k), keys.name_of(k), p) for k, p in spool.targets.items()],
               None if isinstance(spool, stage_frames.StageSpool)
               else lambda: own_credit(session, spool), spool.nbytes, session.store_owner,
               not isinstance(spool, stage_frames.StageSpool) and len(spool) > 1):
        return
    del session.transactions[txid]
    try:
        extra = _apply(session, txid, spool)
    finally:
        spool.close()
    session.receipt(frame, extra)


def no_room(session: SessionContext, frame: Frame, what: str,
            targets: list[tuple[str, str, bool]],
            own: Callable[[], Credit] | None = None, size: int = 0,
            owner: bytes | None = None, several: bool = False) -> bool:
    """Producer flow control for a COMMIT or a publication ``what`` storing messages in
    ``targets`` ((kind, name, persistent)): True when it was refused (ERROR; a transaction is
    kept) or waits for room (it runs again then, and the frames after it wait behind it).
    ``own``: the room the COMMIT makes itself, asked for only when a destination is full.
    ``size`` and ``owner``: what the transaction stores (its spool's bytes, an upper bound)
    and who sent it, for the sender's share of the store; ``several``: it may hold more than
    one message (then the share's pass for one message larger than it does not apply)."""
    broker = session.broker
    credit: Credit | None = None
    for kind, name, persistent in targets:
        reason = broker.room_for(kind, name, persistent, owner=owner, stored=size,
                                 several=several)
        if reason is not None and own is not None:
            credit = credit or own()
            reason = broker.room_for(kind, name, persistent, credit=credit, owner=owner,
                                     stored=size)
        if reason is None:
            continue
        if broker.policy(kind, name).fail_if_no_space:
            broker.flow.failed_total += 1
            raise ProtocolError(f"{what}: /{kind}/{name} cannot take its messages: {reason}",
                                fatal=False)
        log.log(logging.DEBUG if isinstance(reason, Pacing) else logging.INFO,
                "flow control: %s waits for /%s/%s (%s)", session.peer, kind, name, reason)
        session.wait_behind(frame)

        def recheck(kind: str = kind, name: str = name, persistent: bool = persistent,
                    credit: Credit | None = credit) -> str | None:
            return None if session.closed else broker.room_for(
                kind, name, persistent, credit=credit, owner=owner, stored=size,
                several=several)

        broker.flow.wait(recheck, session.resume_waiting, reason)
        return True
    return False


def own_credit(session: SessionContext, spool: TxSpool) -> Credit:
    """What the COMMIT of ``spool`` would store where, and what its own ACKs would take out
    of which queue (``Credit``), found without applying anything: each ACK is resolved as
    COMMIT resolves it, against copies of the consumers' in-flight messages, which are put
    back afterwards. NACKs free nothing (their messages go back); an ACK that does not
    resolve counts nothing here, and COMMIT reports it. The store, and her share, are freed
    only of records whose every holder it ACKs (a topic record two durable subscriptions
    hold is stored and charged once, and stays while one of them holds it)."""
    credit = Credit()
    acked: dict[int, tuple[Message, int]] = {}  # mid -> (a copy, how many holders it ACKs)
    consumers = {id(c): c for c in (*session.consumers.values(), *session.by_index.values())}
    kept = {key: c.inflight for key, c in consumers.items()}
    try:
        for c in consumers.values():
            c.inflight = dict(c.inflight)
        for op in spool.operations():
            if isinstance(op, StoredMessage):
                where = (keys.kind_of(op.key), keys.name_of(op.key))
                credit.added[where] = credit.added.get(where, 0) + len(op.body)
                if op.headers.get("persistent") == "true":
                    credit.added_store += len(op.body)
                    credit.sends += 1
                continue
            if op.nack:
                continue
            try:
                consumer, msgs = acks.resolve(session, op.headers, False)
            except ProtocolError:
                continue
            key = id(consumer.queue)
            for m in msgs:
                credit.freed[key] = credit.freed.get(key, 0) + m.size
                if m.persistent:
                    acked[m.mid] = (m, acked.get(m.mid, (m, 0))[1] + 1)
    finally:
        for key, c in consumers.items():
            c.inflight = kept[key]
    broker = session.broker
    shares, shared = broker.shares, broker.store.shared
    for mid, (m, n) in acked.items():
        if n >= shared.holders(mid):
            credit.freed_store += m.size
        if shares is not None and n >= shares.holders(mid) > 0:
            credit.freed_by[m.owner] = credit.freed_by.get(m.owner, 0) + m.size
    return credit


def spool_send(spool: TxSpool, frame: Frame, kind: str, name: str, now_ms: int) -> None:
    """Keep a SEND to ``kind/name`` in the transaction's spool until COMMIT."""
    h = frame.headers
    headers = {k: v for k, v in h.items() if k not in TRANSPORT_HEADERS}
    headers["destination"] = destination_of(kind, name)
    spool.add_send(keys.kind_key(kind, name), now_ms, parse_expires(h.get("expires")),
                   parse_priority(h.get("priority")), headers, bytes(frame.body))


def _tx_id(frame: Frame) -> str:
    txid = frame.headers.get("transaction")
    if not txid:
        raise ProtocolError(f"{frame.command} requires a 'transaction' header", fatal=False)
    return txid


def _apply(session: SessionContext, txid: str, spool: TxSpool) -> dict[str, str] | None:
    """Commit the spool; returns headers for the RECEIPT, if any."""
    if isinstance(spool, stage_frames.StageSpool):
        return stage_frames.commit_part(session, spool)
    broker = session.broker
    producers = broker.producers
    now = broker.now_ms()
    numbered: list[tuple[str, int, Message]] = []
    highest: dict[str, int] = {}  # producer id -> highest number earlier in this transaction
    dropped = 0
    messages: list[tuple[str, str, Message]] = []
    acked: dict[int, tuple[Queue, list[Message]]] = {}
    nacked: dict[int, tuple[Queue, list[Message]]] = {}
    taken: list[tuple[Consumer, Message]] = []
    try:
        for op in spool.operations():
            if isinstance(op, StoredMessage):
                kind, name = keys.kind_of(op.key), keys.name_of(op.key)
                headers = dict(op.headers)
                producer = dedup.producer_of(headers) if dedup.PRODUCER_ID in headers else None
                if producer is not None:
                    pid, seq = producer
                    if seq <= highest.get(pid, -1) or producers.is_duplicate(pid, seq, now):
                        dropped += 1
                        continue
                    highest[pid] = seq
                msg = Message(broker.allocate_mid(), headers.pop("destination"),
                              headers, op.body,
                              persistent=headers.get("persistent") == "true",
                              priority=op.priority, expires=op.expires,
                              timestamp=op.timestamp)
                msg.owner = session.store_owner
                messages.append((kind, name, msg))
                if producer is not None:
                    numbered.append((*producer, msg))
            else:
                consumer, msgs = acks.resolve(session, op.headers, op.nack)
                taken += [(consumer, m) for m in msgs]
                target = nacked if op.nack else acked
                target.setdefault(id(consumer.queue), (consumer.queue, []))[1].extend(msgs)
    except ProtocolError:
        for consumer, m in taken:  # nothing applied: put back what resolution took
            consumer.inflight[m.mid] = m
        raise
    broker.commit(f"{session.id}:{txid}", messages, list(acked.values()),
                  list(nacked.values()))
    for pid, seq, msg in numbered:
        producers.accepted(pid, seq, msg.timestamp, msg.ticket)
    return {dedup.DUPLICATES: str(dropped)} if dropped else None
