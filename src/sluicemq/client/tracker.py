"""The bookkeeping both clients share, sans-IO: what is in flight on the connection, and what
a failover carries over to the next one.

`Tracker` holds the current `ClientMachine`, the receipt waiters (``W``: a
concurrent.futures Future for `Client`, an asyncio Future for `AsyncClient` - the tracker
never resolves one, it hands them back to the driver with their outcome), the SENDs and
SUBSCRIBEs whose receipts are outstanding, open and lost transactions, the connection number
(``epoch``) that tells which connection delivered a message, and the memories of messages
acknowledged or delivered across a failover. The drivers (client/sync.py, client/aio.py and
their *_failover.py halves) only do I/O and call it under their state lock.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic

from sluicemq.client.failover import (
    AckInDoubt,
    EarlyAcks,
    PendingSend,
    TransactionRolledBack,
    Unacked,
    W,
)
from sluicemq.client.machine import ClientMachine, MessageReceived, Outgoing
from sluicemq.errors import ClientError


@dataclass(slots=True)
class Loss(Generic[W]):
    """What losing a connection settled, for the driver to act on."""

    from_url: str
    failed: list[tuple[W, ClientError]]  # waiters to fail now, with their errors
    subscribed: dict[str, W]  # subscription id -> the waiter of its unconfirmed SUBSCRIBE
    rolled_back: tuple[str, ...]  # transactions that were open
    ranges: list[str]  # range reads and browses ended (replaying one would re-read it)


@dataclass(slots=True)
class FrameTags(Generic[W]):
    """What a frame being built is, for `Tracker.sent`: a SEND to re-send after a failover
    (``pending``), a SUBSCRIBE to replay (``subscription``) or an ACK (``acked``: its
    subscription and message-id)."""

    pending: PendingSend[W] | None = None
    subscription: str | None = None
    acked: tuple[str, str] | None = None


@dataclass(frozen=True, slots=True)
class Replay:
    """The frames that re-establish the client on a new connection, written before any other."""

    data: bytes
    resent: int
    resubscribed: int


class Tracker(Generic[W]):
    """One client's protocol bookkeeping across connections; not thread-safe by itself."""

    def __init__(self, machine: ClientMachine, failover: bool) -> None:
        self.machine = machine
        self.failover = failover  # only then are SENDs kept for re-sending, and so on
        self.epoch = 0  # bumped by every loss; messages of older epochs cannot be acked
        self.receipts: dict[str, W] = {}
        self.inflight: dict[str, PendingSend[W]] = {}  # receipt id -> unconfirmed SEND
        self.sub_receipts: dict[str, str] = {}  # receipt id -> subscription id
        self.ack_receipts: dict[str, tuple[str, str]] = {}  # receipt id -> (sub, message id)
        self.open_tx: set[str] = set()
        self.lost_tx: set[str] = set()
        self.early_acks = EarlyAcks()
        self.unacked = Unacked()
        self._queued = itertools.count(1)

    # ------------------------------------------------------------------ outgoing frames

    def sent(self, out: Outgoing, waiter: W, tags: FrameTags[W] | None = None) -> bool:
        """Record a frame just built (before it is written, so no receipt finds nobody);
        False when it asked for no receipt and the driver resolves ``waiter`` at once."""
        if out.receipt is None:
            return False
        self.receipts[out.receipt] = waiter
        if tags is None:
            return True
        if tags.subscription is not None:
            self.sub_receipts[out.receipt] = tags.subscription
        if self.failover:
            if tags.pending is not None:
                tags.pending.waiter = waiter
                self.inflight[out.receipt] = tags.pending
            if tags.acked is not None:
                self.ack_receipts[out.receipt] = tags.acked
        return True

    def hold(self, pending: PendingSend[W], waiter: W) -> None:
        """A SEND made while failing over: it goes out with the replay."""
        pending.waiter = waiter
        self.inflight[f"held-{next(self._queued)}"] = pending

    # ------------------------------------------------------------------ incoming frames

    def receipt(self, receipt_id: str) -> W | None:
        """The waiter a RECEIPT resolves (None: nobody waits for it)."""
        self.inflight.pop(receipt_id, None)
        self.sub_receipts.pop(receipt_id, None)
        self.ack_receipts.pop(receipt_id, None)
        return self.receipts.pop(receipt_id, None)

    def refused(self, receipt_id: str) -> tuple[W | None, str | None]:
        """An ERROR answering a receipt: the waiter to fail, or else the subscription whose
        replayed SUBSCRIBE the new broker refused (its reader must hear of it)."""
        self.inflight.pop(receipt_id, None)
        self.ack_receipts.pop(receipt_id, None)
        return self.receipts.pop(receipt_id, None), self.sub_receipts.pop(receipt_id, None)

    def message(self, event: MessageReceived) -> bool:
        """Hand this MESSAGE out (True), or acknowledge it again without handing it out
        (False: the caller acknowledged it before the failover). A message an earlier
        connection delivered and nobody acknowledged is marked ``redelivered``."""
        message_id = event.frame.headers.get("message-id")
        if self.early_acks.take(event.subscription, message_id):
            return False
        if self.failover and event.ack_mode != "auto" and message_id is not None:
            if self.unacked.was_delivered(event.subscription, message_id):
                event.frame.headers["redelivered"] = "true"
            self.unacked.delivered(event.subscription, message_id)
        return True

    # ------------------------------------------------------------------ acknowledgements

    def stale(self, epoch: int, ack_mode: str) -> bool:
        """Delivered by an earlier connection on a subscription the broker redelivers."""
        return epoch != self.epoch and ack_mode != "auto"

    def acknowledging(self, command: str, subscription: str, message_id: str, ack_mode: str,
                      epoch: int, receipt: bool) -> bool:
        """May this ACK/NACK be written now? Not for a message of an earlier connection (the
        new broker would read its ack id as one of its own deliveries): an ACK is remembered
        instead and, if a receipt was asked for, `AckInDoubt` says so; a NACK needs nothing,
        the broker redelivers anyway."""
        if self.stale(epoch, ack_mode):
            if command == "ACK":
                self.early_acks.note(subscription, message_id)
                if receipt:
                    raise AckInDoubt(message_id)
            return False
        if self.failover and ack_mode != "auto":
            self.unacked.settled(subscription, message_id, cumulative=ack_mode == "client")
        return True

    def unsubscribed(self, subscription: str) -> None:
        self.unacked.forget(subscription)

    # ------------------------------------------------------------------ transactions

    def begun(self, transaction: str) -> None:
        self.open_tx.add(transaction)

    def check_transaction(self, transaction: str | None) -> None:
        """A transaction lost to a failover refuses every further use."""
        if transaction is not None and transaction in self.lost_tx:
            raise TransactionRolledBack(transaction)

    def finishing(self, transaction: str, committing: bool) -> bool:
        """May the COMMIT/ABORT go out? For a transaction a failover lost, a COMMIT raises
        `TransactionRolledBack` and an ABORT has nothing left to do (False)."""
        if transaction in self.lost_tx:
            self.lost_tx.discard(transaction)
            if committing:
                raise TransactionRolledBack(transaction)
            return False
        self.open_tx.discard(transaction)
        return True

    def commit_failed(self, transaction: str, error: ClientError, is_open: bool) -> ClientError:
        """The error to raise for a COMMIT that failed: a connection lost under it (no
        broker ERROR headers) leaves its outcome unknown, which the caller resolves by
        retrying the transaction."""
        if self.failover and is_open and not error.headers:
            return TransactionRolledBack(transaction, " (its COMMIT was in flight: it may have "
                                         "committed; numbered sends are dropped if stored)")
        return error

    # ------------------------------------------------------------------ failing over

    def lose(self, error: ClientError, from_url: str) -> Loss[W]:
        """The connection is gone and a failover begins: settle what cannot survive it.
        From now on what the lost connection delivered is stale: the next broker redelivers
        whatever was not acknowledged, and an ACK of it can no longer be written."""
        self.machine.connection_lost()
        self.epoch += 1
        receipts, self.receipts = self.receipts, {}
        subscribed = {self.sub_receipts[r]: w for r, w in receipts.items()
                      if r in self.sub_receipts}
        failed: list[tuple[W, ClientError]] = []
        for rid, waiter in receipts.items():
            if rid in self.inflight or rid in self.sub_receipts:
                continue  # re-sent or replayed: the new connection answers it
            acked = self.ack_receipts.get(rid)
            if acked is not None:
                self.early_acks.note(*acked)
                failed.append((waiter, AckInDoubt(acked[1])))
            else:
                failed.append((waiter, ClientError(
                    f"connection to {from_url} lost before the broker confirmed this frame: "
                    f"{error}")))
        self.sub_receipts.clear()
        self.ack_receipts.clear()
        rolled_back = tuple(sorted(self.open_tx))
        self.lost_tx |= self.open_tx
        self.open_tx.clear()
        ranges = [sid for sid, sub in self.machine.subscriptions.items()
                  if sub.headers.get("browser") == "true"]
        for sid in ranges:
            del self.machine.subscriptions[sid]
            subscribed.pop(sid, None)
        self.unacked.failed_over()
        return Loss(from_url, failed, subscribed, rolled_back, ranges)

    def replay(self, machine: ClientMachine, loss: Loss[W],
               new_waiter: Callable[[], W]) -> Replay:
        """Move onto ``machine`` (connected to the next broker): every subscription again
        (same id, ack mode, durable name; a stream credit asks for what is left), then every
        unconfirmed SEND in its original order under its original producer number."""
        old, self.machine = self.machine, machine
        data: list[bytes] = []
        for sub in old.subscriptions.values():
            out = machine.resubscribe(sub)
            if out.receipt is None:
                continue  # it read every stream it asked for: nothing to replay
            self.receipts[out.receipt] = loss.subscribed.get(sub.id) or new_waiter()
            self.sub_receipts[out.receipt] = sub.id
            data.append(out.data)
        inflight, self.inflight = self.inflight, {}
        for pending in inflight.values():
            out = machine.send(pending.destination, pending.body, pending.headers,
                               persistent=pending.persistent)
            assert out.receipt is not None and pending.waiter is not None
            self.receipts[out.receipt] = pending.waiter
            self.inflight[out.receipt] = pending
            data.append(out.data)
        replayed = sum(not sub.parked for sub in old.subscriptions.values())
        return Replay(b"".join(data), len(inflight), replayed)

    def fail(self) -> list[W]:
        """The connection is over for good: every waiter, for the driver to fail."""
        self.machine.connection_lost()
        waiters = list(self.receipts.values())
        waiters += [p.waiter for key, p in self.inflight.items()
                    if p.waiter is not None and key not in self.receipts]
        self.receipts.clear()
        self.inflight.clear()
        self.sub_receipts.clear()
        self.ack_receipts.clear()
        return waiters
