"""The options users pass to `format("sluice")`, parsed once into typed values.

Spark hands options over as a case-insensitive map (and `dict()` of it lowercases every key),
so every lookup here is by lowercase name. Parsing happens on the driver when the reader or
writer is created: a typo fails the query at start, not inside an executor an hour later.
An option name neither side knows is an error too (with the closest known names): a misspelt
`maxMessagesPerTrigger` silently ignored would run unbounded batches.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from sluicemq.client.url import DEFAULT_PORT, parse_brokers
from sluicemq.spark.schema import Shape, parse_shape

DEFAULT_URL = f"stomp://127.0.0.1:{DEFAULT_PORT}"
MODES = ("messages", "streams")
STREAM_FORMATS = ("csv", "json", "parquet", "text")  # spark/files.py
DEFAULT_BATCH_BYTES = 4 << 20  # column batches of this size on the wire (option batchBytes)
STREAM_OUTPUTS = ("binary", "path")
# Spark rows must stay well below the JVM's 2 GiB array limit.
MAX_BINARY_STREAM = 512 << 20
_SINK_ID = re.compile(r"[A-Za-z0-9._:-]{1,200}")  # the broker's rule for stage names

CONNECTION_OPTIONS = ("url", "login", "passcode", "clientId", "timeout")
SOURCE_OPTIONS = (*CONNECTION_OPTIONS, "destination", "subscription", "selector", "ledger",
                  "mode", "startingOffsets", "maxMessagesPerTrigger", "partitions",
                  "streams.output", "streams.format", "path", "consume", "headers",
                  "headerColumns", "bulk", "batchBytes", "streams.csv.header",
                  "streams.csv.delimiter", "pushdown", "streams.deleteCommitted")
SINK_OPTIONS = (*CONNECTION_OPTIONS, "destination", "sinkId", "bulk")
# Added by Spark itself: `load(path)` / `save(path)` / `start(path)`, a stream's checkpoint.
SPARK_OPTIONS = ("path", "checkpointLocation")


class OptionError(ValueError):
    """An option is missing or has a value the source cannot use."""


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in options.items()}


def check_names(opts: Iterable[str], known: Iterable[str], what: str) -> None:
    """Refuse an option name that is not in `known` (compared without case), naming the
    closest known ones."""
    spelled = {name.lower(): name for name in known}
    unknown = sorted(k for k in opts if k.lower() not in spelled)
    if not unknown:
        return
    bad = unknown[0]
    import difflib  # only for the error: ~20 ms on the start of every query's planner

    close = difflib.get_close_matches(bad.lower(), list(spelled), n=3, cutoff=0.6)
    hint = (f"did you mean {' or '.join(spelled[c] for c in close)}? " if close else "")
    raise OptionError(f"unknown option {bad!r} for {what}: {hint}known options are "
                      f"{', '.join(n for n in spelled.values() if n not in SPARK_OPTIONS)}")


def _flag(value: str | None, default: bool) -> bool:
    if value is None:
        return default
    text = value.strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise OptionError(f"expected true or false, got {value!r}")


def _positive(opts: dict[str, str], key: str, default: int | None) -> int | None:
    value = opts.get(key.lower())
    if value is None:
        return default
    try:
        n = int(value)
    except ValueError:
        raise OptionError(f"option {key} must be an integer, got {value!r}") from None
    if n <= 0:
        raise OptionError(f"option {key} must be positive, got {n}")
    return n


@dataclass(frozen=True)
class Connection:
    """Where the broker is and who we are; every reader, partition and writer task connects
    with these (executors open their own connections)."""

    url: str = DEFAULT_URL
    login: str | None = None
    passcode: str | None = None
    client_id: str | None = None
    timeout: float = 30.0

    @classmethod
    def parse(cls, opts: dict[str, str], *, client_id: str | None = None) -> Connection:
        url = opts.get("url", DEFAULT_URL)
        try:
            parse_brokers(url)  # a failover:(...) URL too; tasks then connect through it
        except ValueError as exc:
            raise OptionError(f"option url: {exc}") from None
        try:
            timeout = float(opts.get("timeout", "30"))
        except ValueError:
            raise OptionError(f"option timeout must be seconds, got {opts['timeout']!r}") from None
        return cls(url, opts.get("login"), opts.get("passcode"),
                   opts.get("clientid", client_id), timeout)


def _destination(opts: dict[str, str], *, required: bool = True) -> str | None:
    dest = opts.get("destination")
    if dest is None:
        if required:
            raise OptionError("option destination is required, e.g. /queue/orders")
        return None
    if not (dest.startswith("/queue/") or dest.startswith("/topic/")) or len(dest) <= 7:
        raise OptionError(f"option destination must be /queue/NAME or /topic/NAME, got {dest!r}")
    return dest


@dataclass(frozen=True)
class SourceOptions:
    """What to read and how: the parsed form of a reader's options."""

    connection: Connection
    destination: str
    subscription: str | None
    ledger: str
    mode: str
    starting: str
    max_per_batch: int | None
    partitions: int
    stream_output: str
    path: str | None
    consume: bool
    selector: str | None = None
    shape: Shape = field(default_factory=Shape)
    batch_bytes: int | None = DEFAULT_BATCH_BYTES  # None: one MESSAGE frame per message
    stream_format: str | None = None  # streams.format: parse each file's rows (spark/files.py)
    file_schema: str | None = None  # the query's schema (StructType JSON) for stream_format
    file_options: dict[str, str] = field(default_factory=dict)  # streams.csv.*
    delete_committed: bool = False  # streams.deleteCommitted: landed files go once committed
    pushdown: bool = False  # batch reads take `offset` filters (spark/pushdown.py)

    @property
    def streams(self) -> bool:
        return self.mode == "streams"

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        opts = _lower(options)
        check_names(opts, (*SOURCE_OPTIONS, *SPARK_OPTIONS), 'reading format("sluice")')
        dest = _destination(opts)
        assert dest is not None
        subscription = opts.get("subscription")
        if dest.startswith("/topic/") and not subscription:
            raise OptionError(
                "reading a topic needs option subscription (a durable subscription name): "
                "only a durable subscription retains messages for replay")
        if subscription and not dest.startswith("/topic/"):
            raise OptionError("option subscription applies to /topic/ destinations only")
        client_id = f"spark-{subscription}" if subscription else None
        selector = opts.get("selector")
        if selector and not subscription:
            raise OptionError(
                "option selector needs a topic subscription: a ledger commit removes every "
                "message of a queue below its position, selected or not")
        stream_format = opts.get("streams.format")
        if stream_format is not None:
            stream_format = stream_format.strip().lower()
            if stream_format not in STREAM_FORMATS:
                raise OptionError(f"option streams.format must be one of "
                                  f"{', '.join(STREAM_FORMATS)}, got {stream_format!r}")
            if opts.get("mode", "streams").lower() != "streams":
                raise OptionError("option streams.format reads file streams: it needs "
                                  "mode=streams (or no mode)")
        mode = opts.get("mode", "streams" if stream_format else "messages").lower()
        if mode not in MODES:
            raise OptionError(f"option mode must be one of {', '.join(MODES)}, got {mode!r}")
        starting = opts.get("startingoffsets", "earliest").lower()
        if starting not in ("earliest", "latest"):
            raise OptionError(f"option startingOffsets must be earliest or latest, "
                              f"got {starting!r}")
        output = opts.get("streams.output", "binary").lower()
        if output not in STREAM_OUTPUTS:
            raise OptionError(f"option streams.output must be binary or path, got {output!r}")
        path = opts.get("path")
        if mode == "streams" and output == "path" and not path:
            raise OptionError("option streams.output=path needs option path (a directory "
                              "every executor can write, e.g. on a shared file system)")
        delete_committed = _flag(opts.get("streams.deletecommitted"), False)
        if delete_committed and output != "path":
            raise OptionError("option streams.deleteCommitted deletes landed files: it needs "
                              "streams.output=path")
        partitions = _positive(opts, "partitions", 2)
        assert partitions is not None
        try:
            shape = parse_shape(opts.get("headers"), opts.get("headercolumns"))
        except ValueError as exc:
            raise OptionError(str(exc)) from None
        batch_bytes = _positive(opts, "batchBytes", DEFAULT_BATCH_BYTES)
        if not _flag(opts.get("bulk"), True) or mode == "streams":
            batch_bytes = None  # streams are read chunk by chunk, one frame each
        return cls(
            connection=Connection.parse(opts, client_id=client_id),
            destination=dest,
            subscription=subscription,
            ledger=opts.get("ledger", "spark"),
            mode=mode,
            starting=starting,
            max_per_batch=_positive(opts, "maxMessagesPerTrigger", None),
            partitions=partitions,
            stream_output=output,
            path=path,
            consume=_flag(opts.get("consume"), False),
            selector=selector,
            shape=shape,
            batch_bytes=batch_bytes,
            stream_format=stream_format,
            file_options={k: v for k, v in opts.items() if k.startswith("streams.csv.")},
            pushdown=_flag(opts.get("pushdown"), False),
            delete_committed=delete_committed,
        )


@dataclass(frozen=True)
class SinkOptions:
    """Where rows go: the parsed form of a writer's options. `sink_id` None: the writer
    derives it (`q-<query id>` for a streaming query, `w-<random>` per batch write)."""

    connection: Connection
    destination: str | None
    sink_id: str | None

    @classmethod
    def parse(cls, options: Mapping[str, str], *, streaming: bool) -> SinkOptions:
        opts = _lower(options)
        check_names(opts, (*SINK_OPTIONS, "checkpointLocation") if streaming else SINK_OPTIONS,
                    'writing format("sluice")')
        sink_id = opts.get("sinkid")
        if sink_id is not None and not _SINK_ID.fullmatch(sink_id):
            raise OptionError(f"option sinkId must be 1-200 characters of A-Z a-z 0-9 . _ : -, "
                              f"got {sink_id!r}")
        return cls(Connection.parse(opts), _destination(opts, required=False), sink_id)
