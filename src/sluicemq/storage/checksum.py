"""CRC-32 (zlib's polynomial, so the journal's format does not depend on which is used).

Why its own module: every journal record carries two CRC-32s, computed on each append and
checked on each read, and the standard library's ``zlib.crc32`` runs at ~3 GB/s here while
zlib-ng's (carry-less multiply) runs at ~40 GB/s. zlib-ng is a dependency; the fallback keeps
an install without its wheel working, bit for bit the same.

``crc32_combine`` (zlib-ng's, None without it) gives the CRC of ``a + b`` from those of ``a``
and ``b``: a large record's body can then be checksummed before the journal knows which
segment (and so which seed) it goes to - on the loop thread as it is appended, off the
journal writer's path (``Journal.append``).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

try:
    from zlib_ng import zlib_ng as _zlib_ng
    from zlib_ng.zlib_ng import crc32

    _LIBRARY: str | None = _zlib_ng.__file__  # the extension, with zlib-ng's C API exported
except ImportError:  # pragma: no cover - the wheel is a dependency; this keeps odd installs working
    _LIBRARY = None
    from zlib import crc32

__all__ = ["crc32", "crc32_combine"]


def _combine() -> Callable[[int, int, int], int] | None:
    """zlib-ng's ``zng_crc32_combine(crc1, crc2, len2)`` (a few GF(2) matrix products in C:
    microseconds, so it keeps the GIL), or None where it cannot be found."""
    if _LIBRARY is None:  # pragma: no cover
        return None
    try:
        fn = ctypes.PyDLL(_LIBRARY).zng_crc32_combine
    except (OSError, AttributeError):  # pragma: no cover - a build without the export
        return None
    fn.restype = ctypes.c_uint32
    fn.argtypes = (ctypes.c_uint32, ctypes.c_uint32, ctypes.c_int64)
    combine: Callable[[int, int, int], int] = fn
    return combine


crc32_combine = _combine()
