"""Why a stream could not be written or read; all are ClientErrors so callers catch one type."""

from __future__ import annotations

from sluicemq.errors import ClientError


class StreamProtocolError(ClientError):
    """A chunk or broker answer does not follow the stream format (malformed headers)."""


class StreamGapError(ClientError):
    """Chunks are missing: the reader saw an unexpected seq/offset, or the broker refused a
    chunk that skipped ahead (`next_seq` then says what it expected)."""

    def __init__(self, message: str, headers: dict[str, str] | None = None,
                 body: bytes = b"", *, next_seq: int | None = None) -> None:
        super().__init__(message, headers, body)
        self.next_seq = next_seq


class StreamIntegrityError(ClientError):
    """The bytes received do not match the size or SHA-256 the producer declared."""


class StreamAbandonedError(ClientError):
    """The broker gave up on the stream (its producer vanished); it will never complete."""


class NoConsumerError(ClientError):
    """`wait_for_consumer` ran out: nobody subscribed to the destination in time."""
