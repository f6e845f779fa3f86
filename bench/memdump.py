"""Run ``sluice`` with a memory census on SIGUSR1: where a broker's resident bytes are.

Run: ``SLUICE_MEMDUMP=/tmp/dump.jsonl .venv/bin/python bench/memdump.py broker ...`` (the same
arguments as ``python -m sluicemq``); ``kill -USR1 <pid>`` appends one JSON line. With
``SLUICE_MEMDUMP_TRACE=<frames>`` (tracemalloc: slower, and its own bookkeeping is extra RSS)
the line also lists the allocation sites holding the most bytes, and with
``SLUICE_MEMDUMP_SNAPSHOTS=<prefix>`` each snapshot is saved for ``compare_to``.
``bench/hostile.py --dump`` uses it.

Why a census rather than RSS alone: RSS says how much, not whose. The line splits it into
glibc's heap (in use, free but kept, mapped blocks), CPython's small-object arenas (pymalloc:
the blocks in use, and the arenas kept because one block in them is still alive), and the
objects the collector tracks by type, so an attack's residue can be named, not guessed.
The label of a census is read from ``$SLUICE_MEMDUMP.label`` (written by the caller first).
"""

from __future__ import annotations

import collections
import ctypes
import ctypes.util
import gc
import json
import os
import re
import signal
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from types import FrameType

MiB = 1 << 20


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def _mallinfo() -> dict[str, float]:
    try:
        fn = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return {}
    fn.restype = _MallInfo2
    info = fn()
    return {"heap_mib": info.arena / MiB, "heap_used_mib": info.uordblks / MiB,
            "heap_free_mib": info.fordblks / MiB, "mapped_mib": info.hblkhd / MiB,
            "mapped_blocks": info.hblks}


def _pymalloc() -> dict[str, float]:
    """Parse ``sys._debugmallocstats`` (it writes to the C stderr, so fd 2 is swapped)."""
    with tempfile.TemporaryFile() as out:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(out.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        text = out.read().decode(errors="replace")
    facts: dict[str, int] = {}
    for key, pattern in (("arenas", r"# arenas allocated current\s*=\s*([\d,]+)"),
                         ("arenas_peak", r"# arenas highwater mark\s*=\s*([\d,]+)"),
                         ("arena_size", r"arenas \* (\d+) bytes/arena"),
                         ("blocks_used", r"# bytes in allocated blocks\s*=\s*([\d,]+)"),
                         ("blocks_free", r"# bytes in available blocks\s*=\s*([\d,]+)"),
                         ("pools_unused", r"(\d+) unused pools \*")):
        if m := re.search(pattern, text):
            facts[key] = int(m.group(1).replace(",", ""))
    arena_size = facts.get("arena_size", 1 << 20)
    return {"arenas": facts.get("arenas", 0), "arenas_peak": facts.get("arenas_peak", 0),
            "arena_mib": facts.get("arenas", 0) * arena_size / MiB,
            "blocks_used_mib": facts.get("blocks_used", 0) / MiB,
            "blocks_free_mib": facts.get("blocks_free", 0) / MiB,
            "pools_unused_mib": facts.get("pools_unused", 0) * 16384 / MiB}


def _rss() -> dict[str, float]:
    """RSS, and its anonymous (heap, arenas, stacks) and file-backed (code, libraries) parts."""
    fields = {"VmRSS:": "rss_mib", "RssAnon:": "rss_anon_mib", "RssFile:": "rss_file_mib"}
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        name = line.split(maxsplit=1)[0] if line else ""
        if name in fields:
            out[fields[name]] = int(line.split()[1]) / 1024
    return out


def _sparse(most: int = 4) -> list[tuple[str, int, list[str]]]:
    """Tracked objects alone (at most ``most``) in their 1 MiB of address space: what may keep
    an otherwise empty pymalloc arena (1 MiB) alive; by address range, type and a short repr."""
    by_range: dict[int, list[object]] = collections.defaultdict(list)
    for o in gc.get_objects():
        by_range[id(o) >> 20].append(o)
    found = []
    for key, objs in sorted(by_range.items()):
        if len(objs) <= most:
            found.append((hex(key << 20), len(objs),
                          [f"{type(o).__qualname__}: {_short(o)}" for o in objs]))
    # The lists hold every tracked object, ``by_range`` and this frame among them: a cycle
    # that kept all of them (message bodies too) until a full collection - 8-12 MiB more
    # heap after each census taken between 1 GiB streams, which the census then reported.
    by_range.clear()
    return found


def _short(o: object) -> str:
    try:
        text = repr(o)
    except Exception:  # a half-built object: its type says enough
        text = "?"
    return text[:120]


def census(label: str) -> dict[str, object]:
    """One line: RSS, glibc, pymalloc, the most numerous tracked types, top allocation sites."""
    started = time.monotonic()
    by_type = collections.Counter(type(o).__qualname__ for o in gc.get_objects())
    line: dict[str, object] = {
        "label": label, "time": time.strftime("%H:%M:%S"), **_rss(),
        **_mallinfo(), **_pymalloc(),
        "tracked": sum(by_type.values()), "types": by_type.most_common(25)}
    line["sparse"] = _sparse()
    if tracemalloc.is_tracing():
        snapshot = tracemalloc.take_snapshot()
        current, _peak = tracemalloc.get_traced_memory()
        line["traced_mib"] = current / MiB
        line["sites"] = [(str(s.traceback[0]), round(s.size / MiB, 2), s.count)
                         for s in snapshot.statistics("lineno")[:30]]
        if path := os.environ.get("SLUICE_MEMDUMP_SNAPSHOTS"):  # for compare_to afterwards
            snapshot.dump(f"{path}.{label.replace(' ', '_').replace(':', '')}.snap")
    line["census_s"] = round(time.monotonic() - started, 2)
    return line


def _on_usr1(_signum: int, _frame: FrameType | None) -> None:
    target = Path(os.environ["SLUICE_MEMDUMP"])
    label_file = target.with_name(target.name + ".label")
    label = label_file.read_text().strip() if label_file.exists() else ""
    with target.open("a") as f:
        f.write(json.dumps(census(label)) + "\n")


def main() -> None:
    if "SLUICE_MEMDUMP" in os.environ:
        signal.signal(signal.SIGUSR1, _on_usr1)
    if os.environ.get("SLUICE_MEMDUMP_TRACE"):  # the broker only, not whoever started it
        tracemalloc.start(int(os.environ["SLUICE_MEMDUMP_TRACE"]))
    from sluicemq.cli.main import cli

    sys.argv[0] = "sluice"
    cli()


if __name__ == "__main__":
    main()
