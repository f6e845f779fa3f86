"""Files as streams: resumable `send_file`, and receiving into a directory without ever
leaving a corrupt file under its final name.

A sent file's stream id is derived from (absolute path, size, mtime, destination, copy), so
rerunning an interrupted send asks the broker where that stream stopped and continues there
(the stored prefix is re-read locally to hash it, never re-sent). A rerun after the send
completed sends nothing (the broker says the stream is complete) unless asked for another
copy (`again`): copies 1, 2, ... are streams of their own, so a resent file is never taken
for a duplicate of the first. The same file to another destination is another stream.

A received stream is written to `DIR/.sluice-partial/<stream-id>.part` and renamed to its
final name only after the size and SHA-256 check passed and the data was fsync'd. When the
broker resumes a delivery at offset N (the previous receiver died), the part file is cut
back to N and its prefix re-hashed so the whole file is still verified. A `<id>.done` marker
covers the last gap: renamed, but the broker never got the final ACK; the redelivered tail
is then checked against the renamed file instead of failing for want of a part file.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from sluicemq.client.streams import (
    DEFAULT_CHUNK_SIZE,
    DEFAULT_WINDOW,
    StreamReader,
    StreamSubscription,
    StreamWriter,
)
from sluicemq.errors import ClientError
from sluicemq.protocol.numbers import natural
from sluicemq.streaming import manifest as wire
from sluicemq.streaming.errors import StreamIntegrityError
from sluicemq.streaming.manifest import ResumePoint

if TYPE_CHECKING:
    from sluicemq.client.sync_conn import Connection

PARTIAL_DIR = ".sluice-partial"
HASH_BLOCK = 1 << 20

Progress = Callable[[int, int | None], None]
"""Called with (bytes done, total bytes or None while unknown) as a transfer advances."""


def file_identity(path: str | os.PathLike[str], destination: str,
                  copy: int = 0) -> tuple[Path, str, int]:
    """(absolute path, stable stream id, size) of copy `copy` of a file sent to
    `destination`."""
    absolute = Path(path).resolve()
    st = absolute.stat()
    sid = wire.file_stream_id(str(absolute), st.st_size, st.st_mtime_ns,
                              destination=destination, copy=copy)
    return absolute, sid, st.st_size


def takes_copy(point: ResumePoint, *, again: bool, resume: bool) -> bool:
    """Is this copy the one to send (new, resumed, or - without `again` - already complete,
    then sent no more)? Else the next copy is asked about. A copy the broker knows but cannot
    continue (abandoned, discarded, or open with `resume` off) is never sent again: the broker
    would take its chunks for duplicates."""
    if point.complete:
        return not again
    return point.state == "unknown" or (point.state == "open" and resume)


def stream_state(client: Connection, destination: str, stream_id: str) -> ResumePoint:
    """The broker's resume answer for one stream id (a query SEND, nothing stored)."""
    answer = client.send_async(destination, b"", {wire.QUERY: stream_id}).result(client.timeout)
    return wire.parse_resume(answer)


def safe_name(name: str, fallback: str) -> str:
    """The producer's file name reduced to one harmless path component."""
    base = name.replace("\\", "/").rsplit("/", 1)[-1].strip()
    if base in ("", ".", "..", PARTIAL_DIR) or "\0" in base:
        return fallback
    return base


class Landing:
    """Where one delivered stream lands on disk: a part file, renamed once verified."""

    def __init__(self, directory: str | os.PathLike[str], stream_id: str, name: str) -> None:
        self.directory = Path(directory)
        self.partial_dir = self.directory / PARTIAL_DIR
        self.part = self.partial_dir / f"{stream_id}.part"
        self.marker = self.partial_dir / f"{stream_id}.done"
        self.final = self.directory / safe_name(name, stream_id)

    def open(self, offset: int) -> tuple[IO[bytes], Any]:
        """Open the part file positioned at `offset`; also return a SHA-256 of the bytes
        before it (None at offset 0). Raises ClientError if those bytes are not on disk."""
        self.partial_dir.mkdir(parents=True, exist_ok=True)
        if offset == 0:
            return open(self.part, "wb"), None
        if not self.part.exists() and self.marker.exists() and self.final.exists():
            os.replace(self.final, self.part)  # finished before; check it again with the tail
        have = self.part.stat().st_size if self.part.exists() else 0
        if have < offset:
            raise ClientError(f"cannot resume {self.final.name}: {self.part} holds {have} "
                              f"bytes but the delivery resumes at offset {offset}")
        f = open(self.part, "r+b")  # noqa: SIM115 - handed to the caller
        f.truncate(offset)
        sha = hashlib.sha256()
        while block := f.read(min(HASH_BLOCK, offset - f.tell())):
            sha.update(block)
        return f, sha

    def commit(self, f: IO[bytes]) -> Path:
        """Make the verified part file durable and give it its final name."""
        f.flush()
        os.fsync(f.fileno())
        f.close()
        self.marker.touch()
        os.replace(self.part, self.final)
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        return self.final

    def settled(self) -> None:
        """The broker has the final ACK: nothing left to recover."""
        self.marker.unlink(missing_ok=True)


def expected_total(size: int | None, headers: Mapping[str, str]) -> int | None:
    """A stream's size if known, else the producer's advisory file size (for progress)."""
    if size is not None:
        return size
    return natural(headers.get(wire.FILE_SIZE))


def send_file(client: Connection, destination: str, path: str | os.PathLike[str], *,
              chunk_size: int = DEFAULT_CHUNK_SIZE, window: int = DEFAULT_WINDOW,
              resume: bool = True, again: bool = False, progress: Progress | None = None,
              headers: Mapping[str, str] | None = None,
              wait_for_consumer: float | None = None) -> StreamWriter:
    """Send one file as a stream; returns the (closed) writer for its id and statistics.

    `writer.already_complete`: this file was sent to `destination` before and nothing was sent
    now (`again=True` sends another copy). `resume=False` never continues an interrupted
    send: the whole file goes out as a new copy."""
    copy = 0
    while True:
        absolute, stream_id, size = file_identity(path, destination, copy)
        point = stream_state(client, destination, stream_id)
        if takes_copy(point, again=again, resume=resume):
            break
        copy += 1
    with open(absolute, "rb") as src, StreamWriter(
            client, destination, name=absolute.name, chunk_size=chunk_size, window=window,
            headers={wire.FILE_SIZE: str(size), **(headers or {})}, stream_id=stream_id,
            resume=point.state != "unknown",
            wait_for_consumer=wait_for_consumer) as writer:
        while not writer.already_complete and (block := src.read(chunk_size)):
            writer.write(block)
            if progress is not None:
                progress(writer.bytes_written, size)
    if progress is not None:
        progress(writer.bytes_written, writer.bytes_written)
    return writer


def save_stream(stream: StreamReader, directory: str | os.PathLike[str],
                progress: Progress | None = None) -> Path:
    """Write one delivered stream into `directory` (resuming a part file if the delivery is
    resumed); returns the final path, which exists only once verified."""
    landing = Landing(directory, stream.id, stream.name)
    with stream:
        f, prefix = landing.open(stream.offset)
        try:
            if prefix is not None:
                stream.seed(prefix, stream.offset)
            done = stream.offset
            while data := stream.read(DEFAULT_CHUNK_SIZE):
                f.write(data)
                f.flush()  # in the kernel before the next read() acknowledges it
                done += len(data)
                if progress is not None:
                    progress(done, expected_total(stream.size, stream.headers))
            if not stream.verified:
                raise StreamIntegrityError(f"stream {stream.id} could not be verified")
            final = landing.commit(f)
        finally:
            f.close()
    if stream.final_ack is None:
        landing.settled()
    else:
        stream.final_ack.when_confirmed(landing.settled)  # a lost ACK keeps the marker
    return final


def receive_file(client: Connection, destination: str, directory: str | os.PathLike[str], *,
                 window: int = DEFAULT_WINDOW, timeout: float | None = None,
                 progress: Progress | None = None) -> Path:
    """Receive the next stream on `destination` into `directory`; returns its path."""
    with StreamSubscription(client, destination, window=window, timeout=timeout,
                            count=1) as streams:
        stream = next(streams, None)
        if stream is None:
            raise ClientError(f"no stream arrived on {destination} within {timeout}s")
        return save_stream(stream, directory, progress)
