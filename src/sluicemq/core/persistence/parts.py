"""Extension point: broker state beside the queues that the journal and the index snapshot carry.

Queues, durable subscriptions and streams are built into replay and capture. Any other stored
state (staged parts, memo tables, ledgers, ...) plugs in as a ``StatePart`` subclass that the
composition root (``app.py``, ``STATE_PARTS``) hands to replay, capture and the
checkpointer; the broker itself does not know them. One
instance per start-up lives through replay; the class method ``capture`` runs on the event
loop whenever a snapshot is taken. The contract, in start-up order:

1. ``seed(data)``: the section this part captured into the index snapshot (skipped when the
   start scans the whole journal, or the snapshot has no section of that name);
2. ``record(replay, rtype, payload, loc)``: every journal record of a type in ``rtypes`` after
   the snapshot's position (or every one, for a full scan), in log order. ``replay`` is the
   core's ``Replay``: ``replay.message(...)`` / ``replay.acks(...)`` add and remove messages
   as journal records would;
3. ``install()``: put the result into the broker; returns the locations of the journal records
   the part keeps alive (pins), each of which is retained once.

``capture(broker)`` must return a JSON-able section describing the state as of the last record
appended so far, and the same pins the running broker holds (the snapshot's self-check adds
them to the queues' holders and compares with the journal's live counts: a mismatch means no
snapshot, never a wrong one).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from sluicemq.storage.segment import Location

if TYPE_CHECKING:
    from sluicemq.core.routing.broker import Broker


class Replay(Protocol):
    """What a part sees of start-up replay (``persistence/recovery.py``): it adds messages as
    journal records would, and learns of ids taken outside them. A shape, so that recovery
    and the parts it drives do not import each other."""

    max_mid: int

    def message(self, payload: bytes | memoryview, loc: Location, inner: int = 0,
                mid: int | None = None) -> None: ...


class StatePart:
    """Base class: override what the part needs; the defaults store and pin nothing."""

    name: ClassVar[str] = ""
    rtypes: ClassVar[tuple[int, ...]] = ()
    flags: ClassVar[int] = 0  # MSG flag bits (``records``) of the messages ``message`` sees

    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    def seed(self, data: Any) -> None:
        """Load the section captured into the index snapshot (before the tail is replayed)."""

    def record(self, replay: Replay, rtype: int, payload: bytes | memoryview,
               loc: Location) -> None:
        """Apply one journal record of a type in ``rtypes``."""

    def message(self, payload: bytes) -> None:
        """A stored message (a MSG record or a message op) whose flags include ``flags``."""

    def install(self) -> Iterable[Location]:
        """Hand the recovered state to the broker; returns the records it keeps pinned."""
        return ()

    @classmethod
    def capture(cls, broker: Broker) -> tuple[Any, Iterable[Location]]:
        """(JSON-able section, pinned record locations) of the running broker."""
        return None, ()


def check_parts(parts: Sequence[type[StatePart]]) -> tuple[type[StatePart], ...]:
    """The parts a broker carries, checked: names and record types must be unique."""
    names: set[str] = set()
    taken: set[int] = set()
    for part in parts:
        if not part.name or part.name in names:
            raise ValueError(f"state part name {part.name!r} is empty or taken")
        if taken & set(part.rtypes):
            raise ValueError(f"record types {sorted(taken & set(part.rtypes))} are handled twice")
        names.add(part.name)
        taken |= set(part.rtypes)
    return tuple(parts)
