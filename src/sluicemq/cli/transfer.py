"""`sluice send` and `sluice receive`: files of any size through a queue, resumably.

Both show a progress bar (bytes, rate, ETA) on stderr and print one line per file on stdout.
Rerunning either after an interruption continues where it stopped: `send` because a file's
stream id is derived from the file and its destination and the broker is asked what it already
stored (a file it holds complete is skipped, and said so; `--again` sends another copy);
`receive` because the broker resumes the delivery at the first chunk not acknowledged and
the partial file is kept under DIR/.sluice-partial/.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from sluicemq.cli.messaging import connection_options, destination, open_client
from sluicemq.client.files import Progress as ProgressCallback
from sluicemq.client.files import save_stream
from sluicemq.client.streams import StreamWriter
from sluicemq.errors import ClientError

_SIZE_RE = re.compile(r"\s*(\d+)\s*([a-z]*)\s*", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "kb": 10**3, "m": 1 << 20,
          "mib": 1 << 20, "mb": 10**6, "g": 1 << 30, "gib": 1 << 30, "gb": 10**9}


def parse_size(text: str) -> int:
    """`1MiB`, `64k`, `500kB`, `4096`: binary units unless spelled in decimal (kB, MB, GB)."""
    match = _SIZE_RE.fullmatch(text)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise ValueError(f"not a size: {text!r} (try 1MiB, 64KiB, 4096)")
    return int(match.group(1)) * _UNITS[unit]


class SizeType(click.ParamType):
    name = "SIZE"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        try:
            size = parse_size(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
        if size < 1:
            self.fail("must be at least 1 byte", param, ctx)
        return size


class Throttle:
    """Keeps a transfer at or under `rate` bytes/s by sleeping between blocks."""

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self._start: tuple[float, int] | None = None

    def __call__(self, done: int) -> None:
        now = time.monotonic()
        if self._start is None:
            self._start = (now, done)
            return
        t0, d0 = self._start
        ahead = (done - d0) / self.rate - (now - t0)
        if ahead > 0:
            time.sleep(ahead)


@contextmanager
def progress_bar(enabled: bool) -> Iterator[Progress | None]:
    if not enabled:
        yield None
        return
    bar = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                   TransferSpeedColumn(), TimeRemainingColumn(),
                   console=Console(stderr=True), transient=False)
    with bar:
        yield bar


def tracker(bar: Progress | None, label: str, limit: int | None) -> ProgressCallback:
    """A progress callback feeding one bar task (and the throttle, if any)."""
    task = bar.add_task(label, total=None) if bar is not None else None
    throttle = Throttle(limit) if limit else None

    def update(done: int, total: int | None) -> None:
        if bar is not None and task is not None:
            bar.update(task, completed=done, total=total)
        if throttle is not None:
            throttle(done)

    return update


def _common(func: Any) -> Any:
    for decorate in reversed([
        connection_options,
        click.option("--window", type=click.IntRange(min=1), default=8, show_default=True,
                     help="Chunks in flight (unconfirmed / unacknowledged)."),
        click.option("--limit-rate", type=SizeType(), default=None, metavar="SIZE",
                     help="Cap the transfer rate at SIZE bytes per second."),
        click.option("--quiet", "-q", is_flag=True, help="No progress bar."),
    ]):
        func = decorate(func)
    return func


def outcome(path: Path, dest: str, writer: StreamWriter) -> str:
    """The line `send` prints for one file: what went over the wire, never more."""
    if writer.already_complete:
        return (f"skipped {path}: already sent to {dest} as stream {writer.stream_id} "
                "(complete on the broker); --again sends it again")
    sent = writer.bytes_written - writer.resumed_at
    note = (f", {sent} sent now, resumed at byte {writer.resumed_at}" if writer.resumed_at
            else "")
    if writer.duplicates:
        note += f", {writer.duplicates} chunk(s) the broker already had"
    return (f"sent {path} ({writer.bytes_written} bytes{note}) to {dest} as stream "
            f"{writer.stream_id}")


@click.command()
@_common
@click.argument("files", nargs=-1, required=True,
                type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--to", "to", required=True, metavar="DEST",
              help="Destination: /queue/NAME, /topic/NAME, or NAME for a queue.")
@click.option("--chunk-size", type=SizeType(), default="1MiB", show_default=True,
              help="Bytes per chunk (KiB/MiB/GiB, or kB/MB/GB).")
@click.option("--resume/--no-resume", default=True, show_default=True,
              help="Continue an interrupted send of the same (unchanged) file; with "
                   "--no-resume it is sent whole as a new copy.")
@click.option("--again", is_flag=True,
              help="Send a file even if it was sent to DEST before (as another copy); "
                   "without it such a file is skipped.")
@click.option("--wait-for-consumer", type=float, default=None, metavar="S",
              help="First wait up to S seconds for a consumer on DEST (exit 1 if none).")
def send(url: str, user: str | None, password: str | None, window: int,
         limit_rate: int | None, quiet: bool, files: tuple[Path, ...], to: str,
         chunk_size: int, resume: bool, again: bool, wait_for_consumer: float | None) -> None:
    """Send FILE... as streams; each is complete once this prints its line."""
    dest = destination(to)
    client = open_client(url, user, password)
    try:
        with progress_bar(not quiet) as bar:
            for path in files:
                writer = client.send_file(
                    dest, path, chunk_size=chunk_size, window=window, resume=resume,
                    again=again, progress=tracker(bar, path.name, limit_rate),
                    wait_for_consumer=wait_for_consumer)
                if writer.already_complete and bar is not None:
                    # Nothing went over the wire: no "0/0 bytes" bar beside the skipped line.
                    bar.remove_task(bar.task_ids[-1])
                click.echo(outcome(path, dest, writer))
    except ClientError as exc:
        raise click.ClickException(f"send to {dest} failed: {exc}") from None
    except KeyboardInterrupt:
        sys.exit(130)
    finally:
        client.disconnect()


@click.command()
@_common
@click.option("--from", "source", required=True, metavar="DEST",
              help="Destination: /queue/NAME, /topic/NAME, or NAME for a queue.")
@click.option("--dir", "directory", required=True,
              type=click.Path(file_okay=False, path_type=Path),
              help="Where files land (created if missing); partial files are kept in "
                   "DIR/.sluice-partial/ until verified.")
@click.option("--count", "-n", type=click.IntRange(min=1), default=None,
              help="Stop after N files (default: until --timeout or Ctrl-C).")
@click.option("--timeout", type=float, default=None, metavar="S",
              help="Give up after S seconds without a chunk (exit 1 if --count not reached).")
def receive(url: str, user: str | None, password: str | None, window: int,
            limit_rate: int | None, quiet: bool, source: str, directory: Path,
            count: int | None, timeout: float | None) -> None:
    """Receive streams into files, each verified (size, SHA-256) before it appears."""
    dest = destination(source)
    directory.mkdir(parents=True, exist_ok=True)
    client = open_client(url, user, password)
    received = 0
    try:
        with progress_bar(not quiet) as bar, client.streams(dest, window=window,
                                                          timeout=timeout,
                                                          count=count) as streams:
            for stream in streams:
                label = stream.name or stream.id
                path = save_stream(stream, directory, tracker(bar, label, limit_rate))
                received += 1
                click.echo(str(path))
                if count is not None and received >= count:
                    break
    except ClientError as exc:
        raise click.ClickException(f"receive from {dest} failed: {exc}") from None
    except KeyboardInterrupt:
        sys.exit(130)
    finally:
        client.disconnect()
    if count is not None and received < count:
        raise click.ClickException(f"timed out: received {received} of {count} files")


COMMANDS = [send, receive]
