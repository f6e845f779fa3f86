"""Minimal client-side STOMP 1.2 wire layer for the load generator.

Kept independent of `sluicemq` on purpose: the generator must measure any broker with the same
code. Header values stay as the raw (escaped) bytes the broker sent, because the only values the
load generator echoes back (`ack`, `message-id`) must go back byte-for-byte, and the numeric ones
it reads (`x-ts`, `receipt-id`) never contain escapable characters.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable
from itertools import count
from typing import TypeVar, cast

T = TypeVar("T")

NUL = b"\x00"
# Bound on how far we look for a header block's end: a broker that sends more than this before
# the blank line is broken, and the bound keeps a missing terminator from costing O(n) per read.
MAX_HEADER_BLOCK = 256 * 1024


class WireError(Exception):
    """The broker sent something this client cannot frame, or an ERROR frame."""


class WireFrame:
    """One received frame: command, raw header block, body (None when bodies are skipped).

    Headers are looked up lazily in the raw block: a load generator reads two or three of them
    per frame, and splitting every block into a dict was the single largest parsing cost.
    """

    __slots__ = ("block", "body", "body_len", "command")

    def __init__(self, command: bytes, block: bytes, body: bytes | None, body_len: int) -> None:
        self.command = command
        self.block = block  # b"\nname:value\nname:value" (empty when there are no headers)
        self.body = body
        self.body_len = body_len

    def get(self, name: bytes) -> bytes | None:
        """The first value of header `name`, raw (still escaped), or None."""
        return header_value(self.block, name)

    def __repr__(self) -> str:
        return f"WireFrame({self.command!r}, {self.block!r}, body_len={self.body_len})"


def header_value(block: bytes, name: bytes) -> bytes | None:
    """First occurrence wins, as STOMP 1.2 requires; a trailing CR (CRLF frames) is dropped."""
    at = block.find(b"\n" + name + b":")
    if at < 0:
        return None
    start = at + len(name) + 2
    stop = block.find(b"\n", start)
    value = block[start:] if stop < 0 else block[start:stop]
    return value[:-1] if value.endswith(b"\r") else value


def encode_frame(
    command: bytes, headers: Iterable[tuple[bytes, bytes]], body: bytes = b""
) -> bytes:
    """Encode a frame; values must already be escaped (the generator only sends plain ones)."""
    head = b"".join(k + b":" + v + b"\n" for k, v in headers)
    return command + b"\n" + head + b"\n" + body + NUL


class FrameParser:
    """Incremental, never-rescanning STOMP frame parser.

    The search for a header block's end resumes where the previous search stopped, so a frame
    trickling in over many reads costs O(frame) in total, not O(frame x reads). With
    `skip_bodies`, bodies that carry a content-length are counted but never buffered: a 1 GiB
    stream then costs the client almost no copying.
    """

    def __init__(self, *, skip_bodies: bool = False) -> None:
        self._buf = bytearray()
        self._scan = 0
        self._pending: tuple[bytes, bytes, int, int] | None = None
        self._skip_bodies = skip_bodies
        self._skip_left = 0
        self._skip_frame: WireFrame | None = None

    def feed(self, data: bytes) -> list[WireFrame]:
        """Consume bytes from the socket, return every frame they complete."""
        out: list[WireFrame] = []
        if self._skip_left:
            data = self._discard(data, out)
            if not data:
                return out
        buf = self._buf
        buf += data
        pos = 0
        while True:
            if self._pending is None:
                n = len(buf)
                while pos < n and buf[pos] in (10, 13):  # heart-beats between frames
                    pos += 1
                if pos >= n:
                    break
                start = max(self._scan, pos)
                limit = pos + MAX_HEADER_BLOCK
                end = buf.find(b"\n\n", start, limit)
                crlf = buf.find(b"\n\r\n", start, end + 1 if end >= 0 else limit)
                if crlf >= 0:
                    end, gap = crlf, 3
                elif end >= 0:
                    gap = 2
                else:
                    if n - pos >= MAX_HEADER_BLOCK:
                        raise WireError("header block too large or unterminated")
                    self._scan = max(pos, n - 2)
                    break
                self._scan = 0
                self._pending = self._parse_head(bytes(buf[pos:end]), end + gap)
            command, block, body_start, length = self._pending
            if length >= 0:
                stop = body_start + length
                if self._skip_bodies and len(buf) <= stop:
                    self._skip_frame = WireFrame(command, block, None, length)
                    self._skip_left = stop + 1 - len(buf)
                    self._pending = None
                    buf.clear()
                    return out
                if len(buf) <= stop:
                    break
                if buf[stop] != 0:
                    raise WireError("frame body not followed by NUL")
            else:
                stop = buf.find(NUL, max(self._scan, body_start))
                if stop < 0:
                    self._scan = len(buf)
                    break
                self._scan = 0
            body = None if self._skip_bodies else bytes(buf[body_start:stop])
            out.append(WireFrame(command, block, body, stop - body_start))
            self._pending = None
            pos = stop + 1
        self._rebase(pos)
        return out

    def _discard(self, data: bytes, out: list[WireFrame]) -> bytes:
        """Swallow the rest of a skipped body; return whatever follows it."""
        if not data:
            return b""
        take = min(len(data), self._skip_left)
        self._skip_left -= take
        if self._skip_left:
            return b""
        if data[take - 1] != 0:
            raise WireError("frame body not followed by NUL")
        assert self._skip_frame is not None
        out.append(self._skip_frame)
        self._skip_frame = None
        return data[take:]

    def _rebase(self, pos: int) -> None:
        """Drop consumed bytes once per feed, shifting the pending offsets with them."""
        if not pos:
            return
        del self._buf[:pos]
        if self._scan:
            self._scan -= pos
        if self._pending is not None:
            command, block, body_start, length = self._pending
            self._pending = (command, block, body_start - pos, length)

    @staticmethod
    def _parse_head(head: bytes, body_start: int) -> tuple[bytes, bytes, int, int]:
        eol = head.find(b"\n")
        if eol < 0:
            command, block = head, b""
        else:
            command, block = head[:eol], head[eol:]
        command = command.rstrip(b"\r")
        raw_len = header_value(block, b"content-length")
        length = int(raw_len) if raw_len else -1
        return command, block, body_start, length


class StompConnection(asyncio.Protocol):
    """One STOMP connection driven by callbacks, so the hot path never wakes a coroutine.

    Frames queued with `queue()` from inside a callback are written together once the current
    read has been processed: a burst of receipts turns into one `writelines`, not one syscall
    per frame.
    """

    def __init__(self, *, skip_bodies: bool = False) -> None:
        self._parser = FrameParser(skip_bodies=skip_bodies)
        self._outbox: list[bytes] = []
        self._writable: asyncio.Future[None] | None = None
        self._receipt_waiters: dict[bytes, asyncio.Future[None]] = {}
        self._request_ids = count()
        self.transport: asyncio.Transport | None = None
        self.connected: asyncio.Future[WireFrame] = asyncio.get_running_loop().create_future()
        self.failed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # A failure nobody awaited is still reported by `guard`; silence asyncio's GC warning.
        self.failed.add_done_callback(lambda f: f.cancelled() or f.exception())
        self.on_message: Callable[[WireFrame], None] | None = None
        self.on_receipt: Callable[[bytes], None] | None = None
        self.closing = False

    @classmethod
    async def open(
        cls,
        host: str,
        port: int,
        *,
        login: str | None = None,
        passcode: str | None = None,
        vhost: str = "localhost",
        skip_bodies: bool = False,
        timeout: float = 10.0,
    ) -> StompConnection:
        """Connect and complete the STOMP 1.2 handshake (no heart-beats: they are noise here)."""
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(
            lambda: cls(skip_bodies=skip_bodies), host, port
        )
        headers = [(b"accept-version", b"1.2"), (b"host", vhost.encode()), (b"heart-beat", b"0,0")]
        if login is not None:
            headers.append((b"login", login.encode()))
        if passcode is not None:
            headers.append((b"passcode", passcode.encode()))
        conn.write(encode_frame(b"CONNECT", headers))
        await conn.guard(conn.connected, timeout)
        return conn

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        try:
            frames = self._parser.feed(data)
        except WireError as exc:
            self._fail(exc)
            return
        for frame in frames:
            command = frame.command
            if command == b"MESSAGE":
                if self.on_message is not None:
                    self.on_message(frame)
            elif command == b"RECEIPT":
                self._receipt(frame.get(b"receipt-id") or b"")
            elif command == b"CONNECTED":
                if not self.connected.done():
                    self.connected.set_result(frame)
            elif command == b"ERROR":
                message = (frame.get(b"message") or b"").decode(errors="replace")
                detail = (frame.body or b"")[:500].decode(errors="replace")
                self._fail(WireError(f"broker ERROR: {message} {detail}".strip()))
        self.flush()

    def _receipt(self, receipt_id: bytes) -> None:
        waiter = self._receipt_waiters.pop(receipt_id, None)
        if waiter is not None:
            if not waiter.done():
                waiter.set_result(None)
        elif self.on_receipt is not None:
            self.on_receipt(receipt_id)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closing:
            self._fail(WireError(f"connection lost: {exc or 'closed by broker'}"))
        self._wake_writer()

    def pause_writing(self) -> None:
        self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        self._wake_writer()

    def _wake_writer(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        self._writable = None

    def _fail(self, exc: Exception) -> None:
        if not self.failed.done():
            self.failed.set_exception(exc)
        if self.transport is not None:
            self.transport.abort()

    def queue(self, frame: bytes) -> None:
        """Buffer a frame until the end of the current read (or an explicit `flush`)."""
        self._outbox.append(frame)

    def flush(self) -> None:
        if self._outbox and self.transport is not None:
            self.transport.writelines(self._outbox)
            self._outbox = []

    def write(self, frame: bytes) -> None:
        assert self.transport is not None
        self.transport.write(frame)

    def writelines(self, frames: list[bytes]) -> None:
        assert self.transport is not None
        self.transport.writelines(frames)

    async def drain(self) -> None:
        """Wait while the transport's write buffer is above its high-water mark."""
        if self._writable is not None:
            await self.guard(self._writable)

    def expect_receipt(self, receipt_id: bytes) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._receipt_waiters[receipt_id] = fut
        return fut

    async def request(self, frame_command: bytes, headers: list[tuple[bytes, bytes]],
                      timeout: float | None = 30.0) -> None:
        """Send a frame with a receipt header and wait for its RECEIPT."""
        rid = b"req-%d" % next(self._request_ids)
        fut = self.expect_receipt(rid)
        self.write(encode_frame(frame_command, [*headers, (b"receipt", rid)]))
        await self.guard(fut, timeout)

    async def guard(self, fut: asyncio.Future[T], timeout: float | None = None) -> T:
        """Await `fut`, failing fast if the connection errors first."""
        done, _ = await asyncio.wait({fut, self.failed}, timeout=timeout,
                                     return_when=asyncio.FIRST_COMPLETED)
        if fut in done:
            return fut.result()
        if self.failed in done:
            self.failed.result()
        raise TimeoutError("timed out waiting for the broker")

    def abort(self) -> None:
        """Drop the connection without a goodbye (after a failed run)."""
        self.closing = True
        if self.transport is not None:
            self.transport.abort()

    async def close(self, timeout: float = 5.0) -> None:
        """DISCONNECT with a receipt so everything sent before is known to be processed."""
        if self.transport is None or self.transport.is_closing():
            return
        self.closing = True  # the broker may hang up right after the RECEIPT
        with contextlib.suppress(WireError, TimeoutError):
            await self.request(b"DISCONNECT", [], timeout)
        self.transport.close()
