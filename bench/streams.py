"""Large-file figures: a file through SluiceMQ as one stream, against `cp` + `sync`.

Sends FILE (made with --make-gib if missing) with `Client.send_file` into a fresh broker while
a second process runs `Client.receive_file` (SHA-256 verified, fsync'd, renamed) — so the
figure is end to end, producer disk to consumer disk, every chunk fsync'd in the journal on the
way. The broker's RSS is sampled every 50 ms. The physical reference is `cp FILE DST && sync`
on the same disk. Prints one JSON line.

    .venv/bin/python bench/streams.py --make-gib 1
    .venv/bin/python bench/streams.py --make-gib 10 --chunk-mib 1 --window 8
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

LISTEN_RE = re.compile(r"listening on stomp://([\d.]+):(\d+)")
MIB = 1 << 20


def make_file(path: Path, gib: float) -> None:
    """Incompressible content without paying for urandom per byte: a 64 MiB random block,
    each copy made distinct by a counter so no chunk repeats another."""
    block = bytearray(os.urandom(64 * MIB))
    total = int(gib * 1024) * MIB
    with open(path, "wb") as fh:
        written = 0
        n = 0
        while written < total:
            block[:8] = n.to_bytes(8, "little")
            take = min(len(block), total - written)
            fh.write(memoryview(block)[:take])
            written += take
            n += 1


class RssSampler(threading.Thread):
    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.peak = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.05):
            try:
                for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        self.peak = max(self.peak, int(line.split()[1]) * 1024)
            except OSError:
                return


def start_broker(data_dir: Path, extra: Sequence[str] = ()) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "sluicemq", "broker", "--port", "0", "--data-dir", str(data_dir),
         "--console-port", "auto", "--ws-port", "auto", "--log-level", "warning", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        m = LISTEN_RE.search(line)
        if m:
            threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
            return proc, f"stomp://{m.group(1)}:{m.group(2)}"
    raise RuntimeError("broker did not start")


def cp_sync(src: Path, dst: Path) -> float:
    started = time.perf_counter()
    subprocess.run(["cp", str(src), str(dst)], check=True)
    subprocess.run(["sync"], check=True)
    elapsed = time.perf_counter() - started
    dst.unlink()
    return elapsed


def drop_caches() -> None:
    try:
        subprocess.run(["sync"], check=True)
        Path("/proc/sys/vm/drop_caches").write_text("1\n")
    except OSError:
        pass  # not root: page cache stays warm, say so in the output


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--file", type=Path, default=None)
    ap.add_argument("--make-gib", type=float, default=1.0)
    ap.add_argument("--chunk-mib", type=float, default=1.0)
    ap.add_argument("--window", type=int, default=8)
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "sluice-streams")
    ap.add_argument("--keep", action="store_true", help="keep the generated file")
    opts = ap.parse_args()

    work = opts.workdir
    work.mkdir(parents=True, exist_ok=True)
    src = opts.file or work / f"input-{opts.make_gib:g}GiB.bin"
    if not src.exists():
        make_file(src, opts.make_gib)
    size = src.stat().st_size

    drop_caches()
    cp_s = cp_sync(src, work / "cp-copy.bin")

    data_dir = Path(tempfile.mkdtemp(dir=work, prefix="data-"))
    out_dir = Path(tempfile.mkdtemp(dir=work, prefix="out-"))
    broker, url = start_broker(data_dir)
    sampler = RssSampler(broker.pid)
    sampler.start()
    dest = "/queue/bench.files"
    receiver = subprocess.Popen(
        [sys.executable, "-c",
         "import sys; from sluicemq import Client;"
         "c = Client(sys.argv[1]);"
         "p = c.receive_file(sys.argv[2], sys.argv[3], window=int(sys.argv[4]), timeout=600);"
         "print(p); c.disconnect()",
         url, dest, str(out_dir), str(opts.window)],
        stdout=subprocess.PIPE, text=True)
    from sluicemq import Client

    drop_caches()
    started = time.perf_counter()
    with Client(url) as client:
        client.send_file(dest, src, chunk_size=int(opts.chunk_mib * MIB), window=opts.window)
        sent = time.perf_counter() - started
    out, _ = receiver.communicate(timeout=3600)
    elapsed = time.perf_counter() - started
    sampler.stop.set()
    broker.terminate()
    broker.wait(30)
    received = Path(out.strip())
    ok = received.exists() and received.stat().st_size == size
    result = {
        "bench": "streams", "bytes": size, "chunk_mib": opts.chunk_mib, "window": opts.window,
        "end_to_end_mb_per_s": round(size / elapsed / 1e6, 1),
        "producer_mb_per_s": round(size / sent / 1e6, 1),
        "elapsed_s": round(elapsed, 2),
        "broker_peak_rss_mib": round(sampler.peak / MIB, 1),
        "cp_sync_mb_per_s": round(size / cp_s / 1e6, 1),
        "ratio_vs_cp_sync": round(cp_s / elapsed, 2),
        "verified": ok, "loadavg": os.getloadavg()[0],
    }
    print(json.dumps(result))
    shutil.rmtree(data_dir, ignore_errors=True)
    shutil.rmtree(out_dir, ignore_errors=True)
    if not opts.keep and opts.file is None:
        src.unlink()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
