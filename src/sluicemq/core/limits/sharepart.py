"""The per-user share's senders as a state part of the index snapshot (``sharestate.py``):
captured with every snapshot while the book is kept, handed to ``Broker.count_shares`` at
start-up. A module of its own: the broker imports the seed's type, not the part."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from sluicemq.core.limits.sharestate import ShareSeed, dump, load
from sluicemq.core.persistence.parts import StatePart
from sluicemq.storage.segment import Location

if TYPE_CHECKING:
    from sluicemq.core.routing.broker import Broker


class SharesPart(StatePart):
    """The book's senders, captured into the snapshot and handed to ``Broker.count_shares``."""

    name = "user_shares"

    def __init__(self, broker: Broker) -> None:
        super().__init__(broker)
        self.seed_data: ShareSeed | None = None

    def seed(self, data: Any) -> None:
        if data:
            self.seed_data = load(data)

    def install(self) -> Iterable[Location]:
        self.broker.share_seed = self.seed_data
        return ()

    @classmethod
    def capture(cls, broker: Broker) -> tuple[Any, Iterable[Location]]:
        shares = broker.shares
        mark = broker.store.journal.mark()
        if shares is None or broker.store.shares is None or mark is None:
            return None, ()  # no book kept (yet): a restart reads the records
        return dump(shares.book, shares.logins, mark[1]), ()
