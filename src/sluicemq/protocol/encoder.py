"""Sans-IO STOMP encoding: frames -> bytes, for every version (the parser is ``codec.py``).

Apart from the parser so that each stays short; callers import both from ``codec``.
"""

from __future__ import annotations

from collections.abc import Iterable

from sluicemq.protocol.frames import Frame
from sluicemq.protocol.headers import UNESCAPED_COMMANDS, VERSIONS, escape


def encode_head(frame: Frame, version: str = "1.2", body_length: int | None = None) -> bytes:
    """Encode everything before the body: command, escaped headers, content-length, blank line.

    Lets a transport write ``head``, the body and ``b"\\0"`` separately so a large body is never
    copied. content-length is always computed from the body: a stale value in ``frame.headers``
    (say, from a forwarded SEND) is ignored; ``body_length`` gives it for a body written in
    pieces (``frame.body`` empty) that is never joined. Raises ValueError for a header the
    version cannot represent (a newline, a colon in a key, or a trailing CR in an unescaped
    header; a NUL anywhere), because sending it would corrupt the peer's view of the stream.
    """
    command = frame.command
    parts = [command]
    append = parts.append
    if version == "1.2" and command not in UNESCAPED_COMMANDS:
        lines = header_lines_12(frame.headers)
        if lines:
            append(lines)
    elif version == "1.1" and command not in UNESCAPED_COMMANDS:
        for key, value in frame.headers.items():
            if key != "content-length":
                if value[-1:] == "\r":
                    raise ValueError(f"STOMP 1.1 cannot carry a trailing CR in header {key!r}")
                append(f"{escape(key, version)}:{escape(value, version)}")
    else:
        if version not in VERSIONS:
            raise ValueError(f"unknown STOMP version {version!r}")
        for key, value in frame.headers.items():
            if key != "content-length":
                _check_raw(key, value)
                append(f"{key}:{value}")
    size = len(frame.body) if body_length is None else body_length
    if size:
        append(f"content-length:{size}")
    append("\n")
    head = "\n".join(parts)
    if "\0" in head:
        raise ValueError("a NUL in a header would end the frame early for NUL-delimited readers")
    return head.encode()


def header_lines_12(headers: dict[str, str]) -> str:
    """The ``key:value`` lines of ``headers`` as STOMP 1.2 sends them (escaped, joined by
    newlines, without content-length, which belongs to the body): for a sender that writes
    the rest of a head itself, with values it knows need no escaping. ValueError for a NUL,
    which no escape can carry."""
    out: list[str] = []
    append = out.append
    for key, value in headers.items():
        if key != "content-length":
            wire_key = _WIRE_KEYS_12.get(key)
            if wire_key is None:
                wire_key = _wire_key_12(key)
            if "\\" in value or ":" in value or "\n" in value or "\r" in value:
                value = escape(value, "1.2")
            append(f"{wire_key}:{value}")
    lines = "\n".join(out)
    if "\0" in lines:
        raise ValueError("a NUL in a header would end the frame early for NUL-delimited readers")
    return lines


_WIRE_KEYS_12: dict[str, str] = {}
_WIRE_KEYS_MAX = 4096


def _wire_key_12(key: str) -> str:
    """Escape a header name, remembering it: a broker sends the same few names all day long.

    The memo is capped so that a peer inventing new header names cannot grow it without bound.
    """
    wire_key = escape(key, "1.2")
    if len(_WIRE_KEYS_12) < _WIRE_KEYS_MAX:
        _WIRE_KEYS_12[key] = wire_key
    return wire_key


def encode_head_lenient(frame: Frame, version: str = "1.2") -> bytes:
    """``encode_head``, leaving out a header ``version`` cannot carry (a MESSAGE relays the
    producer's headers to a peer of any version); ``frame.headers`` is replaced then."""
    try:
        return encode_head(frame, version)
    except ValueError:
        frame.headers = {k: v for k, v in frame.headers.items()
                         if _representable(k, v, version)}
        return encode_head(frame, version)


def _representable(key: str, value: str, version: str) -> bool:
    try:
        encode_head(Frame("MESSAGE", {key: value}), version)
    except ValueError:
        return False
    return True


def encode_frame(frame: Frame, version: str = "1.2") -> bytes:
    """Encode one frame for a peer speaking ``version`` (see encode_head for header rules)."""
    return b"".join((encode_head(frame, version), frame.body, b"\0"))


def encode_frames(frames: Iterable[Frame], version: str = "1.2") -> bytes:
    """Encode several frames into one buffer, for a single write."""
    out: list[bytes | memoryview] = []
    for frame in frames:
        out += (encode_head(frame, version), frame.body, b"\0")
    return b"".join(out)


def _check_raw(key: str, value: str) -> None:
    """Refuse a header that would corrupt an unescaped (1.0 or handshake) frame."""
    if "\n" in key or ":" in key or "\n" in value or value[-1:] == "\r":
        raise ValueError(f"header {key!r} cannot be sent unescaped (newline, colon or CR)")
