"""The rows the source produces, one schema per mode, as Spark DDL strings.

`offset` is the message's broker sequence number (the replay position, see
docs/replay-protocol.md); for a stream it is the sequence number of its final chunk, the
position at which the stream became complete.
"""

from __future__ import annotations

MESSAGES = (
    "message_id STRING, destination STRING, headers MAP<STRING, STRING>, body BINARY, "
    "timestamp TIMESTAMP, redelivered BOOLEAN, offset BIGINT"
)

STREAMS = (
    "stream_id STRING, name STRING, size BIGINT, sha256 STRING, content BINARY, path STRING, "
    "destination STRING, headers MAP<STRING, STRING>, timestamp TIMESTAMP, offset BIGINT"
)


def for_mode(mode: str) -> str:
    return STREAMS if mode == "streams" else MESSAGES
