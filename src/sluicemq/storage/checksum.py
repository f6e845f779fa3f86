"""CRC-32 (zlib's polynomial, so the journal's format does not depend on which is used).

Why its own module: every journal record carries two CRC-32s, computed on each append and
checked on each read, and the standard library's ``zlib.crc32`` runs at ~3 GB/s here while
zlib-ng's (carry-less multiply) runs at ~40 GB/s. zlib-ng is a dependency; the fallback keeps
an install without its wheel working, bit for bit the same.
"""

from __future__ import annotations

try:
    from zlib_ng.zlib_ng import crc32
except ImportError:  # pragma: no cover - the wheel is a dependency; this keeps odd installs working
    from zlib import crc32

__all__ = ["crc32"]
