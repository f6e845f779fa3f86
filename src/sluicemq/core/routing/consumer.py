"""One subscription of one connection, as a queue sees it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from sluicemq.core.routing.message import Message

if TYPE_CHECKING:
    from sluicemq.core.routing.queue import Queue
    from sluicemq.core.selectors import Selector

AUTO, CLIENT, CLIENT_INDIVIDUAL = "auto", "client", "client-individual"
ACK_MODES = (AUTO, CLIENT, CLIENT_INDIVIDUAL)


class Delivery(Protocol):
    """What a consumer needs from its connection: write a MESSAGE, tell if it can take more."""

    peer: str

    @property
    def writable(self) -> bool: ...

    def deliver(self, consumer: Consumer, msg: Message) -> None: ...

    def stream_error(self, stream_id: str, text: str) -> None: ...


class Consumer:
    """A subscription: where it reads from, how it acks, how much it may hold unacknowledged.

    ``inflight`` keeps delivered-but-unacked messages in delivery order, which is what a
    cumulative (``client``) ACK needs.
    """

    __slots__ = (
        "ack_mode", "delivery", "destination", "exclusive", "index", "inflight", "max_streams",
        "open_streams", "prefetch", "priority", "queue", "resumed", "selector", "stream_acked",
        "sub_id",
    )

    def __init__(
        self,
        delivery: Delivery,
        sub_id: str,
        index: int,
        destination: str,
        queue: Queue,
        *,
        ack_mode: str = AUTO,
        prefetch: int = 1000,
        selector: Selector | None = None,
        exclusive: bool = False,
        max_streams: int = 0,
        priority: int = 0,
    ) -> None:
        self.delivery = delivery
        self.sub_id = sub_id
        self.index = index
        self.destination = destination
        self.queue = queue
        self.ack_mode = ack_mode
        self.prefetch = max(1, prefetch)
        self.selector = selector
        self.exclusive = exclusive
        self.priority = priority  # activemq.priority: higher ones are served first
        self.inflight: dict[int, Message] = {}
        self.max_streams = max_streams  # 0: any number of streams at once
        self.open_streams: set[str] = set()  # streams given to us whose final chunk is unacked
        self.resumed: set[str] = set()  # streams taken over mid-way: mark the next chunk
        self.stream_acked: dict[str, list[Message]] = {}  # `restart` policy: acks held back

    def ready(self) -> bool:
        """Room for one more message: the socket drains and the prefetch window is open."""
        if not self.delivery.writable:
            return False
        return self.ack_mode == AUTO or len(self.inflight) < self.prefetch

    def can_open_stream(self) -> bool:
        return self.max_streams <= 0 or len(self.open_streams) < self.max_streams

    def accepts(self, msg: Message) -> bool:
        return self.selector is None or self.selector.matches(msg.headers)

    def take_inflight_upto(self, mid: int) -> list[Message]:
        """Cumulative ACK: every message delivered up to and including ``mid``."""
        taken: list[Message] = []
        for key in list(self.inflight):
            taken.append(self.inflight.pop(key))
            if key == mid:
                break
        return taken

    def take_inflight_below(self, mid: int) -> list[Message]:
        """Cumulative ACK of a message no longer held (a ledger commit removed it): the
        unacknowledged ones with lower ids."""
        taken = [m for m in self.inflight.values() if m.mid < mid]
        for m in taken:
            del self.inflight[m.mid]
        return taken

    def __repr__(self) -> str:
        return f"<Consumer {self.sub_id} on {self.destination} {self.ack_mode}>"
