"""ack:auto messages whose frames have not left the broker yet, given back if the connection
ends first.

Why: an ``ack:auto`` consumer's message is consumed when it is handed to the connection, but
its frame may still sit in the broker's own buffers (ours and the transport's) when the
connection ends - the client closes or resets, a slow reader is dropped, the broker stops.
Those bytes are then dropped, so the message was never received; it goes back to its queue
instead, in its place (before what was not yet handed out), marked redelivered as ActiveMQ
marks a message that may have been seen. What the kernel took counts as gone out: it sends
it even after the broker is killed, so giving it back could deliver it twice.

The transport says how much of its output left user space (``written``: TCP reads it from
its buffers while it is open, and from the kernel's counters once the transport dropped them);
a run of frames is kept until then, so a consumer that keeps up costs one append per run and
one look per flush. A transport that cannot say (-1: TLS, WebSocket) keeps nothing here.

Only persistent messages are kept. The store-later watch holds those anyway until their
bytes are out (a stored one's removal, a deferred one's write), so keeping them here adds a
list entry a run; a non-persistent one would live on only for this, up to the output share
of them, and that lifetime alone left a broker 9 more pymalloc arenas (+9 MiB RSS) after a
50k non-persistent drain and raised the live 1 GiB stream's RSS peak after it by ~7 MiB.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Protocol

from sluicemq.core.routing.message import Message
from sluicemq.core.routing.queue import Consumer, Queue


class Releasing(Protocol):
    """What giving back needs of the store-later watch (``StoreLater.give_back``)."""

    def give_back(self, msgs: list[Message]) -> None: ...


class Unwritten:
    """Runs handed to ack:auto consumers of one connection, oldest first, until their bytes
    left user space: (consumer, messages - None for a non-persistent one, not kept -, their
    frames - None for one message -, where the run's bytes end in the connection's output)."""

    __slots__ = ("later", "runs")

    def __init__(self, later: Releasing) -> None:
        self.later = later
        self.runs: deque[tuple[Consumer, Sequence[Message | None], list[bytes] | None,
                               int]] = deque()

    def __bool__(self) -> bool:
        return bool(self.runs)

    def add(self, consumer: Consumer, msg: Message, end: int) -> None:
        """One message, written alone, ending at ``end``: kept if persistent."""
        if msg.persistent:
            self.runs.append((consumer, [msg], None, end))

    def add_run(self, consumer: Consumer, msgs: list[Message], frames: list[bytes],
                end: int) -> None:
        """A run (one frame a message, written together, ending at ``end``): its persistent
        messages are kept, in their places (a non-persistent run costs one look)."""
        for m in msgs:
            if not m.persistent:
                break
        else:
            self.runs.append((consumer, msgs, frames, end))
            return
        kept = [m if m.persistent else None for m in msgs]
        if any(m is not None for m in kept):
            self.runs.append((consumer, kept, frames, end))

    def written(self, upto: int) -> None:
        """The connection's bytes up to ``upto`` left user space (-1: it cannot say, and
        nothing is kept)."""
        runs = self.runs
        if upto < 0:
            runs.clear()
            return
        while runs and runs[0][3] <= upto:
            runs.popleft()

    def give_back(self, upto: int) -> int:
        """The connection ended with its bytes up to ``upto`` out of user space: every message
        whose frame ends past it goes back to its queue, in delivery order; returns how many.
        Their journaled removal, held until their bytes were out, is dropped (``Releasing``)."""
        runs, self.runs = self.runs, deque()
        if upto < 0:
            return 0
        back: dict[int, tuple[Queue, list[Message]]] = {}
        for consumer, msgs, frames, end in runs:
            if end <= upto:
                continue
            past = [m for m in (msgs if frames is None else _past(msgs, frames, end, upto))
                    if m is not None]
            queue = consumer.queue
            entry = back.get(id(queue))
            if entry is None:
                back[id(queue)] = (queue, past)
            else:
                entry[1].extend(past)
        count = 0
        for queue, msgs in back.values():
            self.later.give_back(msgs)
            queue.return_messages(msgs)
            count += len(msgs)
        return count


def _past(msgs: Sequence[Message | None], frames: list[bytes], end: int,
          upto: int) -> Sequence[Message | None]:
    """The messages of a run (one frame each, written together, ending at ``end``) whose
    frame ends past ``upto``."""
    first = len(msgs)
    for i in range(len(frames) - 1, -1, -1):
        if end <= upto:
            break
        first = i
        end -= len(frames[i])
    return msgs[first:]
