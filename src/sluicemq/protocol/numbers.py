"""Non-negative integers read from text someone else wrote: headers, query strings, files.

Why not ``text.isdigit()`` and ``int(text)``: ``isdigit`` is true of digits ``int`` does not
take (superscripts such as ``"²"``) and of other scripts' digits it does, and ``int`` of more
than 4,300 digits raises ``ValueError`` (CPython's limit on decimal conversion) - either one
an exception where the caller meant to answer "not a number". ``natural`` takes only ASCII
digits, at most ``digits`` of them, and says None otherwise, so each caller gives its own
clear error (an ERROR frame, an HTTP 400, a client exception).
"""

from __future__ import annotations

MAX_DIGITS = 19  # every value of 0 .. 2**63 - 1 (ids, offsets, sizes, times in ms)


def natural(text: str | None, digits: int = MAX_DIGITS) -> int | None:
    """``text`` as an int when it is 1 to ``digits`` ASCII digits, else None."""
    if text is None or not 0 < len(text) <= digits or not text.isascii() or not text.isdigit():
        return None
    return int(text)


def shown(text: str, most: int = 50) -> str:
    """``text`` for an error message: its repr, cut to ``most`` characters (a header may be
    megabytes long)."""
    return repr(text) if len(text) <= most else f"{text[:most]!r}... ({len(text)} characters)"
