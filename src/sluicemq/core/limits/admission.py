"""Who may open a connection: one count for every transport, broker-wide and per address.

Why one count: TCP, TLS and WebSocket connections all cost a file descriptor and a session,
so a client that cannot exhaust the TCP listener must not be able to exhaust the process
through the WebSocket one. Why per address: without it one client opening idle sockets
(they need not even log in) fills ``max_connections`` and locks everybody else out.
Sans-IO: transports ask ``admit`` when a socket arrives and ``release`` when it is gone.

The same count shares out ``output_buffer_bytes``: what a connection may have written but its
socket not yet taken. A peer that stops reading keeps its share until ``slow_reader_seconds``
drop it; without a broker-wide budget a client opening a few hundred subscribers that never
read held 4 MiB of frames each (~900 MiB with a 256 MiB memory limit). Transports ask
``output_share`` before each write to the socket, so a share shrinks as connections arrive.
The budget is also held within what queued messages leave of ``memory_limit`` (``room``, from
the memory account, which output is charged to): the limit bounds both together.
"""

from __future__ import annotations

from collections.abc import Callable

from sluicemq.config import Limits
from sluicemq.core.paging.flow import parse_size

OUTPUT_FLOOR = 32 << 10  # a connection's share never goes below this
OUTPUT_CEILING = 4 << 20  # nor above (a large stream's chunks in flight)


class Admission:
    """Open connections broker-wide and per client address, against their caps."""

    __slots__ = ("by_address", "limits", "output_bytes", "refused_total", "room", "total")

    def __init__(self, limits: Limits, room: Callable[[], int] | None = None) -> None:
        self.limits = limits
        self.room = room  # what memory_limit leaves for output now (None: no such limit)
        self.total = 0
        self.by_address: dict[str, int] = {}
        self.refused_total = 0
        self.output_bytes = parse_size(limits.output_buffer_bytes)

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

    def output_share(self) -> int:
        """Bytes of output one connection may hold unsent (its write high-water mark)."""
        budget = self.output_bytes
        if self.room is not None:
            budget = min(budget, self.room())
        share = budget // max(1, self.total)
        return max(OUTPUT_FLOOR, min(OUTPUT_CEILING, share))

    def busiest(self) -> int:
        """Connections held by the address that holds the most (console, /metrics)."""
        return max(self.by_address.values(), default=0)


def connect_timeout_message(seconds: float) -> str:
    """The ERROR text for a socket that did not complete CONNECT in time."""
    return f"no CONNECT within {seconds:g} s (connect_timeout)"
