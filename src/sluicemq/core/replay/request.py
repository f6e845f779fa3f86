"""What a range read asks for: the ``sluice-*`` headers of a ``browser:true`` SUBSCRIBE.

Header names are the wire contract of docs/replay-protocol.md (sections 1 and 2), shared with
the client (``sluicemq.client.ranges``). Parsing is strict: a malformed value is an ERROR
naming the header, never a silent default, because a replaying reader that asked for
something else than it gets would skip or duplicate data.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sluicemq.core.selectors import Selector, SelectorError, compile_selector
from sluicemq.protocol.columns import PACKED, SPANS
from sluicemq.protocol.numbers import natural

BROWSER = "browser"
SEQ = "sluice-seq"
SEQ_FROM = "sluice-seq-from"
SEQ_TO = "sluice-seq-to"
MAX = "sluice-max"
HEAD_ONLY = "sluice-head-only"
SPLITS = "sluice-splits"
LEDGER = "sluice-ledger"
COMMIT_UPTO = "sluice-commit-upto"
STREAMS = "sluice-streams"
CLIENT_ID = "sluice-client-id"  # the client id of the durable subscription read
FORMAT = "sluice-format"  # "columns": messages packed many to a frame (protocol/columns.py)
BATCH_BYTES = "sluice-batch-bytes"  # with sluice-format: columns, the target frame size
BATCH = "sluice-batch"  # on a column batch frame: its message count
LAYOUT = "sluice-layout"  # with sluice-format: columns, "packed" (default) or "spans"
SEQ_FIRST = "sluice-seq-first"
SEQ_NEXT = "sluice-seq-next"
SEQ_END = "sluice-seq-end"
COUNT = "sluice-count"
LEDGER_COMMITTED = "sluice-ledger-committed"
MISSING = "sluice-destination-missing"  # on an end frame: no such queue (yet)
ORIGINAL_ID = "sluice-original-id"
SELECTOR = "selector"  # a JMS selector: a read sends only the messages it matches
END = "end"  # the value of `browser` on the end frame
STREAMS_COMPLETE = "complete"

COLUMNS = "columns"
DEFAULT_BATCH_BYTES = 4 << 20
MIN_BATCH_BYTES, MAX_BATCH_BYTES = 4096, 64 << 20
MAX_SEQ = (1 << 63) - 1
MAX_SPLITS = 10_000
_LEDGER_RE = re.compile(r"[A-Za-z0-9._:-]{1,200}")


class RangeError(ValueError):
    """A range request the broker refuses; the text is the ERROR frame's ``message``."""


@dataclass(frozen=True, slots=True)
class RangeRequest:
    """One parsed range read, head query or commit."""

    start: int | None = None  # sluice-seq-from
    to: int | None = None  # sluice-seq-to (exclusive)
    max: int | None = None
    head_only: bool = False
    splits: int = 0
    ledger: str | None = None
    commit_upto: int | None = None
    streams: bool = False
    batch_bytes: int = 0  # > 0: answer with column batches of about this many bytes
    spans: bool = False  # column batches in the spans layout (protocol/columns.py)
    selector: Selector | None = None  # a read sends only what it matches

    @property
    def sends_messages(self) -> bool:
        return not self.head_only and self.commit_upto is None


def parse_request(headers: dict[str, str]) -> RangeRequest:
    """The request in a SUBSCRIBE's headers; RangeError says what is wrong."""
    if headers.get(BROWSER) != "true":
        raise RangeError(f"{BROWSER} must be 'true' for a range read")
    start = _seq(headers, SEQ_FROM)
    to = _seq(headers, SEQ_TO)
    upto = _seq(headers, COMMIT_UPTO)
    limit = _int(headers, MAX, low=1)
    splits = _int(headers, SPLITS, low=0, high=MAX_SPLITS) or 0
    head_only = _flag(headers, HEAD_ONLY)
    ledger = headers.get(LEDGER)
    if ledger is not None and not _LEDGER_RE.fullmatch(ledger):
        raise RangeError(f"invalid {LEDGER} {ledger!r}: use 1-200 of A-Z a-z 0-9 . _ : -")
    streams_value = headers.get(STREAMS)
    if streams_value is not None and streams_value != STREAMS_COMPLETE:
        raise RangeError(f"invalid {STREAMS} {streams_value!r}: the only mode is "
                         f"'{STREAMS_COMPLETE}'")
    if start is not None and to is not None and start > to:
        raise RangeError(f"{SEQ_FROM} {start} is above {SEQ_TO} {to}")
    if upto is not None:
        if ledger is None:
            raise RangeError(f"{COMMIT_UPTO} needs {LEDGER}")
        for name, value in ((SEQ_TO, to), (MAX, limit)):
            if value is not None:
                raise RangeError(f"{name} cannot be combined with {COMMIT_UPTO}")
        if splits:
            raise RangeError(f"{SPLITS} cannot be combined with {COMMIT_UPTO}")
        if start is not None and start > upto:
            raise RangeError(f"{SEQ_FROM} {start} is above {COMMIT_UPTO} {upto}")
    elif splits and not head_only:
        raise RangeError(f"{SPLITS} needs {HEAD_ONLY}:true")
    batch_bytes = _batch_bytes(headers)
    layout = headers.get(LAYOUT)
    if layout is not None and (not batch_bytes or layout not in (PACKED, SPANS)):
        raise RangeError(f"invalid {LAYOUT} {layout!r}: '{PACKED}' or '{SPANS}', "
                         f"with {FORMAT}:{COLUMNS}")
    selector = _selector(headers, head_only or upto is not None or streams_value is not None)
    return RangeRequest(start, to, limit, head_only, splits, ledger, upto,
                        streams_value == STREAMS_COMPLETE, batch_bytes, layout == SPANS,
                        selector)


def _selector(headers: dict[str, str], not_a_read: bool) -> Selector | None:
    """A browser's selector, as ActiveMQ honours it on a queue browser. Refused where it would
    mislead: a head query counts and a commit removes every message of its range, matched or
    not, and a stream is whole or not at all."""
    text = headers.get(SELECTOR) or None
    if text is None:
        return None
    if not_a_read:
        raise RangeError(f"{SELECTOR} applies to a range read only, not to a head query, "
                         f"a commit or a streams read")
    try:
        return compile_selector(text)
    except SelectorError as exc:
        raise RangeError(f"invalid selector: {exc}") from None


def _batch_bytes(headers: dict[str, str]) -> int:
    """0 for per-message frames; the target size of a column batch when one is asked for."""
    fmt = headers.get(FORMAT)
    size = _int(headers, BATCH_BYTES, low=MIN_BATCH_BYTES, high=MAX_BATCH_BYTES)
    if fmt is None:
        if size is not None:
            raise RangeError(f"{BATCH_BYTES} needs {FORMAT}:{COLUMNS}")
        return 0
    if fmt != COLUMNS:
        raise RangeError(f"invalid {FORMAT} {fmt!r}: the only format is '{COLUMNS}'")
    if headers.get(STREAMS) is not None:
        raise RangeError(f"{FORMAT}:{COLUMNS} cannot be combined with {STREAMS} (a stream's "
                         "chunks are read one frame each)")
    return size or DEFAULT_BATCH_BYTES


def _int(headers: dict[str, str], name: str, *, low: int, high: int = MAX_SEQ) -> int | None:
    text = headers.get(name)
    if text is None:
        return None
    value = natural(text, len(str(high)))
    if value is None:
        raise RangeError(f"invalid {name} {text[:50]!r}: expected an integer from {low} to "
                         f"{high}")
    if not low <= value <= high:
        raise RangeError(f"invalid {name} {text!r}: expected an integer from {low} to {high}")
    return value


def _seq(headers: dict[str, str], name: str) -> int | None:
    return _int(headers, name, low=0)


def _flag(headers: dict[str, str], name: str) -> bool:
    text = headers.get(name)
    if text is None or text == "false":
        return False
    if text == "true":
        return True
    raise RangeError(f"invalid {name} {text!r}: expected 'true' or 'false'")
