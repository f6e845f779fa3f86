"""Process memory facts for the overview and /metrics (Linux /proc and cgroup v2, best effort)."""

from __future__ import annotations

import os
import resource
from pathlib import Path

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes() -> int:
    """Resident set size now; falls back to the peak (ru_maxrss) where /proc is missing."""
    try:
        fields = Path("/proc/self/statm").read_text().split()
        return int(fields[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def memory_limit(configured: int | None = None) -> tuple[int | None, str]:
    """The memory ceiling the broker lives under and where it comes from.

    A configured broker limit wins; otherwise the cgroup's (containers), otherwise physical RAM,
    so the overview always has something to compare RSS against.
    """
    if configured:
        return configured, "config"
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < (1 << 60):
            return int(text), "cgroup"
    try:
        return os.sysconf("SC_PHYS_PAGES") * _PAGE, "physical"
    except (ValueError, OSError, AttributeError):
        return None, "unknown"
