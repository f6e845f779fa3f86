"""Process memory facts for the overview and /metrics (Linux /proc, best effort)."""

from __future__ import annotations

import os
import resource
from pathlib import Path
from typing import Any

from sluicemq.core.paging.flow import parse_size

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes() -> int:
    """Resident set size now; falls back to the peak (ru_maxrss) where /proc is missing."""
    try:
        fields = Path("/proc/self/statm").read_text().split()
        return int(fields[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def broker_memory_limit(broker: Any) -> tuple[int, str]:
    """The memory limit the broker enforces on queued messages (``[limits] memory_limit``, or
    the default derived from physical RAM) and whether it was configured or derived."""
    configured = parse_size(broker.config.limits.memory_limit)
    return broker.limits.memory, "config" if configured > 0 else "derived"
