"""STOMP header escaping: the only way a header may carry a newline, colon or backslash.

STOMP 1.0 has no escaping at all. 1.1 defines ``\\\\``, ``\\n`` and ``\\c`` (colon); 1.2 adds
``\\r`` so that a value can end in a carriage return despite CRLF line endings. Any other
backslash sequence is a fatal protocol error in 1.1+. CONNECT, STOMP and CONNECTED frames are
never escaped, whatever the version, so that a 1.0 peer can read the handshake.
"""

from __future__ import annotations

from sluicemq.errors import ProtocolError

VERSIONS = ("1.0", "1.1", "1.2")

UNESCAPED_COMMANDS = frozenset({"CONNECT", "STOMP", "CONNECTED"})
"""Commands whose headers travel raw in every version (handshake backward compatibility)."""


def escape(value: str, version: str) -> str:
    """Return ``value`` as it must appear on the wire in a header of a ``version`` frame."""
    if version == "1.0":
        return value
    # Membership tests are far cheaper than four replace() calls, and most values need none.
    if "\\" in value:
        value = value.replace("\\", "\\\\")
    if "\n" in value:
        value = value.replace("\n", "\\n")
    if ":" in value:
        value = value.replace(":", "\\c")
    if "\r" in value and version == "1.2":
        value = value.replace("\r", "\\r")
    return value


def unescape(value: str, version: str) -> str:
    """Decode a header key or value read from the wire; undefined escapes raise ProtocolError."""
    if version == "1.0" or "\\" not in value:
        return value
    # Splitting on escaped backslashes first leaves each remaining backslash starting its own
    # sequence, so plain replace() calls decode the rest and any backslash left over is invalid.
    chunks = value.split("\\\\")
    for i, chunk in enumerate(chunks):
        if "\\" in chunk:
            chunk = chunk.replace("\\n", "\n").replace("\\c", ":")
            if version == "1.2":
                chunk = chunk.replace("\\r", "\r")
            if "\\" in chunk:
                _undefined_escape(chunk, version)
            chunks[i] = chunk
    return "\\".join(chunks)


def _undefined_escape(chunk: str, version: str) -> None:
    """Name the offending sequence: the peer's developer needs it to find the encoding bug."""
    at = chunk.index("\\")
    shown = repr(chunk[at : at + 2]) if at + 1 < len(chunk) else "a trailing backslash"
    raise ProtocolError(f"undefined escape sequence {shown} in a STOMP {version} header")
