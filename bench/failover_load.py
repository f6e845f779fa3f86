"""The load bench/failover.py runs through takeovers, and its ledger.

Producers pipeline persistent, receipted SENDs through a failover URL; consumers take them
with client-individual acks, each ACK receipted. The ledger counts, per message body:

* receipted: the producer got the RECEIPT (the broker promised to keep it);
* consumed: a consumer's ACK was confirmed by a RECEIPT (it was taken off the queue), or
  the final drain (after the load stopped, nothing failing over) was handed the message;
* in doubt: the connection failed over while the ACK's receipt was outstanding, so whether
  the old master stored it is unknown (`AckInDoubt`); if it did not, the message comes back
  and its next confirmed ACK counts it (and the client acknowledges a copy redelivered to the
  same subscription without handing it out again).

lost = receipted - consumed - in doubt; duplicated = consumptions beyond the first (a
broker that stores a re-sent SEND twice, or hands out a message whose ACK it confirmed).
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

from sluicemq import Client
from sluicemq.client.failover import AckInDoubt, FailoverEvent

QUEUE = "/queue/load"


class Load:
    """``producers`` failover producers and ``consumers`` failover consumers on one queue."""

    def __init__(self, url: str, producers: int, window: int, consumers: int = 2) -> None:
        self.url = url
        self.window = window
        self.receipted: list[str] = []
        self.consumed: Counter[str] = Counter()
        self.in_doubt: set[str] = set()
        self.events: list[FailoverEvent] = []
        self.drained = 0
        self.errors: list[BaseException] = []
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._produce, args=(n,), daemon=True)
                         for n in range(producers)]
        self._threads += [threading.Thread(target=self._consume, daemon=True)
                          for _ in range(consumers)]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def finish(self) -> None:
        self.stop.set()
        for t in self._threads:
            t.join(300)

    def receipted_count(self) -> int:
        return len(self.receipted)

    def _produce(self, n: int) -> None:
        try:
            with Client(self.url, timeout=300, on_failover=self.events.append) as c:
                window: list[tuple[str, Any]] = []
                i = 0
                while not self.stop.is_set() or window:
                    if not self.stop.is_set():
                        body = f"p{n}-{i}"
                        i += 1
                        window.append((body, c.send_async(QUEUE, body)))
                    if len(window) >= self.window or self.stop.is_set():
                        body, receipt = window.pop(0)
                        receipt.result()
                        with self._lock:
                            self.receipted.append(body)
        except BaseException as exc:
            self.errors.append(exc)

    def _consume(self) -> None:
        try:
            with Client(self.url, timeout=300) as c, \
                    c.subscribe(QUEUE, ack="client-individual", prefetch=100) as sub:
                while not self.stop.is_set():
                    msg = sub.get(timeout=0.2)
                    if msg is not None:
                        self._ack(msg)
        except BaseException as exc:
            self.errors.append(exc)

    def _ack(self, msg: Any) -> None:
        try:
            msg.ack(receipt=True)
        except AckInDoubt:
            with self._lock:
                self.in_doubt.add(msg.text())
            return
        with self._lock:
            self.consumed[msg.text()] += 1

    def drain(self, url: str, idle: float | None = None) -> None:
        """Take what is left from the last master, after the load stopped: no failover can
        cut these, so each message handed out counts as consumed (ack auto: no receipt per
        ACK, which on a broker syncing every ACK would take minutes for a backlog). With
        ``idle`` None the broker says how many are left (SluiceMQ's range head); a broker
        without that extension (ActiveMQ) is read until none came for ``idle`` seconds."""
        with Client(url, timeout=300) as c:
            rest = c.head(QUEUE).count if idle is None else None
            with c.subscribe(QUEUE, ack="auto", prefetch=1000) as sub:
                taken = 0
                while rest is None or taken < rest:
                    msg = sub.get(timeout=60 if idle is None else idle)
                    if msg is None:
                        break
                    taken += 1
                    with self._lock:
                        self.consumed[msg.text()] += 1
        self.drained = taken

    def ledger(self) -> dict[str, int]:
        confirmed = set(self.consumed)
        in_doubt = self.in_doubt - confirmed
        lost = set(self.receipted) - confirmed - in_doubt
        return {"receipted": len(self.receipted), "consumed": sum(self.consumed.values()),
                "drained": self.drained, "in_doubt_acks": len(in_doubt), "lost": len(lost),
                "duplicated": sum(n - 1 for n in self.consumed.values() if n > 1),
                "unknown": len(confirmed - set(self.receipted))}
