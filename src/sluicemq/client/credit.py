"""What a stream receiver still wants after a failover (``sluice-stream-credit``), sans-IO.

A receiver that asked for N streams replays its SUBSCRIBE on the next broker asking for N less
the streams it has read: those whose final chunk's ACK a broker confirmed with a RECEIPT
(a confirmed ACK is journaled, so no later master hands that stream out again). The stream
being read at the failover is not counted: the new master gives it again, resumed at its first
unacknowledged chunk, and that uses one of its credit. A final ACK without a confirmation
(sent without a receipt, or in flight when the connection was lost) is not counted either:
should the new master redeliver that chunk, the client's ACK of the copy uses a credit there.
Erring this way a receiver may be handed chunks of one stream more (they go to the next
receiver again, never lost), never one stream too few.

The broker counts per destination (each part of a composite has N), so does this; a wildcard's
destinations are not all known in advance, so its replay asks for N again.
"""

from __future__ import annotations

from collections.abc import Mapping

from sluicemq.protocol.numbers import natural
from sluicemq.streaming import manifest as wire


class StreamCredit:
    """Streams wanted in all, and those read to the end, per concrete destination."""

    __slots__ = ("done", "parts", "wanted")

    def __init__(self, wanted: int, destination: str) -> None:
        self.wanted = wanted
        parts = destination.split(",")
        # None: a wildcard part, whose matching destinations a replay cannot name
        self.parts: list[str] | None = (None if any("*" in p or ">" in p for p in parts)
                                        else parts)
        self.done: dict[str, int] = {}

    @classmethod
    def asked(cls, headers: Mapping[str, str], destination: str) -> StreamCredit | None:
        """The credit a SUBSCRIBE asks for; None when it asks for none (or for a value the
        broker refuses with an ERROR anyway)."""
        wanted = natural(headers.get(wire.STREAM_CREDIT), 10)
        return None if wanted is None else cls(wanted, destination)

    def read(self, destination: str) -> None:
        """The broker confirmed the ACK of a final chunk that came from ``destination``."""
        self.done[destination] = self.done.get(destination, 0) + 1

    def remaining(self) -> int:
        """What a replayed SUBSCRIBE asks for: the most any of its destinations still owes
        (0: every one gave its N, nothing is to be replayed)."""
        if self.parts is None:
            return self.wanted
        return max(0, self.wanted - min(self.done.get(p, 0) for p in self.parts))
