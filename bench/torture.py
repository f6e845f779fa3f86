"""Long crash-loop torture: N kill -9 cycles, then journal damage rounds, with a ledger verdict.

Run: ``.venv/bin/python bench/torture.py [--cycles 100] [--producers 3] [--consumers 2]``.

The engine is tests/torture/torture_engine.py (the CI suite runs a few cycles of the same
thing); here the broker is a plain subprocess on a fixed port that is killed -9 at random
moments and restarted on the same data directory. Exit status 1 if any receipted message was
lost or any delivery corrupt.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "torture"))

from torture_engine import run

LISTEN = re.compile(r"listening on stomp://([\d.]+):(\d+)")


class Broker:
    """`sluice broker` as a child process that can be killed and restarted on its port."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.port = 0
        self.proc: subprocess.Popen[str] | None = None
        self.log: list[str] = []

    @property
    def url(self) -> str:
        return f"stomp://127.0.0.1:{self.port}"

    def restart(self) -> Broker:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sluicemq", "broker", "--port", str(self.port),
             "--data-dir", str(self.data_dir), "--console-port", "off", "--ws-port", "off"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        up = threading.Event()

        def pump(proc: subprocess.Popen[str]) -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                self.log.append(line)
                if m := LISTEN.search(line):
                    self.port = int(m.group(2))
                    up.set()

        threading.Thread(target=pump, args=(self.proc,), daemon=True).start()
        if not up.wait(60):
            raise RuntimeError("broker did not start:\n" + "".join(self.log[-50:]))
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=100)
    ap.add_argument("--producers", type=int, default=3)
    ap.add_argument("--consumers", type=int, default=2)
    ap.add_argument("--queues", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-size", type=int, default=200_000, help="largest body in bytes")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="sluice-torture-") as tmp:
        broker = Broker(Path(tmp) / "data").restart()
        started = time.monotonic()
        try:
            verdict = run(broker, Path(tmp), cycles=args.cycles, producers=args.producers,
                          consumers=args.consumers, queues=args.queues, seed=args.seed,
                          max_size=args.max_size, drain_timeout=120,
                          on_cycle=lambda n: print(f"cycle {n}/{args.cycles}", flush=True)
                          if n % 10 == 0 else None)
        finally:
            broker.kill()
        internal = sum("internal error" in line for line in broker.log)
    print(f"torture: {verdict.summary()}; {internal} internal errors; "
          f"{time.monotonic() - started:.0f}s")
    if verdict.lost:
        print("lost:", ", ".join(verdict.lost[:20]))
    return 0 if verdict.ok and not internal else 1


if __name__ == "__main__":
    sys.exit(main())
