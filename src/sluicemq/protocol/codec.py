"""Sans-IO STOMP framing: an incremental parser (bytes -> frames); the encoder (frames -> bytes)
is ``encoder.py``, imported from here by its callers.

This is the broker's hottest path, so the parser is written for the common case: a whole frame,
with a content-length, already in the buffer. Everything else (split reads, CRLF line endings,
NUL-terminated bodies, heart-beat EOLs) is handled without rescanning bytes already examined:
the parser remembers where its last search for the end of the headers or for a body's NUL
stopped, and a body announced by content-length is only length-checked until it has arrived.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Final, NoReturn

from sluicemq.errors import ProtocolError
from sluicemq.protocol.encoder import (
    encode_frame,
    encode_frames,
    encode_head,
    encode_head_lenient,
    header_lines_12,
)
from sluicemq.protocol.frames import ALL_COMMANDS, Frame
from sluicemq.protocol.headers import UNESCAPED_COMMANDS, VERSIONS, unescape

__all__ = ["MAX_COMMAND_LINE", "FrameParser", "encode_frame", "encode_frames", "encode_head",
           "encode_head_lenient",
           "header_lines_12"]

MAX_COMMAND_LINE = 64
"""Longest command line accepted (real commands have at most 11 letters): rejects garbage early."""

_COMMANDS: Final = ALL_COMMANDS
"""Known commands pass the command line's check in one set look-up: compiled, ``isalpha``
and ``isascii`` are two generic method calls (~1.6k instructions a frame)."""
_EOL = (10, 13)
_EOLS = re.compile(rb"[\r\n]*")
_SMALL_BODY = 2048
_JOIN_TAIL = 2 * _SMALL_BODY
"""A partial frame held at most this long is joined to the next read (copying it once more)
so that the frames after it are parsed from bytes; a longer one is added to in place."""
_NO_LIMIT = 1 << 62  # frames per feed when the caller sets no limit
_GATHER_BODY = 64 << 10
"""A body at least this large that has not fully arrived is gathered piece by piece (the reads
kept as they came, joined once) instead of growing the stream buffer: one copy, not three."""


class _PendingBody:
    """A frame whose headers are parsed but whose body has not fully arrived yet.

    Offsets are relative to the frame's first byte, which sits at the start of the buffer while
    the frame is pending, so headers are parsed once however many reads the body takes.
    """

    __slots__ = ("body_end", "body_start", "command", "got", "headers", "need", "parts", "scan",
                 "target", "whole")

    def __init__(
        self, command: str, headers: dict[str, str], body_start: int, body_end: int, scan: int
    ) -> None:
        self.command = command
        self.headers = headers
        self.body_start = body_start
        self.body_end = body_end  # -1: no content-length, the body ends at the first NUL
        self.scan = scan  # where the search for that NUL resumes
        # Gathering a large body: the pieces so far (or a kept buffer filled in place, see
        # FrameParser's body_buffers), body bytes still missing, bytes held.
        self.parts: list[bytes | memoryview] | None = None
        self.target: memoryview | None = None
        self.whole: bytes | None = None  # the bytes ``target`` fills in place, if any
        self.need = 0
        self.got = 0


class FrameParser:
    """Turns a STOMP byte stream, cut and coalesced any way, into complete frames.

    Lines may end in CRLF whatever the version (1.0 and 1.1 clients send it too), so a raw CR
    at the end of a header value is read as a line ending. A raw colon in a value is kept
    (split at the first colon), as 1.0-era clients send ids like ``ID:host-1:2`` unescaped.
    The frame size limit covers the whole frame, command line through NUL.

    After a ProtocolError the parser refuses further input: the stream position is lost and the
    connection must close. Frames that preceded the bad bytes in the same ``feed`` call are
    dropped with it; none of them can have been acknowledged yet, so nothing is silently lost.
    """

    def __init__(
        self,
        *,
        version: str = "1.2",
        max_frame_bytes: int = 64 << 20,
        max_headers: int = 1000,
        max_header_line: int = 8192,
        max_header_bytes: int = 1 << 20,
        body_buffers: Callable[[int], tuple[bytes, memoryview] | memoryview | None]
        | None = None,
    ) -> None:
        self.version = version
        self.max_frame_bytes = max_frame_bytes
        self.max_headers = max_headers
        self.max_header_line = max_header_line
        # The whole header section (command line through the blank line). Why apart from
        # max_headers x max_header_line (8 MB): headers are parsed, held and stored as Python
        # strings in one piece, so megabytes of them cost the event loop and RAM far more than
        # a body of that size; refusing them as they arrive costs nothing.
        self.max_header_bytes = max_header_bytes
        # Where a large body is gathered: a buffer of at least the asked size (None: join the
        # pieces into fresh bytes). The frame's body is then a memoryview of that buffer,
        # which the caller's pool may hand out again once nothing views it (``buffers.py``);
        # or (bytes, a writable view of them): the body is read into those bytes in place and
        # the frame's body is the bytes (``buffers.fresh_bytes``), the view dropped with it.
        self._body_buffers = body_buffers
        self._buf = bytearray()
        self._scan = 0  # where the search for the end of the headers resumes (frame-relative)
        self._pending: _PendingBody | None = None
        self._failed: str | None = None

    @property
    def version(self) -> str:
        """Negotiated STOMP version; selects header unescaping for every frame but the handshake."""
        return self._version

    @version.setter
    def version(self, value: str) -> None:
        if value not in VERSIONS:
            raise ValueError(f"unknown STOMP version {value!r}")
        self._version = value
        self._escaped = value != "1.0"

    @property
    def buffered(self) -> int:
        """Bytes held for an incomplete frame, for the connection's memory accounting."""
        pend = self._pending
        return len(self._buf) + (pend.got if pend is not None else 0)

    def body_room(self) -> memoryview | None:
        """Where the next bytes of a large body being gathered into a kept buffer go: a
        transport that reads into buffers (``asyncio.BufferedProtocol``) reads them there and
        reports them with ``filled``, saving a copy of each byte. None when no such body is
        due (then input goes through ``feed``; the NUL after a body always does)."""
        pend = self._pending
        if pend is None or pend.target is None or not pend.need:
            return None
        return pend.target[pend.got:pend.got + pend.need]

    def filled(self, nbytes: int) -> None:
        """``nbytes`` were read into the view ``body_room`` gave."""
        pend = self._pending
        assert pend is not None and pend.target is not None and 0 <= nbytes <= pend.need
        pend.got += nbytes
        pend.need -= nbytes

    def feed(self, data: bytes | bytearray | memoryview, max_frames: int = 0) -> list[Frame]:
        """Consume the next chunk of the stream and return the frames it completed, in order.

        ``max_frames`` (0: no limit) stops after that many frames and keeps the rest of the
        input buffered for the next call (``feed(b"")`` parses on): a caller can spread the
        parsing of a large read over several loop turns.
        """
        if self._failed is not None:
            raise ProtocolError(f"stream already rejected: {self._failed}")
        frames: list[Frame] = []
        pend = self._pending
        try:
            if pend is not None and pend.parts is not None:
                rest = self._gather(pend, data, frames)
                if not rest:
                    return frames
                data = rest
            buf = self._buf
            if type(data) is bytes and len(buf) <= _JOIN_TAIL:
                # parse immutable bytes in place (bodies are sliced out with one copy): the
                # caller's, or a frame's tail left by the last read joined to them
                src: bytes | bytearray = b"".join((buf, data)) if buf else data
                buf.clear()
            else:
                buf += data
                src = buf
            used = self._parse(src, frames, max_frames or _NO_LIMIT)
        except ProtocolError as exc:
            self._failed = str(exc)
            self._buf = bytearray()
            self._pending = None
            raise
        if src is buf:
            del buf[:used]  # O(1) in CPython: bytearray advances its start pointer
        elif used < len(src):
            buf += memoryview(src)[used:]
        return frames

    def _parse(self, b: bytes | bytearray, frames: list[Frame], max_frames: int) -> int:
        """Append every complete frame of ``b``, at most ``max_frames``, to ``frames``;
        return how many bytes they used."""
        n = len(b)
        p = 0
        limit = self.max_frame_bytes
        head_fast = min(self.max_header_bytes, limit - 1)  # a head this long passes both limits
        if self._pending is not None:
            p = self._finish_pending(b, n, frames)
            if not p:
                return 0
        while True:
            if p < n and b[p] in _EOL:
                # Heart-beats and the optional EOLs after a NUL (the pattern always matches).
                eols = _EOLS.match(b, p)
                p = eols.end() if eols else p
            if p == n or len(frames) >= max_frames:
                return p
            start = p + self._scan
            i = b.find(b"\n\n", start)
            text = None
            if p <= i <= p + head_fast:  # the common head: LF lines, within every limit
                try:
                    text = b[p:i].decode()
                except UnicodeDecodeError:
                    text = None  # the careful path below says why
                else:  # a CR LF blank line can end the head before this LF LF only after a CR
                    if "\r" in text and b.find(b"\n\r\n", start, i + 2) >= 0:
                        text = None
            if text is not None:
                hdr_end = i
                body_start = i + 2
            elif i < 0:
                hdr_end = b.find(b"\n\r\n", start)
                if hdr_end < 0:
                    self._check_partial_headers(b, p, n)
                    return p
                body_start = hdr_end + 3
            else:
                hdr_end = b.find(b"\n\r\n", start, i + 2)
                if hdr_end < 0:
                    hdr_end = i
                    body_start = i + 2
                else:
                    body_start = hdr_end + 3
            self._scan = 0
            if hdr_end - p >= limit:
                raise ProtocolError(f"frame headers exceed max_frame_bytes={limit}")
            if hdr_end - p > self.max_header_bytes:
                raise ProtocolError(
                    f"frame headers exceed max_header_bytes={self.max_header_bytes}")
            command, headers = self._parse_head(b, p, hdr_end, text)

            length = headers.get("content-length")
            if length is None:
                nul = b.find(b"\0", body_start, p + limit)
                if nul < 0:
                    if n - p >= limit:
                        raise ProtocolError(f"frame exceeds max_frame_bytes={limit}")
                    self._pending = _PendingBody(command, headers, body_start - p, -1, n - p)
                    return p
                body_end = nul
            else:
                if length.isdigit() and length.isascii() and len(length) <= 18:
                    body_end = body_start + int(length)
                else:
                    body_end = body_start + _content_length(length)
                if body_end + 1 - p > limit:
                    raise ProtocolError(
                        f"content-length {length.strip()} exceeds max_frame_bytes={limit}"
                    )
                if body_end >= n:
                    pend = _PendingBody(command, headers, body_start - p, body_end - p, 0)
                    self._pending = pend
                    if body_end - body_start < _GATHER_BODY:
                        return p
                    size = body_end - body_start
                    given = self._body_buffers(size) if self._body_buffers else None
                    kept: memoryview | None = None
                    if isinstance(given, tuple):
                        pend.whole, kept = given
                    else:
                        kept = given
                    with memoryview(b) as view:  # b may be our buffer: copy what is here
                        if kept is None:
                            pend.parts = [view[body_start:n].tobytes()]
                        else:
                            pend.parts = []
                            pend.target = kept[:size]  # held: the buffer is in use
                            pend.target[:n - body_start] = view[body_start:n]
                    pend.got = n - body_start
                    pend.need = body_end - n
                    return n
                if b[body_end]:
                    raise ProtocolError("frame body not followed by NUL where content-length ends")
            if type(b) is bytes:
                body = b[body_start:body_end]
            elif body_end - body_start <= _SMALL_BODY:  # as _slice does, without the call
                body = bytes(b[body_start:body_end])
            else:
                body = _slice(b, body_start, body_end)
            frames.append(Frame(command, headers, body))
            p = body_end + 1

    def _gather(self, pend: _PendingBody, data: bytes | bytearray | memoryview,
                frames: list[Frame]) -> memoryview | None:
        """Add ``data`` to a large body being gathered; once it is whole, emit its frame and
        return what followed its NUL (None while more is needed). Each body byte is copied
        once: into the kept buffer, or by the final join (immutable reads are kept as they
        are until then)."""
        need = pend.need
        n = len(data)
        parts = pend.parts
        target = pend.target
        assert parts is not None
        if n <= need:
            if target is not None:
                target[pend.got:pend.got + n] = data
            else:
                parts.append(data if type(data) is bytes else bytes(data))
            pend.need = need - n
            pend.got += n
            return None
        if data[need]:
            raise ProtocolError("frame body not followed by NUL where content-length ends")
        view = memoryview(data)
        if target is not None:
            target[pend.got:] = view[:need]
            body: bytes | memoryview = target if pend.whole is None else pend.whole
        else:
            parts.append(view[:need])
            body = b"".join(parts)
        frames.append(Frame(pend.command, pend.headers, body))
        self._pending = None
        return view[need + 1:]

    def _finish_pending(self, b: bytes | bytearray, n: int, frames: list[Frame]) -> int:
        """Complete the pending frame (which starts at offset 0) if its body has arrived.

        Returns the offset just past its NUL, or 0 while more bytes are needed.
        """
        pend = self._pending
        assert pend is not None
        limit = self.max_frame_bytes
        end = pend.body_end
        if end >= 0:
            if end >= n:
                return 0
            if b[end]:
                raise ProtocolError("frame body not followed by NUL where content-length ends")
        else:
            end = b.find(b"\0", pend.scan, limit)
            if end < 0:
                if n >= limit:
                    raise ProtocolError(f"frame exceeds max_frame_bytes={limit}")
                pend.scan = n
                return 0
        frames.append(Frame(pend.command, pend.headers, _slice(b, pend.body_start, end)))
        self._pending = None
        return end + 1

    def _parse_head(self, b: bytes | bytearray, p: int, end: int,
                    text: str | None = None) -> tuple[str, dict[str, str]]:
        """Decode the command line and header lines occupying ``b[p:end]`` (``text``: already
        decoded)."""
        if text is None:
            try:
                text = b[p:end].decode()
            except UnicodeDecodeError as exc:
                first_line = b[p:end].split(b"\n", 1)[0].rstrip(b"\r").decode("latin-1")
                if not (first_line.isalpha() and first_line.isascii()):
                    _reject_command(first_line)
                raise ProtocolError(f"frame headers are not valid UTF-8: {exc.reason}") from None
        lines = raw_lines = text.split("\n")
        if "\r" in text:
            lines = [line[:-1] if line[-1:] == "\r" else line for line in lines]
        command = lines[0]
        if command not in _COMMANDS and (not (command.isalpha() and command.isascii())
                                         or len(command) > MAX_COMMAND_LINE):
            _reject_command(command)
        if len(lines) > self.max_headers + 1:
            raise ProtocolError(f"frame has more than max_headers={self.max_headers} headers")
        if end - p > self.max_header_line:
            ascii_text = len(text) == end - p  # then the str lines are the byte lines
            longest = max(map(len, raw_lines if ascii_text else b[p:end].split(b"\n")))
            if longest > self.max_header_line:
                raise ProtocolError(
                    f"header line of {longest} bytes exceeds max_header_line={self.max_header_line}"
                )
        if "\0" in text:
            raise ProtocolError("NUL octet inside frame headers (blank line missing?)")
        headers: dict[str, str] = {}
        if self._escaped and "\\" in text and command not in UNESCAPED_COMMANDS:
            version = self._version
            for line in lines[1:]:
                key, colon, value = line.partition(":")
                if not colon:
                    _reject_header_line(line)
                if "\\" in key:
                    key = unescape(key, version)
                if key not in headers:
                    headers[key] = unescape(value, version) if "\\" in value else value
        else:
            for line in lines[1:]:
                key, colon, value = line.partition(":")
                if not colon:
                    _reject_header_line(line)
                if key not in headers:
                    headers[key] = value
        return command, headers

    def _check_partial_headers(self, b: bytes | bytearray, p: int, n: int) -> None:
        """Enforce limits on a frame whose headers have not ended yet; remember the scan point."""
        size = n - p
        if size >= self.max_frame_bytes:
            raise ProtocolError(f"frame headers exceed max_frame_bytes={self.max_frame_bytes}")
        if size > self.max_header_bytes + 2:  # + 2: the blank line's CR LF may follow
            raise ProtocolError(f"frame headers exceed max_header_bytes={self.max_header_bytes}")
        # Check the command line, even half-received, so garbage (TLS, HTTP) fails on arrival.
        first_eol = b.find(b"\n", p, p + MAX_COMMAND_LINE + 1)
        if first_eol < 0 and size > MAX_COMMAND_LINE:
            raise ProtocolError(f"command line longer than {MAX_COMMAND_LINE} bytes")
        command = b[p : n if first_eol < 0 else first_eol].decode("latin-1")
        if command[-1:] == "\r":
            command = command[:-1]
        if command and not (command.isalpha() and command.isascii()):
            _reject_command(command)
        if b.find(b"\0", p + self._scan, n) >= 0:
            raise ProtocolError("NUL octet inside frame headers (blank line missing?)")
        last_eol = b.rfind(b"\n", p, n)
        line_len = n - (last_eol + 1 if last_eol >= 0 else p)
        if line_len > self.max_header_line:
            raise ProtocolError(f"header line exceeds max_header_line={self.max_header_line}")
        self._scan = max(0, size - 2)


def _reject_command(command: str) -> NoReturn:
    """Commands are ASCII letters; anything else means garbage or a non-STOMP client (e.g. TLS)."""
    if not command:
        raise ProtocolError("empty command line")
    if len(command) > MAX_COMMAND_LINE:
        raise ProtocolError(f"command line longer than {MAX_COMMAND_LINE} bytes")
    raise ProtocolError(f"invalid command line {command!r}")


def _reject_header_line(line: str) -> NoReturn:
    raise ProtocolError(f"header line without ':': {line[:80]!r}")


def _content_length(value: str) -> int:
    """Parse a content-length header; tolerate surrounding spaces as ActiveMQ does."""
    digits = value.strip()
    if not (digits.isascii() and digits.isdigit()) or len(digits) > 18:
        raise ProtocolError(f"invalid content-length {value[:40]!r}")
    return int(digits)


def _slice(b: bytes | bytearray, start: int, end: int) -> bytes:
    """Copy a body out of the stream once; a bytearray slice would copy twice, which only
    small bodies can afford (there it is cheaper than setting up a memoryview)."""
    if type(b) is bytes or end - start <= _SMALL_BODY:
        return bytes(b[start:end])
    with memoryview(b) as view:
        return view[start:end].tobytes()
