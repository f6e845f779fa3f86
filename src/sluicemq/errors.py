"""Exceptions shared by every layer; each names the layer that raised it."""

from __future__ import annotations


class SluiceError(Exception):
    """Base class of every error SluiceMQ raises on purpose."""


class ProtocolError(SluiceError):
    """The peer sent bytes that are not a valid STOMP frame, or broke a protocol limit.

    ``fatal`` tells the connection whether it must close after sending the ERROR frame.
    """

    def __init__(self, message: str, *, fatal: bool = True, receipt: str | None = None) -> None:
        super().__init__(message)
        self.fatal = fatal
        self.receipt = receipt


class StorageError(SluiceError):
    """The journal could not store or read a record (disk full, I/O error, corruption)."""


class AuthError(SluiceError):
    """Authentication or authorization refused."""


class FlowControlError(SluiceError):
    """A limit was reached and the destination's policy is to refuse rather than wait."""


class ClientError(SluiceError):
    """Raised by the client library: the broker answered with ERROR, or the connection broke."""

    def __init__(
        self, message: str, headers: dict[str, str] | None = None, body: bytes = b""
    ) -> None:
        super().__init__(message)
        self.headers = headers or {}
        self.body = body
        # A SEND that failed where it may have reached the broker: the number it went out
        # with (its producer_seq), to resend it under.
        self.producer_seq: int | None = None
