"""Numbering SENDs for the broker's duplicate detection (docs/replay-protocol.md, section 4).

With ``Client(producer_id=...)`` every SEND carries the id and the next number. Numbers start at
the wall clock in microseconds, so a restarted producer with the same id continues above its
earlier numbers without remembering them. To resend a message whose RECEIPT never came (say,
after reconnecting), send it again with its original number (``producer_seq=``, which the
first attempt's ``Receipt.producer_seq`` told, or the ``producer_seq`` attribute of the
ClientError it raised - present whenever the SEND may have reached the broker; without it the
SEND never left the client): the broker stores it only if it had not.
Resend unconfirmed messages in their original order: a number at or below the highest one
stored is a duplicate.
"""

from __future__ import annotations

import time

from sluicemq.errors import ClientError

PRODUCER_ID = "sluice-producer-id"
PRODUCER_SEQ = "sluice-producer-seq"
DUPLICATE = "sluice-duplicate"


class ProducerNumbers:
    """The id and the next number; callers serialise ``stamp`` (the client's state lock)."""

    def __init__(self, producer_id: str, start: int | None = None) -> None:
        if not 0 < len(producer_id) <= 200 or not producer_id.isprintable():
            raise ValueError("producer_id must be 1-200 printable characters")
        self.id = producer_id
        self.next = start if start is not None else time.time_ns() // 1000

    def stamp(self, headers: dict[str, str], seq: int | None = None) -> int:
        """Add the id and a number (``seq``, or the next one) to ``headers``; returns it."""
        if seq is None:
            seq = self.next
            self.next += 1
        headers[PRODUCER_ID] = self.id
        headers[PRODUCER_SEQ] = str(seq)
        return seq


def numbered(exc: ClientError, producer_seq: int) -> ClientError:
    """A copy of ``exc`` that tells which number the failed SEND had (to resend under it)."""
    failed = ClientError(str(exc), exc.headers, exc.body)
    failed.producer_seq = producer_seq
    return failed
