"""Temporary destinations (ActiveMQ): ``/temp-queue/NAME`` and ``/temp-topic/NAME``.

A temporary destination belongs to the connection that first names it: it is that
connection's own (two connections' ``/temp-queue/reply`` are two queues), only it may consume
from it, and it is deleted, with whatever it holds, when that connection ends. Other
connections reach it through the address a ``reply-to`` header carries: the broker rewrites
``reply-to:/temp-queue/NAME`` to ``/remote-temp-queue/<internal name>`` on the way out, as
ActiveMQ does, so a request/reply round trip works with any STOMP client.

Internally it is an ordinary destination under a reserved prefix, ``sluice.temp.<conn>.NAME``,
so queues, dispatch, flow control and the destination caps apply unchanged. Messages sent to
one are kept in memory only (ActiveMQ's temporary destinations are never persistent).
"""

from __future__ import annotations

from sluicemq.core.routing.names import QUEUE, TOPIC
from sluicemq.errors import ProtocolError

PREFIX = "sluice.temp."
_OWN = {"/temp-queue/": QUEUE, "/temp-topic/": TOPIC}
_REMOTE = {"/remote-temp-queue/": QUEUE, "/remote-temp-topic/": TOPIC}
_REMOTE_OF = {QUEUE: "/remote-temp-queue/", TOPIC: "/remote-temp-topic/"}


def is_temporary(destination: str) -> bool:
    return destination.startswith(("/temp-", "/remote-temp-"))


class TempDestinations:
    """Which connection owns which temporary destination (kind, internal name)."""

    def __init__(self) -> None:
        self.owners: dict[tuple[str, str], str] = {}

    def owned_by(self, conn: str) -> list[tuple[str, str]]:
        return [key for key, owner in self.owners.items() if owner == conn]

    def resolve(self, destination: str, conn: str) -> tuple[str, str, bool]:
        """(kind, internal name, mine) of a temporary destination named on connection
        ``conn``; its own ``/temp-*`` names become its destinations on first use."""
        for prefix, kind in _OWN.items():
            if destination.startswith(prefix):
                name = f"{PREFIX}{conn}.{destination[len(prefix):]}"
                self.owners.setdefault((kind, name), conn)
                return kind, name, True
        for prefix, kind in _REMOTE.items():
            if destination.startswith(prefix):
                name = destination[len(prefix):]
                owner = self.owners.get((kind, name))
                if owner is None:
                    raise ProtocolError(f"temporary destination {destination!r} does not exist "
                                        "(its connection has ended)", fatal=False)
                return kind, name, owner == conn
        raise ProtocolError(f"invalid temporary destination {destination!r}", fatal=False)

    def check(self, kind: str, name: str, conn: str, consuming: bool) -> None:
        """A destination named directly (``/queue/sluice.temp.…``): only its owner consumes;
        a temporary name nobody owns is not created behind the owner's back."""
        if not name.startswith(PREFIX):
            return
        owner = self.owners.get((kind, name))
        if owner is None:
            raise ProtocolError(f"{PREFIX}* names are reserved for temporary destinations",
                                fatal=False)
        if consuming and owner != conn:
            raise ProtocolError("only the connection that created a temporary destination "
                                "may consume from it", fatal=False)

    def remote_address(self, destination: str, conn: str) -> str:
        """What a ``reply-to`` naming one of ``conn``'s temporary destinations becomes."""
        kind, name, _mine = self.resolve(destination, conn)
        return f"{_REMOTE_OF[kind]}{name}"

    def release(self, conn: str) -> list[tuple[str, str]]:
        """The connection ended: forget its destinations; returns them, to be deleted."""
        gone = self.owned_by(conn)
        for key in gone:
            del self.owners[key]
        return gone
