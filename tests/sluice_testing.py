"""Test support: a real `sluice broker` process and a bare STOMP connection.

Imported by tests/conftest.py (fixtures) and by any test module that needs the classes
themselves (`from sluice_testing import BrokerProcess, RawStomp`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

LISTEN_RE = re.compile(r"listening on stomp://([\d.]+):(\d+)")
CONSOLE_RE = re.compile(r"sluice: console on (http://[\d.]+:(\d+))")
WS_RE = re.compile(r"sluice: websocket on (ws://[\d.]+:(\d+))")
MOUNT_TIMEOUT = 15.0  # seconds for mount/umount in mounted()
# `python -c SHIFTED_CLOCK OFFSET broker ...`: the broker with its wall clock moved OFFSET
# seconds (time.time replaced before sluicemq is imported, so the broker's injected clock -
# a default argument - is the moved one). Specs of wall-clock schedules (cron) use it to put
# the next minute a few seconds away instead of waiting for it.
SHIFTED_CLOCK = """
import runpy, sys, time
offset = float(sys.argv.pop(1))
real_time = time.time
time.time = lambda: real_time() + offset
sys.argv[0] = "sluicemq"
runpy.run_module("sluicemq", run_name="__main__", alter_sys=True)
"""


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


_EPHEMERAL = _ephemeral_range()
_handed_out: set[int] = set()
_pick = random.SystemRandom()  # not the seeded global generator: every worker differs


def _worker_slice() -> tuple[int, int]:
    """This pytest-xdist worker's own part of the ports below the ephemeral range.

    Workers are separate processes: a port one of them found free may be taken by another
    before its broker binds it. Each worker picks from its own slice, so they never race.
    """
    low = 10_000
    high = _EPHEMERAL[0] - 1 if _EPHEMERAL[0] > low + 1000 else 30_000
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    index = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0
    if count <= 1:
        return low, high
    width = (high - low + 1) // count
    return low + index * width, low + (index + 1) * width - 1


def reserve_port() -> int:
    """A free loopback port outside the kernel's ephemeral range, never handed out twice here.

    A broker that binds port 0 gets an ephemeral port, and once it is killed any outgoing
    connection on the machine (parallel workers, other test runs) may take that port before
    the restart binds it again; the same goes for a port found free with bind(0) and bound
    later. Ports below the ephemeral range are only ever taken by someone binding them on
    purpose, and each xdist worker picks from its own slice of them; another test run on the
    same machine may still take one first, which `BrokerProcess.start` answers with new ports.
    """
    low, high = _worker_slice()
    for _ in range(1000):
        port = _pick.randint(low, high)
        if port in _handed_out or _EPHEMERAL[0] <= port <= _EPHEMERAL[1]:
            continue
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the broker binds
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError("no free port outside the ephemeral range")


def eventually(check: Callable[[], object], what: str | Callable[[], str],
               timeout: float = 60.0) -> None:
    """Wait until ``check()`` is true - something the broker does on its own time (its
    once-a-second tick, a background compaction) - bounded generously for a busy machine.
    ``what`` names it in the failure (a callable: asked only then, say for a broker's log)."""
    deadline = time.monotonic() + timeout
    pace = threading.Event()
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:.0f} s: "
                                 f"{what() if callable(what) else what}")
        pace.wait(0.02)  # nothing to wake us: this only paces the re-check


def async_test(fn: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run a coroutine test on a fresh event loop, with a hard 60 s ceiling."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(asyncio.wait_for(fn(*args, **kwargs), 60))

    return run


async def held_async(c: Any, destination: str, timeout: float = 30.0) -> list[bytes]:
    """`held` for a ``sluicemq.AsyncClient``."""
    count = (await c.head(destination)).count
    async with await c.subscribe(destination) as sub:
        got = [await sub.get(timeout) for _ in range(count)]
    assert all(m is not None for m in got), f"{destination}: fewer than {count} delivered"
    return [bytes(m.body) for m in got if m is not None]


def held(c: Any, destination: str, timeout: float = 30.0) -> list[bytes]:
    """The bodies of every message queue ``destination`` holds, read (auto ack) by client
    ``c`` (a ``sluicemq.Client``): the broker says how many it holds (a head query) and each
    is awaited in turn, so a slow delivery on a busy machine cannot end the reading early (as
    "quiet for N s" would) and nothing is waited for that will not come."""
    count = c.head(destination).count
    with c.subscribe(destination) as sub:
        got = [sub.get(timeout=timeout) for _ in range(count)]
    assert all(m is not None for m in got), f"{destination}: fewer than {count} delivered"
    return [bytes(m.body) for m in got if m is not None]


def stored(url: str, destination: str, timeout: float = 30.0) -> list[str]:
    """``held`` as text, read by a client of its own on ``url``."""
    from sluicemq.client import Client

    with Client(url) as c:
        return [body.decode() for body in held(c, destination, timeout)]


def nothing_delivered(c: Any, sub: Any) -> bool:
    """True if subscription ``sub`` of client ``c`` (a ``sluicemq.Client``) holds no message
    once a receipt round trip on ``c`` came back (a transaction begun and aborted). The broker
    writes a RECEIPT after every MESSAGE that frames handled before it made deliverable to the
    connection (core/routing/receipts.py), so what is not there by then was not delivered -
    no quiet window to wait out."""
    c.transaction().abort()
    return sub.get(timeout=0) is None


def rss_mib(pid: int) -> float:
    """A process's resident memory in MiB, from /proc."""
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


class BrokerProcess:
    """A broker subprocess that can be stopped, killed (-9) and restarted on the same data dir."""

    def __init__(self, data_dir: Path, extra_args: list[str] | None = None,
                 config_text: str | None = None) -> None:
        self.data_dir = data_dir
        self.extra_args = list(extra_args or [])
        self.config_path: Path | None = None
        if config_text is not None:
            self.config_path = data_dir.parent / f"{data_dir.name}.toml"
            self.config_path.write_text(config_text)
        self.proc: subprocess.Popen[str] | None = None
        self.host = "127.0.0.1"
        self.port = reserve_port()
        self.output: list[str] = []
        # Console and WebSocket listen on reserved ports too (kept for restart()) unless
        # extra_args choose ports or "off" themselves.
        self.console_port: int | str = reserve_port()
        self.ws_port: int | str = reserve_port()
        self.console_url: str | None = None
        self.ws_url: str | None = None
        self.listening = threading.Event()
        self.clock_offset = 0.0  # seconds the broker's wall clock is moved (SHIFTED_CLOCK)
        # The broker's output reaches `output` through a reader thread, which may trail what
        # the process wrote: `arrived` is notified for each line it appends and at EOF, and
        # `read_all` says the current process's output was read to its end.
        self.arrived = threading.Condition()
        self.read_all = threading.Event()
        self.read_all.set()  # nothing to read before a start
        self.reader: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"stomp://{self.host}:{self.port}"

    def start(self, timeout: float = 20.0, ready: re.Pattern[str] | None = None) -> BrokerProcess:
        """Start and wait for the `listening on` line (or for ``ready``, say a standby's).

        Every line the broker printed before that one (recovery, snapshot, scheduled counts)
        is in ``log()`` once this returns; a line printed later is waited for with
        ``wait_for_log``.

        On a first start whose port another process took between `reserve_port` and the
        broker's bind (another test run on the machine), the broker is started again on new
        ports; a restart keeps its ports, so clients' URLs stay valid.
        """
        first = self.proc is None
        for _ in range(4):
            try:
                return self._start_once(timeout, ready)
            except RuntimeError:
                if not first or "address already in use" not in self.log():
                    raise
            self.output = []
            self.port = reserve_port()
            if "--console-port" not in self.extra_args:
                self.console_port = reserve_port()
            if "--ws-port" not in self.extra_args:
                self.ws_port = reserve_port()
        return self._start_once(timeout, ready)

    def _start_once(self, timeout: float, ready: re.Pattern[str] | None) -> BrokerProcess:
        if self.proc is not None and self.proc.poll() is not None:
            self._read_to_end()  # the last process's lines stay before the new one's
        run = (["-c", SHIFTED_CLOCK, repr(self.clock_offset)] if self.clock_offset
               else ["-m", "sluicemq"])
        args = [sys.executable, *run, "broker", "--host", "127.0.0.1",
                "--port", str(self.port), "--data-dir", str(self.data_dir), *self.extra_args]
        if self.config_path is not None:
            args += ["--config", str(self.config_path)]
        if "--console-port" not in self.extra_args:
            args += ["--console-port", str(self.console_port)]
        if "--ws-port" not in self.extra_args:
            args += ["--ws-port", str(self.ws_port)]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env=env)
        found = threading.Event()
        self.listening = threading.Event()
        read_all = self.read_all = threading.Event()

        def pump(proc: subprocess.Popen[str]) -> None:
            assert proc.stdout is not None
            try:
                for line in proc.stdout:
                    with self.arrived:
                        self.output.append(line)
                        self.arrived.notify_all()
                    parse(line)
            finally:
                with self.arrived:
                    read_all.set()
                    self.arrived.notify_all()

        def parse(line: str) -> None:
            if m := CONSOLE_RE.search(line):
                self.console_url, self.console_port = m.group(1), int(m.group(2))
            if m := WS_RE.search(line):
                self.ws_url, self.ws_port = m.group(1), int(m.group(2))
            m = LISTEN_RE.search(line)
            if m:
                self.host, self.port = m.group(1), int(m.group(2))
                self.listening.set()
            if m or (ready is not None and ready.search(line)):
                found.set()

        self.reader = threading.Thread(target=pump, args=(self.proc,), daemon=True)
        self.reader.start()
        deadline = time.monotonic() + timeout
        while not found.wait(0.05):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("broker did not start:\n" + self.log())
        return self

    def stop(self, timeout: float = 15.0) -> int:
        """Graceful stop (SIGTERM); returns the exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        self._read_to_end()
        return self.proc.returncode

    def kill(self) -> None:
        """kill -9: no flush, no goodbye."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
        self._read_to_end()

    def wait_exit(self, timeout: float = 30.0) -> int:
        """Wait for a process that ends on its own (say a fenced master); returns the exit
        code, with everything it printed in ``log()``."""
        assert self.proc is not None
        code = self.proc.wait(timeout)
        self._read_to_end()
        return code

    def _read_to_end(self, timeout: float = 10.0) -> None:
        """After the process exited: let the reader take the rest of its output (EOF comes
        once the pipe is drained; bounded, should anything else still hold the pipe)."""
        if self.reader is not None:
            self.reader.join(timeout)

    def restart(self) -> BrokerProcess:
        """Start again on the same data dir and port (port reuse keeps client URLs valid)."""
        return self.start()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def log(self, since: int = 0) -> str:
        """What the broker printed (from line ``since``, a ``mark()``). Once the process has
        exited its output is read to the end first; while it runs, a line written just now
        may still be on its way: wait for it with ``wait_for_log``."""
        if self.proc is not None and self.proc.poll() is not None:
            self._read_to_end()
        return "".join(self.output[since:])

    def mark(self) -> int:
        """The number of lines read so far: ``log(since=...)`` and ``wait_for_log(since=...)``
        look only past it (say, at a restart's lines)."""
        return len(self.output)

    def wait_for_log(self, pattern: str | re.Pattern[str], timeout: float = 60.0, *,
                     since: int = 0, count: int = 1) -> str:
        """The ``count``-th line from line ``since`` holding ``pattern`` (a substring, or a
        regex searched in each line), waited for line by line as the reader appends them.
        Fails at once if the process's output ended without it (read to EOF: it cannot come
        any more), else after ``timeout``; the failure shows the log."""
        def holds(line: str) -> bool:
            return (pattern.search(line) is not None if isinstance(pattern, re.Pattern)
                    else pattern in line)

        what = pattern.pattern if isinstance(pattern, re.Pattern) else pattern
        deadline = time.monotonic() + timeout
        seen, found = since, 0
        with self.arrived:
            while True:
                for line in self.output[seen:]:
                    seen += 1
                    if holds(line):
                        found += 1
                        if found >= count:
                            return line
                if self.read_all.is_set():
                    why = "the broker's output ended"
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    why = f"not within {timeout:.0f} s"
                    break
                self.arrived.wait(remaining)
        raise AssertionError(f"{why}: {count} line(s) with {what!r} wanted, {found} found:\n"
                             + "".join(self.output[since:])[-4000:])

    def api(self, path: str) -> Any:
        """GET the console's ``/api/PATH`` (JSON)."""
        import json
        import urllib.request

        with urllib.request.urlopen(f"{self.console_url}/api/{path}", timeout=30) as answer:
            return json.load(answer)

    def wait_listening(self, timeout: float = 30.0) -> None:
        """Wait for the `listening on` line (a standby prints it once it took over)."""
        deadline = time.monotonic() + timeout
        while not self.listening.wait(0.05):
            if self.proc is None or self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("broker is not listening:\n" + self.log())



class RawStomp:
    """A bare STOMP connection for protocol-level tests: send bytes/frames, read frames."""

    def __init__(self, host: str, port: int, timeout: float = 10.0, *,
                 source: str | None = None, rcvbuf: int | None = None) -> None:
        """``source``: connect from that loopback address (another client, as far as
        per-address limits go); ``rcvbuf``: shrink the kernel receive buffer (a stuck reader)."""
        import socket

        from sluicemq.protocol.codec import FrameParser

        self.sock = socket.socket()
        if rcvbuf is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        if source is not None:
            self.sock.bind((source, 0))
        self.sock.settimeout(timeout)
        self.sock.connect((host, port))
        self.parser = FrameParser(version="1.2")
        self.frames: list = []
        self.version = "1.2"

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, command: str, headers: dict[str, str] | None = None,
             body: bytes = b"") -> None:
        from sluicemq.protocol.codec import encode_frame
        from sluicemq.protocol.frames import Frame

        self.sock.sendall(encode_frame(Frame(command, dict(headers or {}), body), self.version))

    def connect(self, version: str = "1.2", **headers: str):
        h = {"accept-version": version, "host": "localhost"}
        h.update({k.replace("_", "-"): v for k, v in headers.items()})
        self.send("CONNECT", h)
        frame = self.recv()
        assert frame.command == "CONNECTED", frame
        self.version = frame.headers.get("version", "1.0")
        self.parser.version = self.version
        return frame

    def recv(self, timeout: float = 10.0):
        """Next frame, or raise TimeoutError; EOF raises ConnectionError."""

        deadline = time.monotonic() + timeout
        while not self.frames:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no frame received")
            self.sock.settimeout(remaining)
            try:
                data = self.sock.recv(1 << 20)
            except TimeoutError:
                raise TimeoutError("no frame received") from None
            if not data:
                raise ConnectionError("connection closed by broker")
            self.frames.extend(self.parser.feed(data))
        return self.frames.pop(0)

    def expect_closed(self, timeout: float = 5.0) -> None:
        """Drain until the broker closes the connection."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self.recv(max(0.01, deadline - time.monotonic()))
            except ConnectionError:
                return
            except TimeoutError:
                break
        raise AssertionError("broker did not close the connection")

    def nothing_delivered(self) -> bool:
        """True if the next frame is the RECEIPT of a round trip begun now (BEGIN, ABORT):
        the broker writes a RECEIPT after every MESSAGE that earlier frames made deliverable
        to the connection (core/routing/receipts.py), so nothing came before it."""
        tx = f"round-trip-{len(self.frames)}-{time.monotonic_ns()}"
        self.send("BEGIN", {"transaction": tx})
        self.send("ABORT", {"transaction": tx, "receipt": tx})
        frame = self.recv()
        return frame.command == "RECEIPT" and frame.headers.get("receipt-id") == tx

    def close(self) -> None:
        self.sock.close()


@contextlib.contextmanager
def tmpfs(mountpoint: Path, size: str) -> Iterator[Path]:
    """A small tmpfs at `mountpoint`, so that ENOSPC is real rather than simulated.

    Needs root; where it cannot be mounted the calling test is skipped, saying why.
    """
    with mounted(mountpoint, "tmpfs", f"size={size}") as path:
        yield path


@contextlib.contextmanager
def mounted(mountpoint: Path, fstype: str, options: str = "") -> Iterator[Path]:
    """A fresh in-memory filesystem (``tmpfs``, ``ramfs``) at `mountpoint`, unmounted after.

    Needs root; where it cannot be mounted the calling test is skipped, saying why.
    """
    import pytest

    mountpoint.mkdir(parents=True, exist_ok=True)
    command = ["mount", "-t", fstype, *(["-o", options] if options else []), fstype,
               str(mountpoint)]
    try:  # `mount` can hang (no privileges, a stuck mount helper): never wait for long
        done = subprocess.run(command, capture_output=True, check=False, timeout=MOUNT_TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.skip(f"cannot mount a {fstype}: mount did not finish in {MOUNT_TIMEOUT} s")
    if done.returncode != 0:
        pytest.skip(f"cannot mount a {fstype}: {done.stderr.decode().strip()}")
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", "-l", str(mountpoint)], check=False, timeout=MOUNT_TIMEOUT)


# Throwaway certificates for TLS specs, made with the openssl CLI.
def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_ca(d: Path, name: str) -> None:
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-keyout", f"{name}.key", "-out", f"{name}.crt", "-subj", f"/CN={name}", cwd=d)


def make_cert(d: Path, name: str, cn: str, ca: str, server: bool = False) -> None:
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
            "-out", f"{name}.csr", "-subj", f"/CN={cn}", cwd=d)
    ext = d / f"{name}.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n" if server
                   else "extendedKeyUsage=clientAuth\n")
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
            "-CAcreateserial", "-days", "2", "-out", f"{name}.crt", "-extfile", ext.name, cwd=d)


def produce(b: BrokerProcess, destination: str, count: int, *,
            headers: Callable[[int], dict[str, str]], body: Callable[[int], bytes],
            batch: int = 1000) -> None:
    """Persistent SENDs of messages ``0 .. count - 1`` (``headers(n)``, ``body(n)``), written
    ``batch`` at a time over one raw connection, the last of each batch with a receipt that is
    awaited before the next batch: all of them stored, in order, on return."""
    from sluicemq.protocol.codec import encode_frame
    from sluicemq.protocol.frames import Frame

    p = RawStomp(b.host, b.port, timeout=60)
    try:
        p.connect()
        for start in range(0, count, batch):
            stop = min(start + batch, count)
            frames = []
            for n in range(start, stop):
                h = {"destination": destination, "persistent": "true", **headers(n)}
                if n == stop - 1:
                    h["receipt"] = str(stop)
                frames.append(encode_frame(Frame("SEND", h, body(n))))
            p.send_bytes(b"".join(frames))
            answer = p.recv(timeout=60)
            assert answer.command == "RECEIPT" and answer.headers["receipt-id"] == str(stop), \
                answer
    finally:
        p.close()


def restart_cycle(b: BrokerProcess, *, kill: bool = False) -> str:
    """Stop (or kill -9) and start again; returns the log lines of that cycle."""
    mark = b.mark()
    if kill:
        b.kill()
    else:
        assert b.stop() == 0
    b.restart()
    return b.log(since=mark)
