"""The producer table across restarts: journal replay and the index snapshot's section."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from sluicemq.core.dedup.producers import PRODUCER_ID, PRODUCER_SEQ, ProducerTable
from sluicemq.core.persistence.parts import Replay, StatePart
from sluicemq.protocol.numbers import natural
from sluicemq.storage import records
from sluicemq.storage.segment import Location
from sluicemq.storage.staging_records import MEMO_PRODUCERS, decode_memo

if TYPE_CHECKING:
    from sluicemq.core.routing.broker import Broker


class ProducersPart(StatePart):
    """The producer table across restarts: the newest memo record, then every message record
    flagged ``records.PRODUCER_FLAG`` after it (``message``, called by replay), in log order."""

    name = "producers"
    rtypes = (MEMO_PRODUCERS,)
    flags = records.PRODUCER_FLAG

    def __init__(self, broker: Broker) -> None:
        super().__init__(broker)
        self.table = ProducerTable(broker.config.limits.dedup_window)
        self.anchor: Location | None = None

    def seed(self, data: Any) -> None:
        self.table.load(data["table"])
        self.anchor = Location(*data["anchor"]) if data["anchor"] else None

    def record(self, replay: Replay, rtype: int, payload: bytes | memoryview,
               loc: Location) -> None:
        _name, rows = decode_memo(payload)
        self.table.load(rows)
        self.anchor = loc

    def message(self, payload: bytes) -> None:
        """A stored message whose headers name a producer."""
        sm = records.decode_message(payload)
        pid, seq = sm.headers.get(PRODUCER_ID), natural(sm.headers.get(PRODUCER_SEQ))
        if pid is not None and seq is not None:
            self.table.observe(pid, seq, sm.timestamp)

    def install(self) -> Iterable[Location]:
        self.table.expire(self.broker.now_ms())  # the broker's clock, as its tick uses
        producers = self.broker.producers
        producers.table = self.table
        producers.anchor.adopt(self.anchor)
        return [self.anchor] if self.anchor is not None else []

    @classmethod
    def capture(cls, broker: Broker) -> tuple[Any, Iterable[Location]]:
        producers = broker.producers
        anchor = producers.anchor.loc
        data = {"table": producers.table.dump(),
                "anchor": [anchor.segment, anchor.offset, anchor.length] if anchor else None}
        return data, [anchor] if anchor is not None else []
