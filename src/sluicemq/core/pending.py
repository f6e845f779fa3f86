"""Messages waiting for a consumer, highest JMS priority first, FIFO within a priority."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from sluicemq.core.message import MAX_PRIORITY, Message


class PendingList:
    """Ten FIFO lanes, one per priority; cheap push, push-front (redelivery) and pop."""

    __slots__ = ("_lanes", "_size", "bytes")

    def __init__(self) -> None:
        self._lanes: list[deque[Message]] = [deque() for _ in range(MAX_PRIORITY + 1)]
        self._size = 0
        self.bytes = 0

    def __len__(self) -> int:
        return self._size

    def push(self, msg: Message) -> None:
        self._lanes[msg.priority].append(msg)
        self._size += 1
        self.bytes += msg.size

    def push_front(self, msg: Message) -> None:
        """Put a returned message back where it was: before everything of its priority."""
        self._lanes[msg.priority].appendleft(msg)
        self._size += 1
        self.bytes += msg.size

    def pop(self) -> Message | None:
        for lane in reversed(self._lanes):
            if lane:
                msg = lane.popleft()
                self._size -= 1
                self.bytes -= msg.size
                return msg
        return None

    def restore(self, skipped: list[Message]) -> None:
        """Undo pops of messages nobody could take, keeping their original order."""
        for msg in reversed(skipped):
            self.push_front(msg)

    def remove(self, mid: int) -> Message | None:
        """Take one message out by id (admin actions, recovery); O(n), not for the hot path."""
        for lane in self._lanes:
            for msg in lane:
                if msg.mid == mid:
                    lane.remove(msg)
                    self._size -= 1
                    self.bytes -= msg.size
                    return msg
        return None

    def __iter__(self) -> Iterator[Message]:
        """Dispatch order: priority 9 down to 0."""
        for lane in reversed(self._lanes):
            yield from lane

    def clear(self) -> list[Message]:
        out = list(self)
        for lane in self._lanes:
            lane.clear()
        self._size = 0
        self.bytes = 0
        return out
