"""What the session-driven features (range reads, staged publishing) see of a session.

Why a Protocol: those features are driven by ``Session`` and call back into it, so naming the
concrete class would tie their modules and the session's into one import cycle. They need
only this shape; ``Session`` has it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from sluicemq.core.routing.broker import Broker
    from sluicemq.core.routing.queue import Consumer
    from sluicemq.core.security.policy import Security, User
    from sluicemq.protocol.frames import Frame


class Outbound(Protocol):
    """The transport side of a session."""

    writable: bool

    def write(self, data: bytes | memoryview) -> None: ...

    def close(self) -> None: ...


class SessionPeer(Protocol):
    broker: Broker
    security: Security
    out: Outbound
    version: str
    closed: bool
    user: User | None
    client_id: str | None

    @property
    def consumers(self) -> Mapping[str, Consumer]: ...

    @property
    def writable(self) -> bool: ...

    def error(self, message: str, frame: Frame | None = None, *, fatal: bool = True,
              detail: str = "", extra: dict[str, str] | None = None) -> None: ...

    def receipt(self, frame: Frame, extra: dict[str, str] | None = None) -> None: ...

    def when_writable(self, resume: Callable[[], None]) -> None: ...

    def when_durable_retry(self, frame: Frame) -> None: ...

    def authorize(self, action: str, kind: str, name: str) -> None: ...
