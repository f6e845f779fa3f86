"""Turning what the broker delivers into Spark rows: one row per message, or one row per
complete stream (its chunks assembled, SHA-256 checked, then kept as bytes or written out).

Everything here runs inside a Spark task, on whatever executor reads the partition.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO

from sluicemq.protocol.numbers import natural
from sluicemq.spark.options import MAX_BINARY_STREAM
from sluicemq.spark.schema import Shape
from sluicemq.streaming.assembler import Assembler, Verdict
from sluicemq.streaming.errors import StreamProtocolError
from sluicemq.streaming.manifest import PREFIX, is_chunk, parse_chunk

_UTC = dt.UTC
OFFSET_NOTE = ".sluice-offset"  # in a landed stream's folder: its replay position
WRITE_BEHIND = 4  # chunks a landing file may be written behind the hash (bounded memory)
# Set by the broker on each MESSAGE frame of a range read, not stored with the message.
_FRAME_HEADERS = frozenset({"destination", "message-id", "subscription", "sluice-seq", "ack",
                            "content-length"})


def _timestamp(headers: dict[str, str]) -> dt.datetime | None:
    ms = natural(headers.get("timestamp"))
    if ms is None:
        return None
    try:
        return dt.datetime.fromtimestamp(ms / 1000, tz=_UTC)
    except (OverflowError, ValueError, OSError):  # past year 9999: a producer's header
        return None


def message_row(msg: Any, shape: Shape) -> tuple:
    """(message_id, destination, [headers], body, timestamp, redelivered, offset, [named
    headers...]) from one MESSAGE frame; headers are the stored ones, as in a column batch."""
    headers = {k: v for k, v in msg.headers.items() if k not in _FRAME_HEADERS}
    row: list[Any] = [msg.message_id, msg.destination]
    if shape.headers == "map":
        row.append(headers)
    elif shape.headers == "json":
        row.append(json.dumps(headers, separators=(",", ":"), ensure_ascii=False))
    row += [bytes(msg.body), _timestamp(headers), msg.redelivered, msg.seq]
    row += [headers.get(name) for name in shape.columns]
    return tuple(row)


def _user_headers(headers: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in headers.items()
            if not k.startswith(PREFIX) and k not in ("JMSXGroupID", "subscription", "ack",
                                                      "content-length", "message-id")}


def remove_committed(root: str, upto: int) -> int:
    """Delete the landed streams (``streams.output=path``) whose offset is below ``upto`` (a
    committed micro-batch's end): their folders under ``root``. Returns how many went."""
    removed = 0
    base = Path(root)
    if not base.is_dir():
        return 0
    for note in base.glob(f"*/{OFFSET_NOTE}"):
        try:
            offset = int(note.read_text())
        except (OSError, ValueError):
            continue  # being written, or not ours
        if offset < upto:
            for item in note.parent.iterdir():
                with contextlib.suppress(FileNotFoundError):
                    item.unlink()
            with contextlib.suppress(OSError):
                note.parent.rmdir()
            removed += 1
    return removed


def _safe_name(name: str) -> str:
    """A file name from a producer-chosen stream name: no directories, never empty."""
    base = os.path.basename(name.replace("\\", "/")).strip()
    return base if base not in ("", ".", "..") else "data"


class _Sink:
    """Where one stream's bytes go while it is assembled: memory, or a `.part` file that is
    renamed into place only after the SHA-256 matched (a replayed batch rewrites it).

    A file is written behind: a helper thread writes each chunk while the task hashes the next
    one (both release the GIL), at most ``WRITE_BEHIND`` chunks ahead so memory stays bounded.
    Nothing depends on a chunk being on disk before the next arrives - the stream is
    acknowledged only when its batch commits, after ``finish`` fsynced the file."""

    def __init__(self, output: str, root: str | None, stream_id: str, name: str) -> None:
        self.chunks: list[bytes] = []
        self.size = 0
        self.path: Path | None = None
        self._file: BinaryIO | None = None
        self._writer: ThreadPoolExecutor | None = None
        self._pending: deque[Future[int]] = deque()
        if output == "path":
            assert root is not None
            folder = Path(root) / stream_id
            folder.mkdir(parents=True, exist_ok=True)
            self.path = folder / _safe_name(name)
            self._part = folder / (self.path.name + ".part")
            self._file = open(self._part, "wb", buffering=0)  # noqa: SIM115 - closed in finish/discard
            self._writer = ThreadPoolExecutor(1, thread_name_prefix="sluice-landing")

    def add(self, body: bytes) -> None:
        self.size += len(body)
        if self._file is not None:
            assert self._writer is not None
            while len(self._pending) >= WRITE_BEHIND:
                self._pending.popleft().result()  # a failed write fails the task here
            self._pending.append(self._writer.submit(_write_all, self._file, body))
        else:
            if self.size > MAX_BINARY_STREAM:
                raise StreamProtocolError(
                    f"stream larger than {MAX_BINARY_STREAM >> 20} MiB: use "
                    "option streams.output=path (Spark rows must stay far below 2 GiB)")
            self.chunks.append(body)

    def finish(self, offset: int) -> tuple[bytes | None, str | None]:
        """The content, or the landed file's path (its folder also notes ``offset``, the
        stream's replay position: ``remove_committed`` goes by it)."""
        if self._file is None:
            return b"".join(self.chunks), None
        self._drain()
        os.fsync(self._file.fileno())
        self._file.close()
        assert self.path is not None
        os.replace(self._part, self.path)
        note = self.path.parent / (OFFSET_NOTE + ".part")
        note.write_text(str(offset))
        os.replace(note, self.path.parent / OFFSET_NOTE)
        return None, str(self.path)

    def _drain(self) -> None:
        """Wait for every chunk written behind (the first failure raises) and stop the thread."""
        try:
            while self._pending:
                self._pending.popleft().result()
        finally:
            if self._writer is not None:
                self._writer.shutdown(wait=True, cancel_futures=True)

    def discard(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._drain()
            self._file.close()
            with contextlib.suppress(OSError):
                self._part.unlink()


def _write_all(f: BinaryIO, data: bytes) -> int:
    """One chunk into an unbuffered file: a write may take part of it."""
    view = memoryview(data)
    while view:
        view = view[f.write(view) or 0:]
    return len(data)


def stream_rows(messages: Iterable[Any], output: str, root: str | None) -> Iterator[tuple]:
    """Assemble consecutive chunks into one row per complete stream.

    The broker sends each stream of the range whole and in order (streams mode); anything
    else — a gap, a bad hash, a stream cut short — fails the task, so Spark retries it rather
    than emitting a damaged file.
    """
    current: Assembler | None = None
    sink: _Sink | None = None
    first: dict[str, str] = {}
    try:
        for msg in messages:
            if not is_chunk(msg.headers):
                continue
            info = parse_chunk(msg.headers)
            if current is None or info.stream_id != current.stream_id:
                if current is not None:
                    raise StreamProtocolError(f"stream {current.stream_id} ended early")
                current = Assembler(info.stream_id)
                sink = _Sink(output, root, info.stream_id, info.name)
                first = dict(msg.headers)
            assert sink is not None
            body = msg.body if isinstance(msg.body, bytes) else bytes(msg.body)
            if current.accept(info, body) is Verdict.DUPLICATE:
                continue
            sink.add(body)
            if current.complete:
                content, path = sink.finish(msg.seq)
                headers = _user_headers(first)
                yield (info.stream_id, info.name, info.size, info.sha256, content, path,
                       msg.destination, headers, _timestamp(first), msg.seq)
                current, sink = None, None
        if current is not None:
            raise StreamProtocolError(f"stream {current.stream_id} ended early")
    finally:
        if sink is not None:
            sink.discard()
