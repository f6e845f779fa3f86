"""Per-record cost of the journal's record checksums: encode (the writer, each append), verify
(a read back) and scan (recovery), in ns a record; plus a keyed blake2b a record, the
alternative headerkey.py weighs.

Runs against whichever sluicemq is first on sys.path, so an A/B puts a checkout of the old
tree first on PYTHONPATH for A; the old API (no ``seeds``) is detected and called as it was.

    .venv/bin/python bench/header_check.py [--records 200000] [--size 1024] [--repeat 7]
        [--label B] [--out bench/results/<you>-<date>.jsonl]
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import statistics
import struct
import time
from collections.abc import Callable
from typing import Any

from sluicemq.storage import segment


def _keyed() -> dict[str, Any]:
    """The keyword the current API wants (``seeds`` of a keyed segment), or none (old API)."""
    if "seeds" not in inspect.signature(segment.encode_header).parameters:
        return {}
    from sluicemq.storage.headerkey import HeaderKey  # (only the new tree has it)

    return {"seeds": HeaderKey(bytes(range(32)), 1).seeds(7)}


def _best(fn: Callable[[], None], repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--label", default="")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    kw = _keyed()
    n, size = args.records, args.size
    payload = bytes(range(256)) * (size // 256) + bytes(size % 256)
    seg = 7
    offsets = [i * (segment.HEADER_SIZE + size) for i in range(n)]
    heads = [segment.encode_header(1, payload, seg, off, **kw) for off in offsets]
    buf = b"".join(h + payload for h in heads)
    locs = [segment.Location(seg, off, size) for off in offsets]

    seeds = kw.get("seeds")  # passed as the journal does: no ** unpacking a call

    def encode() -> None:
        enc: Any = segment.encode_header
        if seeds is None:
            for off in offsets:
                enc(1, payload, seg, off)
        else:
            for off in offsets:
                enc(1, payload, seg, off, seeds=seeds)

    def verify() -> None:
        check: Any = segment.verify_record
        ok = 0
        if seeds is None:
            for head, loc in zip(heads, locs, strict=True):
                ok += check(head, payload, loc) == 1
        else:
            for head, loc in zip(heads, locs, strict=True):
                ok += check(head, payload, loc, seeds=seeds) == 1
        if ok != n:
            raise AssertionError("bad record")

    def scan() -> None:
        found = sum(1 for _ in segment.scan(buf, seg, [], **kw))
        if found != n:
            raise AssertionError(f"scanned {found} of {n}")

    key = bytes(range(32))
    position = struct.Struct("<QQ")

    def blake() -> None:
        b2b = hashlib.blake2b
        for head, off in zip(heads, offsets, strict=True):
            b2b(head[:12] + position.pack(seg, off), key=key, digest_size=4).digest()

    api = "keyed" if kw else "unkeyed"
    rows = []
    for name, fn in (("encode", encode), ("verify", verify), ("scan", scan),
                     ("blake2b-header", blake)):
        times = _best(fn, args.repeat)
        ns = [t / n * 1e9 for t in times]
        row = {"bench": "header_check", "label": args.label, "api": api, "op": name,
               "records": n, "size": size, "ns_per_record": ns,
               "median_ns": statistics.median(ns), "min_ns": min(ns),
               "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        rows.append(row)
        print(f"{args.label or api:>8} {name:>15}: median {row['median_ns']:7.1f} ns a record "
              f"(min {row['min_ns']:.1f}, {args.repeat} runs of {n:,} x {size} B)")
    if args.out:
        with open(args.out, "a") as fh:
            for row in rows:
                fh.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
