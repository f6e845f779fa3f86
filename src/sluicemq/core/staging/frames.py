"""Staged publishing on the wire: what BEGIN, SEND, ACK, COMMIT and ABORT do with the
``sluice-stage*`` headers (docs/replay-protocol.md, section 3). The session calls in here;
the journal work is ``core/staging/stager.py``'s.

A staged part is an ordinary transaction opened with ``sluice-stage``: its SENDs are spooled as
usual, and its COMMIT stores the part instead of routing it. A publication or an abort is a
COMMIT or ABORT whose ``transaction`` header is only a label: it needs no BEGIN and never
touches an open transaction.

With security on, parts, publications and aborts act only on the batches of the user who sends
them (``core/staging/book.py``): another user's batch of the same name is invisible, so it can be
neither published empty, nor redirected, nor discarded.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from sluicemq.core.dedup.producers import PRODUCER_ID, PRODUCER_SEQ
from sluicemq.core.routing import keys
from sluicemq.core.routing.message import (
    TRANSPORT_HEADERS,
    parse_expires,
    parse_priority,
)
from sluicemq.core.security.policy import WRITE
from sluicemq.core.staging.book import (
    DISCARDED,
    MESSAGES,
    RESULT,
    STAGE,
    STAGE_ABORT,
    STAGE_COMMIT,
    STAGE_PARTS,
    TOKEN,
    BatchKey,
    parse_names,
    parse_parts,
    parse_token,
    stored_owner,
)
from sluicemq.core.staging.writer import PartWriter
from sluicemq.errors import ProtocolError
from sluicemq.protocol import columns
from sluicemq.protocol.columns import COLUMNS
from sluicemq.protocol.frames import Frame
from sluicemq.storage.txspool import TxSpool

if TYPE_CHECKING:
    from sluicemq.core.sessions.peer import SessionPeer as Session


FORMAT = "sluice-format"  # "columns": the SEND's body is a column batch of messages


class StageSpool(TxSpool):
    """The spool of a transaction that stages ``sink/batch/part``: its plain SENDs; its
    column batches are journaled at once by ``writer`` (opened with the first of them)."""

    def __init__(self, directory: Path, tx_id: str, names: tuple[str, ...]) -> None:
        super().__init__(directory, tx_id)
        self.sink, self.batch, self.part = names
        self.writer: PartWriter | None = None

    def close(self) -> None:
        """Also abandons what the part journaled, unless its COMMIT parked it."""
        if self.writer is not None:
            self.writer.drop()
        super().close()


def open_spool(directory: Path, tx_id: str, headers: dict[str, str]) -> TxSpool:
    """BEGIN: a plain transaction, or a staged part when ``sluice-stage`` is there."""
    value = headers.get(STAGE)
    if value is None:
        return TxSpool(directory, tx_id)
    return StageSpool(directory, tx_id, parse_names(value, STAGE, 3))


def check_op(spool: TxSpool, frame: Frame) -> None:
    """A staged part holds SENDs only, without producer numbers (publication is idempotent)."""
    if not isinstance(spool, StageSpool):
        return
    if frame.command != "SEND":
        raise ProtocolError(f"a staged part holds only SENDs, not {frame.command}", fatal=False)
    if PRODUCER_ID in frame.headers or PRODUCER_SEQ in frame.headers:
        raise ProtocolError(f"{PRODUCER_ID} is not allowed in a staged part: publishing a stage "
                            "is idempotent by itself", fatal=False)


def add_send(session: Session, spool: TxSpool, frame: Frame, kind: str, name: str,
             now_ms: int) -> int:
    """A SEND inside a staged part, spooled exactly as it will be journaled (journal key, no
    destination header, persistent whatever it said): its COMMIT then copies the bytes without
    decoding them. Returns the messages spooled: 0 for a plain transaction's SEND (the session
    spools it), more than one for a column batch (``sluice-format:columns``)."""
    if not isinstance(spool, StageSpool):
        refuse_batch(frame.headers)
        return 0
    check_op(spool, frame)
    h = frame.headers
    headers = {k: v for k, v in h.items() if k not in TRANSPORT_HEADERS}
    headers["persistent"] = "true"
    key = keys.kind_key(kind, name)
    if FORMAT in h:
        return _add_batch(session, spool, frame, key, headers, now_ms)
    spool.add_send(key, now_ms, parse_expires(h.get("expires")),
                   parse_priority(h.get("priority")), headers, bytes(frame.body),
                   stored_owner(owner(session)))
    return 1


def refuse_batch(headers: dict[str, str]) -> None:
    """A column batch outside a staged part would be stored as one message whose body is the
    batch: refuse it, so that a client never believes it sent many messages."""
    if FORMAT in headers:
        raise ProtocolError(f"{FORMAT} on a SEND is for staged parts only "
                            "(docs/replay-protocol.md, section 3)", fatal=False)


def _add_batch(session: Session, spool: StageSpool, frame: Frame, key: str,
               common: dict[str, str], now_ms: int) -> int:
    """A column batch of messages for one destination (its ``seq`` and ``timestamp`` columns
    are ignored; each message's headers are the frame's plus its own), journaled at once as
    one record of the part (``writer.py``). Checked whole before anything is written, so a
    bad batch leaves the part as it was."""
    if frame.headers[FORMAT] != COLUMNS:
        raise ProtocolError(f"invalid {FORMAT} {frame.headers[FORMAT]!r}: the only format is "
                            f"'{COLUMNS}'", fatal=False)
    del common[FORMAT]
    try:
        batch = columns.decode(frame.body)
    except ValueError as exc:
        raise ProtocolError(f"bad column batch: {exc}", fatal=False) from None
    writer = spool.writer
    if writer is None:
        writer = spool.writer = session.broker.stager.open_part(owner(session), spool.sink,
                                                                spool.batch, spool.part)
    if len(spool):  # plain SENDs before it go first, in order
        writer.add(spool.send_payloads())
        spool.clear()
    return writer.add_batch(batch, key, common, now_ms)


def commit_part(session: Session, spool: StageSpool) -> dict[str, str]:
    """COMMIT of a staged part: store it, invisible; the RECEIPT headers to answer with."""
    stager = session.broker.stager
    writer = spool.writer or stager.open_part(owner(session), spool.sink, spool.batch,
                                              spool.part)
    spool.writer = writer  # closing the spool drops it unless it was parked
    result, count = stager.finish_part(writer, spool.send_payloads())
    return {RESULT: result, MESSAGES: str(count)}


def publish(session: Session, frame: Frame) -> None:
    """COMMIT with ``sluice-stage-commit``: publish the listed parts (or find it done)."""
    sink, batch = parse_names(frame.headers[STAGE_COMMIT], STAGE_COMMIT, 2)
    names = parse_parts(frame.headers.get(STAGE_PARTS))
    token = parse_token(frame.headers.get(TOKEN))
    stager = session.broker.stager
    key = stager.book.scope(owner(session), sink, batch)
    _authorize_batch(session, key)
    if stager.not_durable(key, names):
        session.when_durable_retry(frame)  # parts committed but not yet on disk: wait, in order
        return
    result, count, stored = stager.publish(key, names, token)
    answer = {RESULT: result, MESSAGES: str(count)}
    if stored is not None:
        answer[TOKEN] = stored
    session.receipt(frame, answer)


def targets(session: Session, frame: Frame) -> set[tuple[str, str]]:
    """The destinations a publication (COMMIT with ``sluice-stage-commit``) would make messages
    ready in: its batch's, as this connection's user sees it (none if the names are bad)."""
    try:
        sink, batch = parse_names(frame.headers[STAGE_COMMIT], STAGE_COMMIT, 2)
    except ProtocolError:
        return set()  # publish() says why
    stager = session.broker.stager
    return stager.book.destinations(stager.book.scope(owner(session), sink, batch))


def abort(session: Session, frame: Frame) -> None:
    """ABORT with ``sluice-stage-abort``: discard the batch's parked parts."""
    sink, batch = parse_names(frame.headers[STAGE_ABORT], STAGE_ABORT, 2)
    stager = session.broker.stager
    key = stager.book.scope(owner(session), sink, batch)
    _authorize_batch(session, key)
    discarded = stager.abort(key)
    session.receipt(frame, {DISCARDED: str(discarded)})


def owner(session: Session) -> str | None:
    """Whose batches this connection works on: its user's with security on, else nobody's."""
    return session.security.owner(session.user)


def _authorize_batch(session: Session, key: BatchKey) -> None:
    """Publishing or discarding a batch acts on what it would send: the user needs write
    permission on each of its destinations, as for sending there directly."""
    for kind, name in sorted(session.broker.stager.book.destinations(key)):
        session.authorize(WRITE, kind, name)
