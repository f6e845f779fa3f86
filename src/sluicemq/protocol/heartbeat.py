"""STOMP 1.1+ heart-beating: the header, its negotiation, and a sans-IO liveness timer.

``heart-beat: cx,cy`` in CONNECT says the client can send every ``cx`` ms and wants to receive
every ``cy`` ms (0: cannot / does not want); CONNECTED answers with ``sx,sy`` from the server's
side. Any byte counts as a sign of life, a lone EOL when there is nothing else to send.
"""

from __future__ import annotations

from sluicemq.errors import ProtocolError

DEAD_AFTER = 2.0
"""Silence, in expected intervals, after which the peer is declared dead.

The spec asks receivers to tolerate timing inaccuracy without fixing a margin; twice the
interval is the common choice (ActiveMQ, RabbitMQ) and absorbs one late or lost beat.
"""


def parse_heart_beat(value: str | None) -> tuple[int, int]:
    """Parse a ``heart-beat`` header into ``(can_send_ms, wants_ms)``; absent means ``(0, 0)``."""
    if value is None or not value.strip():
        return (0, 0)
    parts = value.split(",")
    if len(parts) == 2:
        first, second = parts[0].strip(), parts[1].strip()
        if first.isascii() and first.isdigit() and second.isascii() and second.isdigit():
            return (int(first), int(second))
    raise ProtocolError(f"invalid heart-beat header {value[:40]!r}: expected two integers 'x,y'")


def negotiate(client: tuple[int, int], server: tuple[int, int]) -> tuple[int, int]:
    """Return ``(send_every_ms, expect_every_ms)`` from the server's side; 0 disables a direction.

    The server sends every max(sx, cy) ms unless it cannot (sx = 0) or the client does not want
    beats (cy = 0); it expects one every max(cx, sy) ms unless cx = 0 or sy = 0.
    """
    cx, cy = client
    sx, sy = server
    send_every = max(sx, cy) if sx and cy else 0
    expect_every = max(cx, sy) if cx and sy else 0
    return (send_every, expect_every)


class HeartbeatMonitor:
    """Decides when to send an EOL and when the peer has gone silent; owns no timer or socket.

    The transport reports traffic with ``sent``/``received`` and polls ``should_send`` and
    ``peer_dead`` at ``next_deadline``. Times are monotonic seconds, intervals negotiated ms.
    """

    __slots__ = ("dead_after", "expect_every", "last_received", "last_sent", "send_every")

    def __init__(
        self,
        send_every_ms: int,
        expect_every_ms: int,
        now: float,
        *,
        dead_after: float = DEAD_AFTER,
    ) -> None:
        self.send_every = send_every_ms / 1000
        self.expect_every = expect_every_ms / 1000
        self.dead_after = dead_after
        self.last_received = now
        self.last_sent = now

    def received(self, now: float) -> None:
        """Record that bytes (a frame or a heart-beat) arrived from the peer."""
        self.last_received = now

    def sent(self, now: float) -> None:
        """Record that bytes went out: any frame also serves as a heart-beat."""
        self.last_sent = now

    def should_send(self, now: float) -> bool:
        """True when we have been quiet for a whole send interval and owe the peer an EOL."""
        return self.send_every > 0 and now - self.last_sent >= self.send_every

    def peer_dead(self, now: float) -> bool:
        """True when nothing has arrived for ``dead_after`` expected intervals."""
        return (
            self.expect_every > 0
            and now - self.last_received > self.expect_every * self.dead_after
        )

    def next_deadline(self) -> float | None:
        """Earliest time at which either answer can change, or None when both are disabled."""
        deadlines = []
        if self.send_every > 0:
            deadlines.append(self.last_sent + self.send_every)
        if self.expect_every > 0:
            deadlines.append(self.last_received + self.expect_every * self.dead_after)
        return min(deadlines) if deadlines else None
