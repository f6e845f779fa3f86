"""Range reads, head queries and ledger commits for the blocking `Client`.

The wire side (docs/replay-protocol.md, sections 1, 2 and 5) is a ``browser:true`` SUBSCRIBE
answered by MESSAGE frames and one end frame; ``range_headers`` and ``parse_end`` are that
translation, without I/O. ``RangeRead`` is the iterator: the client's reader thread hands it
frames, and it holds at most ``MAX_ITEMS`` messages / ``MAX_BYTES`` - beyond that the reader
waits for the caller to catch up, so TCP pushes back to the broker, which pauses the read.
The reader never waits while another thread expects a receipt (it must read that receipt),
and it keeps heart-beats going while it waits.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sluicemq.client.inbox import Ended
from sluicemq.client.machine import Outgoing
from sluicemq.client.message import Message
from sluicemq.errors import ClientError
from sluicemq.protocol import columns

if TYPE_CHECKING:
    from sluicemq.client.machine import ClientMachine
    from sluicemq.client.sync_conn import Connection
    from sluicemq.client.sync_handles import Receipt

MAX_ITEMS = 1000
MAX_BYTES = 16 << 20
WAIT_SLICE = 0.2  # seconds between heart-beat checks while the reader waits for the caller


@dataclass(frozen=True, slots=True)
class RangeHead:
    """An end frame: the retained range's facts (docs/replay-protocol.md, section 2).

    ``first`` lowest retained seq (= ``next`` when nothing is retained); ``next`` the head;
    ``end`` the exclusive end covered; ``count`` messages (streams in streams mode) in
    ``[start, end)``; ``splits`` seqs cutting it into slices of equal count; ``committed``
    the ledger's position when a ledger was named; ``exists`` False: no such queue (yet).
    """

    first: int
    next: int
    end: int
    count: int
    splits: list[int] = field(default_factory=list)
    committed: int | None = None
    exists: bool = True


def range_headers(*, start: int | None = None, end: int | None = None,
                  max_messages: int | None = None, head_only: bool = False, splits: int = 0,
                  ledger: str | None = None, commit_upto: int | None = None,
                  subscription: str | None = None, client_id: str | None = None,
                  streams: bool = False, batch_bytes: int | None = None,
                  selector: str | None = None) -> dict[str, str]:
    """The SUBSCRIBE headers of a range request (destination and id are added by the caller).

    ``client_id`` only matters with ``subscription`` (a durable subscription is named by both);
    a ``selector`` (JMS syntax) makes a read send only the messages it matches.
    """
    h = {"browser": "true"}
    if subscription is not None:
        h["activemq.subscriptionName"] = subscription
        if client_id is not None:
            h["sluice-client-id"] = client_id
    for name, value in (("sluice-seq-from", start), ("sluice-seq-to", end),
                        ("sluice-max", max_messages), ("sluice-commit-upto", commit_upto)):
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer, not {value!r}")
            h[name] = str(value)
    if head_only:
        h["sluice-head-only"] = "true"
    if splits:
        h["sluice-splits"] = str(splits)
    if ledger is not None:
        h["sluice-ledger"] = ledger
    if streams:
        h["sluice-streams"] = "complete"
    if batch_bytes is not None:
        h["sluice-format"] = columns.FORMAT
        h["sluice-batch-bytes"] = str(batch_bytes)
        h["sluice-layout"] = columns.SPANS  # records as stored: the broker copies nothing
    if selector:
        h["selector"] = selector
    return h


def is_end(headers: dict[str, str]) -> bool:
    return headers.get("browser") == "end"


def parse_end(headers: dict[str, str]) -> RangeHead:
    """The RangeHead of an end frame; ClientError if it is not one."""
    try:
        cuts = headers.get("sluice-splits", "")
        committed = headers.get("sluice-ledger-committed")
        return RangeHead(int(headers["sluice-seq-first"]), int(headers["sluice-seq-next"]),
                         int(headers["sluice-seq-end"]), int(headers["sluice-count"]),
                         [int(c) for c in cuts.split(",")] if cuts else [],
                         int(committed) if committed is not None else None,
                         headers.get("sluice-destination-missing") != "true")
    except (KeyError, ValueError) as exc:
        raise ClientError(f"malformed range end frame: {exc}", headers) from None


class _End:
    __slots__ = ("head",)

    def __init__(self, head: RangeHead) -> None:
        self.head = head


class RangeRead:
    """The messages of one range read, in seq order; ``head`` is set once iteration ends.

    Use it as a context manager: leaving early cancels the read on the broker.
    """

    def __init__(self, client: Connection, sub_id: str, destination: str) -> None:
        self.client = client
        self.id = sub_id
        self.destination = destination
        self.active = True
        self.head: RangeHead | None = None
        self._cond = threading.Condition()
        self._items: deque[tuple[object, int]] = deque()
        self._bytes = 0
        self._closed = False

    # -- reader thread -----------------------------------------------------------------------
    def _deliver(self, item: object) -> None:
        if isinstance(item, Message) and is_end(item.headers):
            try:
                item = _End(parse_end(item.headers))
            except ClientError as exc:
                item = exc
            self.active = False
        elif isinstance(item, ClientError) and item.headers.get("subscription") != self.id:
            return  # an ERROR about something else on this connection
        size = len(item.body) if isinstance(item, Message) else 0
        with self._cond:
            while self._full() and self._may_wait():
                self._cond.wait(WAIT_SLICE)
                self.client._beat(check_dead=False)  # we are not reading: cannot judge
            if not self._closed:
                self._items.append((item, size))
                self._bytes += size
                self._cond.notify_all()
        if isinstance(item, _End | Ended | ClientError):
            self.client._forget(self.id)

    def _full(self) -> bool:
        return bool(self._items) and (len(self._items) >= MAX_ITEMS
                                      or self._bytes >= MAX_BYTES)

    def _may_wait(self) -> bool:
        """Block the reader only while nobody waits for a receipt it must read first."""
        return (not self._closed and self.client.is_open
                and not self.client._receipt_waiters.count)

    def wake(self) -> None:
        """Re-check whether the reader thread may wait (someone now waits for a receipt)."""
        with self._cond:
            self._cond.notify_all()

    # -- caller ------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Message]:
        return self

    def __next__(self) -> Message:
        item = self._next_item()
        if isinstance(item, Message):
            return item
        if isinstance(item, _End):
            self.head = item.head
            self._closed = True
            raise StopIteration
        self._closed = True
        if isinstance(item, Ended):
            if item.error is not None:
                raise item.error
            raise ClientError("the range read ended before its end frame")
        assert isinstance(item, ClientError)
        raise item

    def _next_item(self) -> object:
        if self._closed:
            raise StopIteration
        timeout = self.client.timeout
        with self._cond:
            if not self._items and not self._cond.wait_for(lambda: self._items, timeout):
                self._closed = True
                raise ClientError(f"range read of {self.destination}: nothing from the broker "
                                  f"within {timeout}s")
            item, size = self._items.popleft()
            self._bytes -= size
            self._cond.notify_all()
        return item

    def batches(self) -> Iterator[columns.Columns]:
        """The column batches of a read opened with ``batch_bytes`` (views into each frame's
        body; ClientError for a frame that is not a well-formed batch)."""
        for msg in self:
            try:
                yield columns.decode(msg.body)
            except ValueError as exc:
                raise ClientError(f"range read of {self.destination}: {exc}",
                                  dict(msg.headers)) from None

    def result(self) -> RangeHead:
        """Skip any remaining messages and return the end frame's RangeHead."""
        for _ in self:
            pass
        assert self.head is not None
        return self.head

    def close(self) -> None:
        """Stop: an unfinished read is cancelled on the broker, buffered messages dropped."""
        if self._closed and not self.active:
            return
        with self._cond:
            self._closed = True
            self._items.clear()
            self._bytes = 0
            self._cond.notify_all()
        if self.active and self.client.is_open:
            self.active = False
            self.client._forget(self.id)
            self.client._call(lambda m: _unsubscribe(m, self.id))

    def __enter__(self) -> RangeRead:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _unsubscribe(machine: ClientMachine, sub_id: str) -> Outgoing:
    """Cancel a read, unless its end frame already came (the machine then forgot the id)."""
    if sub_id in machine.subscriptions:
        return machine.unsubscribe(sub_id, receipt=False)
    return Outgoing(b"")


def open_range(client: Connection, destination: str, headers: dict[str, str]) -> RangeRead:
    """Send the SUBSCRIBE, wait for its RECEIPT (an ERROR raises), return the reader."""
    reader, receipt = send_range(client, destination, headers)
    _confirmed(client, reader, receipt)
    return reader


def send_range(client: Connection, destination: str,
               headers: dict[str, str]) -> tuple[RangeRead, Receipt]:
    """Send the SUBSCRIBE without waiting: the reader and the RECEIPT's handle."""
    holder: list[RangeRead] = []

    def build(m: ClientMachine) -> Outgoing:
        out = m.subscribe(destination, headers=headers)
        assert out.ident is not None
        reader = RangeRead(client, out.ident, destination)
        client._subscriptions[out.ident] = reader
        holder.append(reader)
        return out

    try:
        _out, receipt = client._submit(build)
    except ClientError:
        if holder:
            _forget(client, holder[0])
        raise
    return holder[0], receipt


def _confirmed(client: Connection, reader: RangeRead, receipt: Receipt) -> None:
    try:
        receipt.result()
    except ClientError:
        _forget(client, reader)
        raise


def _forget(client: Connection, reader: RangeRead) -> None:
    client._forget(reader.id)
    with client._state:
        client._machine.subscriptions.pop(reader.id, None)


class PendingCommit:
    """A ledger commit on its way: sent, not waited for.

    Why a commit may be left unwaited: the broker finishes a commit it has received even if
    the connection ends, and one that never arrived is harmless to the ledger's user - it
    commits the same position again (a streaming source does so when it plans its next
    batch). ``result()`` waits for the commit and raises its error.
    """

    def __init__(self, client: Connection, reader: RangeRead, receipt: Receipt) -> None:
        self._client = client
        self._reader = reader
        self._receipt = receipt

    def done(self) -> bool:
        """The broker answered (the end frame comes before the RECEIPT of a commit)."""
        return self._receipt.done()

    def result(self) -> RangeHead:
        """The commit's end frame, once the removal and the ledger move are durable."""
        _confirmed(self._client, self._reader, self._receipt)
        with self._reader:
            return self._reader.result()
