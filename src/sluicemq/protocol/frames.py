"""The STOMP frame value type shared by codec, broker and client."""

from __future__ import annotations

CLIENT_COMMANDS = frozenset(
    {
        "CONNECT", "STOMP", "SEND", "SUBSCRIBE", "UNSUBSCRIBE", "ACK", "NACK",
        "BEGIN", "COMMIT", "ABORT", "DISCONNECT",
    }
)
SERVER_COMMANDS = frozenset({"CONNECTED", "MESSAGE", "RECEIPT", "ERROR"})
ALL_COMMANDS = CLIENT_COMMANDS | SERVER_COMMANDS


class Frame:
    """One STOMP frame: command, decoded (unescaped) headers, raw body.

    Headers are a plain dict; when a frame repeats a header the first value wins, as STOMP 1.2
    requires. Slots keep per-frame overhead small on the hot path.
    """

    __slots__ = ("body", "command", "headers")

    def __init__(
        self, command: str, headers: dict[str, str] | None = None,
        body: bytes | memoryview = b"",
    ) -> None:
        self.command = command
        self.headers = headers if headers is not None else {}
        self.body = body

    def __repr__(self) -> str:
        return f"Frame({self.command!r}, {self.headers!r}, <{len(self.body)} bytes>)"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Frame):
            return NotImplemented
        return (
            self.command == other.command
            and self.headers == other.headers
            and bytes(self.body) == bytes(other.body)
        )

