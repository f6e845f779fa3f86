"""A broker process whose output lines are kept with the time each was read, so a benchmark
can time events (standing by, lock taken, listening) from the broker's own log."""

from __future__ import annotations

import re
import subprocess
import threading
import time
from pathlib import Path


class LoggedNode:
    """Start with `spawn`; `wait` for a line; `kill` (-9) or `stop` (SIGTERM) it."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.proc: subprocess.Popen[str] | None = None
        self.lines: list[tuple[float, str]] = []
        self._cond = threading.Condition()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def spawn(self, command: list[str], cwd: Path | None = None,
              env: dict[str, str] | None = None) -> None:
        self.lines = []
        self.proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     text=True)
        threading.Thread(target=self._pump, args=(self.proc,), daemon=True).start()

    def _pump(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            with self._cond:
                self.lines.append((time.perf_counter(), line))
                self._cond.notify_all()

    def wait(self, pattern: re.Pattern[str], timeout: float = 900.0) -> float:
        """Wait for a log line; returns when it was read."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for at, line in self.lines:
                    if pattern.search(line):
                        return at
                if self.proc is not None and self.proc.poll() is not None:
                    raise RuntimeError("broker exited:\n" + self.log())
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no line like {pattern.pattern!r}:\n" + self.log())
                self._cond.wait(0.1)  # woken by each new line; re-checks the process too

    def found(self, pattern: re.Pattern[str]) -> re.Match[str] | None:
        with self._cond:
            return next((m for _, line in self.lines if (m := pattern.search(line))), None)

    def log(self) -> str:
        return "".join(text for _, text in self.lines[-40:])

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(60)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                self.kill()
