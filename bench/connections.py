"""Connection load: many idle connections, then many active producers and consumers at once.

Run: ``.venv/bin/python bench/connections.py [--idle 10000] [--active 1000] [--seconds 10]``.

Starts its own broker (RLIMIT_NOFILE raised to the hard limit for both processes), opens
``--idle`` STOMP connections that only CONNECT, and reports the broker's RSS per idle
connection; then, with those still open, runs ``--active`` connections (half producers, half
consumers on 50 queues) for ``--seconds`` and reports throughput. Finally it checks that every
idle connection is still alive by sending each a receipted frame.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sluicemq.protocol.codec import FrameParser, encode_frame
from sluicemq.protocol.frames import Frame

CONNECT = encode_frame(Frame("CONNECT", {"accept-version": "1.2", "host": "h",
                                         "heart-beat": "0,0"}))
QUEUES = 50


def raise_nofile() -> int:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def start_broker(tmp: Path, max_connections: int) -> tuple[subprocess.Popen[str], int]:
    config = tmp / "broker.toml"
    config.write_text(f"[limits]\nmax-connections = {max_connections}\n"
                      "max-connections-per-address = 0\n")  # every client is 127.0.0.1 here
    proc = subprocess.Popen([sys.executable, "-m", "sluicemq", "broker", "--port", "0",
                             "--data-dir", str(tmp / "data"), "--config", str(config),
                             "--console-port", "off", "--ws-port", "off",
                             "--log-level", "warning"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if m := re.search(r"listening on stomp://[\d.]+:(\d+)", line):
            return proc, int(m.group(1))
    raise RuntimeError("broker did not start")


class Conn:
    """One raw connection: a stream pair and a parser."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.parser = FrameParser()
        self.frames: list[Frame] = []

    @classmethod
    async def open(cls, port: int) -> Conn:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        conn = cls(reader, writer)
        writer.write(CONNECT)
        frame = await conn.next()
        if frame.command != "CONNECTED":
            raise RuntimeError(f"refused: {frame.headers.get('message')}")
        return conn

    async def next(self) -> Frame:
        while not self.frames:
            data = await self.reader.read(1 << 16)
            if not data:
                raise ConnectionError("closed")
            self.frames += self.parser.feed(data)
        return self.frames.pop(0)

    def send(self, command: str, headers: dict[str, str], body: bytes = b"") -> None:
        self.writer.write(encode_frame(Frame(command, headers, body)))


async def open_many(port: int, count: int, batch: int = 500) -> list[Conn]:
    conns: list[Conn] = []
    for start in range(0, count, batch):
        conns += await asyncio.gather(*(Conn.open(port)
                                        for _ in range(min(batch, count - start))))
    return conns


async def producer(conn: Conn, index: int, until: float, body: bytes) -> int:
    sent = 0
    while time.monotonic() < until:
        for _ in range(10):
            conn.send("SEND", {"destination": f"/queue/load.{(index + sent) % QUEUES}"}, body)
            sent += 1
        conn.send("SEND", {"destination": f"/queue/load.{index % QUEUES}",
                           "receipt": str(sent)}, body)
        sent += 1
        while (await conn.next()).command != "RECEIPT":
            pass
    return sent


async def consumer(conn: Conn, index: int, until: float) -> int:
    conn.send("SUBSCRIBE", {"destination": f"/queue/load.{index % QUEUES}", "id": "1"})
    got = 0
    while True:
        try:
            frame = await asyncio.wait_for(conn.next(), max(0.05, until + 2 - time.monotonic()))
        except TimeoutError:
            return got
        if frame.command == "MESSAGE":
            got += 1


async def main_async(args: argparse.Namespace, port: int, pid: int) -> None:
    await asyncio.sleep(0.5)
    base = rss_kib(pid)
    t0 = time.monotonic()
    idle = await open_many(port, args.idle)
    await asyncio.sleep(1.0)
    loaded = rss_kib(pid)
    print(f"idle: {len(idle)} connections in {time.monotonic() - t0:.1f}s; broker RSS "
          f"{base / 1024:.0f} -> {loaded / 1024:.0f} MiB = "
          f"{(loaded - base) / max(1, len(idle)):.1f} KiB per idle connection", flush=True)
    active = await open_many(port, args.active)
    half = len(active) // 2
    until = time.monotonic() + args.seconds
    body = b"x" * args.size
    results = await asyncio.gather(
        *(producer(c, i, until, body) for i, c in enumerate(active[:half])),
        *(consumer(c, i, until) for i, c in enumerate(active[half:])))
    sent, received = sum(results[:half]), sum(results[half:])
    print(f"active: {half} producers sent {sent:,} ({sent / args.seconds:,.0f}/s), "
          f"{len(active) - half} consumers received {received:,} "
          f"({received / args.seconds:,.0f}/s) with {len(idle)} idle connections open; "
          f"broker RSS {rss_kib(pid) / 1024:.0f} MiB", flush=True)
    for i, c in enumerate(idle):
        c.send("SEND", {"destination": "/queue/idle-check", "receipt": str(i),
                        "persistent": "false"})
    alive = sum(f.command == "RECEIPT" for f in await asyncio.gather(*(c.next() for c in idle)))
    print(f"idle connections still alive: {alive}/{len(idle)}")
    for c in (*idle, *active):
        c.writer.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--idle", type=int, default=10_000)
    ap.add_argument("--active", type=int, default=1_000)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--size", type=int, default=256, help="message body bytes")
    args = ap.parse_args()
    limit = raise_nofile()
    needed = args.idle + args.active + 100
    if limit < needed:
        print(f"RLIMIT_NOFILE hard limit {limit} < {needed}: lower --idle/--active",
              file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="sluice-conns-") as tmp:
        proc, port = start_broker(Path(tmp), needed)
        try:
            try:
                import uvloop

                uvloop.run(main_async(args, port, proc.pid))
            except ImportError:
                asyncio.run(main_async(args, port, proc.pid))
        finally:
            proc.kill()
            proc.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
