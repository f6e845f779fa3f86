"""Spec: hostile bytes on live connections never crash the broker or disturb other clients.

Hypothesis builds frame sequences from real commands and header names with random, boundary
and mutated values, then flips, drops and truncates bytes; each sequence goes to the broker on
a fresh connection, half of them after a valid CONNECT. Throughout, a well-behaved client keeps
doing receipted round trips on its own queue and must never fail; at the end the broker log
holds no "internal error" and its memory has stayed bounded.
"""

from __future__ import annotations

import socket
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice_testing import eventually
from sluicemq.client import Client
from sluicemq.protocol.frames import ALL_COMMANDS

COMMANDS = [*sorted(ALL_COMMANDS), "connect", "SEND ", "", "X" * 300, "STOMP\r"]
KEYS = ["destination", "receipt", "id", "ack", "transaction", "content-length", "content-type",
        "accept-version", "heart-beat", "login", "passcode", "selector", "persistent",
        "priority", "expires", "message-id", "subscription", "client-id", "host", "version",
        "activemq.prefetchSize", "activemq.subscriptionName", "activemq.exclusive",
        "sluice-stream-id", "sluice-stream-seq", "sluice-stream-offset", "sluice-stream-final",
        "sluice-stream-size", "sluice-stream-query", "sluice-stream-wait-consumer",
        "sluice-max-streams", "JMSXGroupID", "redelivered", "timestamp", "\\c", "a\\nb"]
VALUES = ["/queue/fz", "/topic/fz", "/queue/fz.>", "/queue/", "/queue/a..b", "", "-1", "0",
          "1", "2147483648", "9" * 40, "1e308", "NaN", "true", "false", "client",
          "client-individual", "auto", "1.0", "1.2", "1.0,1.1,1.2", "0,0", "1,1", "99999999,1",
          "x = 'a' AND y > 3", "(" * 200, "a LIKE '%%%%%%%%%%_'", "x IN (" + "'a'," * 100 + "'b')",
          "\\", "\\c\\n\\r\\t", "é", "\ud7ff", "s-1"]
value = st.one_of(st.sampled_from(VALUES), st.text(max_size=40))
header = st.tuples(st.one_of(st.sampled_from(KEYS), st.text(min_size=1, max_size=10)), value)
body = st.one_of(st.just(b""), st.binary(max_size=300), st.sampled_from([b"\0", b"x" * 70000]))


@st.composite
def frame_bytes(draw: st.DrawFn) -> bytes:
    command = draw(st.sampled_from(COMMANDS))
    headers = draw(st.lists(header, max_size=8))
    lines = [command, *(f"{k}:{v}" for k, v in headers)]
    eol = draw(st.sampled_from(["\n", "\r\n"]))
    head = (eol.join(lines) + eol + eol).encode("utf-8", "surrogatepass")
    return head + draw(body) + draw(st.sampled_from([b"\0", b"\0\n\n", b"", b"\0\0"]))


@st.composite
def session_bytes(draw: st.DrawFn) -> bytes:
    frames = draw(st.lists(frame_bytes(), min_size=1, max_size=5))
    if draw(st.booleans()):
        frames.insert(0, b"CONNECT\naccept-version:1.0,1.1,1.2\nhost:h\nheart-beat:0,0\n\n\0")
    data = bytearray(b"".join(frames))
    for pos, bit in draw(st.lists(st.tuples(st.integers(0, max(0, len(data) - 1)),
                                            st.integers(0, 7)), max_size=4)):
        if data:
            data[pos] ^= 1 << bit
    if data and draw(st.booleans()):
        data = data[: draw(st.integers(0, len(data)))]
    return bytes(data)


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


class WellBehaved(threading.Thread):
    """Receipted round trips on a queue no fuzz input can name; counts any failure."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.stop = threading.Event()
        self.rounds = 0
        self.failures: list[str] = []

    def run(self) -> None:
        with Client(self.url, timeout=10) as c:
            sub = c.subscribe("/queue/well.behaved.only", ack="client-individual")
            while not self.stop.is_set():
                payload = f"round {self.rounds}".encode()
                try:
                    c.send("/queue/well.behaved.only", payload)
                    msg = sub.get(10)
                    if msg is None or msg.body != payload:
                        self.failures.append(f"round {self.rounds}: got {msg!r}")
                    else:
                        msg.ack()
                except Exception as exc:
                    self.failures.append(f"round {self.rounds}: {exc!r}")
                    return
                self.rounds += 1
                self.stop.wait(0.01)  # a steady trickle beside the fuzzer: pacing, not a wait


@pytest.fixture(scope="module")
def fuzz_target(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One broker for the whole module (hypothesis runs many examples per test)."""
    import subprocess
    import sys

    data = tmp_path_factory.mktemp("fuzz")
    proc = subprocess.Popen([sys.executable, "-m", "sluicemq", "broker", "--port", "0",
                             "--console-port", "off", "--ws-port", "off",
                             "--data-dir", str(data / "d")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    ready = threading.Event()
    found: dict[str, int] = {}

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "listening on stomp://" in line:
                found["port"] = int(line.split(":")[-1].split()[0])
                ready.set()

    threading.Thread(target=pump, daemon=True).start()
    assert ready.wait(20), "".join(lines)
    yield proc, found["port"], lines
    proc.kill()
    proc.wait(30)


def send_raw(port: int, data: bytes) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        try:
            s.sendall(data)
            s.settimeout(0.02)
            while s.recv(65536):
                pass
        except OSError:
            pass  # closed by the broker, reset, or just quiet: all fine


def test_fuzzed_sessions_never_crash_or_disturb_others(fuzz_target: Any) -> None:
    proc, port, lines = fuzz_target
    good = WellBehaved(f"stomp://127.0.0.1:{port}")
    good.start()
    eventually(lambda: good.rounds or good.failures, "the well-behaved client's first round")
    rss_before = rss_kib(proc.pid)
    executed = 0

    @settings(max_examples=800, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(session_bytes())
    def fuzz(data: bytes) -> None:
        nonlocal executed
        send_raw(port, data)
        executed += 1

    fuzz()
    after = good.rounds  # and the broker still serves it once the fuzzing is over
    eventually(lambda: good.rounds > after + 2 or good.failures,
               "well-behaved round trips after the fuzzing")
    good.stop.set()
    good.join(15)
    log = "".join(lines)
    print(f"{executed} fuzzed sessions, {good.rounds} well-behaved round trips, "
          f"RSS {rss_before} -> {rss_kib(proc.pid)} KiB")
    assert proc.poll() is None, log
    assert good.failures == [], good.failures
    assert good.rounds > 10
    assert "internal error" not in log, log
    assert "Traceback" not in log, log
    assert rss_kib(proc.pid) - rss_before < 150_000  # < ~150 MiB for 800 sessions
