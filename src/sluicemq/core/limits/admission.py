"""Who may open a connection: one count for every transport, broker-wide and per address.

Why one count: TCP, TLS and WebSocket connections all cost a file descriptor and a session,
so a client that cannot exhaust the TCP listener must not be able to exhaust the process
through the WebSocket one. Why per address: without it one client opening idle sockets
(they need not even log in) fills ``max_connections`` and locks everybody else out.
Sans-IO: transports ask ``admit`` when a socket arrives and ``release`` when it is gone.
"""

from __future__ import annotations

from sluicemq.config import Limits


class Admission:
    """Open connections broker-wide and per client address, against their caps."""

    __slots__ = ("by_address", "limits", "refused_total", "total")

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.total = 0
        self.by_address: dict[str, int] = {}
        self.refused_total = 0

    def admit(self, address: str) -> str | None:
        """Count a new connection from ``address``, or say why it is refused (not counted)."""
        limit = self.limits.max_connections
        if self.total >= limit:
            self.refused_total += 1
            return f"too many connections (limit {limit}, max_connections)"
        per_address = self.limits.max_connections_per_address
        held = self.by_address.get(address, 0)
        if per_address and held >= per_address:
            self.refused_total += 1
            return (f"too many connections from {address} (limit {per_address}, "
                    "max_connections_per_address)")
        self.total += 1
        self.by_address[address] = held + 1
        return None

    def release(self, address: str) -> None:
        """An admitted connection is gone."""
        self.total -= 1
        held = self.by_address.get(address, 0) - 1
        if held > 0:
            self.by_address[address] = held
        else:
            self.by_address.pop(address, None)

    def busiest(self) -> int:
        """Connections held by the address that holds the most (console, /metrics)."""
        return max(self.by_address.values(), default=0)


def connect_timeout_message(seconds: float) -> str:
    """The ERROR text for a socket that did not complete CONNECT in time."""
    return f"no CONNECT within {seconds:g} s (connect_timeout)"
