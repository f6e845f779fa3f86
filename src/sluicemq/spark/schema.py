"""The rows the source produces, as Spark DDL: one schema per mode, shaped by options.

`offset` is the message's broker sequence number (the replay position, see
docs/replay-protocol.md); for a stream it is the sequence number of its final chunk, the
position at which the stream became complete.

A message's headers cost more to turn into Spark values than its body (a map column is built
row by row), so they come the way a query asks (option ``headers``): ``json`` (default) one
STRING holding the stored headers as a JSON object, read without parsing; ``map`` a
MAP<STRING, STRING>; ``none`` no column. Option ``headerColumns`` adds chosen headers as STRING
columns of their own (null where a message lacks one).
"""

from __future__ import annotations

from dataclasses import dataclass

HEADER_MODES = ("json", "map", "none")
BASE_COLUMNS = ("message_id", "destination", "headers", "body", "timestamp", "redelivered",
                "offset")

TEXT_SCHEMA = "value STRING"  # option streams.format=text: one row a line

STREAMS = (
    "stream_id STRING, name STRING, size BIGINT, sha256 STRING, content BINARY, path STRING, "
    "destination STRING, headers MAP<STRING, STRING>, timestamp TIMESTAMP, offset BIGINT"
)


@dataclass(frozen=True)
class Shape:
    """How message rows look: the header column's form and the extra header columns."""

    headers: str = "json"
    columns: tuple[str, ...] = ()

    def ddl(self) -> str:
        cols = ["message_id STRING", "destination STRING"]
        if self.headers == "map":
            cols.append("headers MAP<STRING, STRING>")
        elif self.headers == "json":
            cols.append("headers STRING")
        cols += ["body BINARY", "timestamp TIMESTAMP", "redelivered BOOLEAN", "offset BIGINT"]
        cols += [f"`{name}` STRING" for name in self.columns]
        return ", ".join(cols)

    @property
    def parses_headers(self) -> bool:
        """Whether each row's header JSON must be decoded (a map, or named columns)."""
        return self.headers == "map" or bool(self.columns)


def parse_shape(headers: str | None, columns: str | None) -> Shape:
    """The shape from the option values; ValueError names what is wrong."""
    mode = (headers or "json").strip().lower()
    if mode not in HEADER_MODES:
        raise ValueError(f"option headers must be one of {', '.join(HEADER_MODES)}, "
                         f"got {headers!r}")
    names = tuple(n.strip() for n in (columns or "").split(",") if n.strip())
    clash = [n for n in names if n.lower() in BASE_COLUMNS]
    if clash:
        raise ValueError(f"option headerColumns: {', '.join(clash)} would clash with the "
                         f"source's own columns ({', '.join(BASE_COLUMNS)})")
    if len({n.lower() for n in names}) != len(names):
        raise ValueError(f"option headerColumns names a header twice: {columns!r}")
    return Shape(mode, names)


def for_options(mode: str, shape: Shape) -> str:
    return STREAMS if mode == "streams" else shape.ddl()
