"""Wildcard publish cost: N topics, M wildcard subscriptions, against a plain topic.

    .venv/bin/python bench/wildcards.py [--topics 10000] [--subs 1000] [--count 100000]

Starts a broker, opens `--subs` wildcard subscriptions (`/topic/w.<i>.*`, spread over 10
connections that drain in auto-ack) and publishes `--count` non-persistent 1 KiB messages
round-robin over `--topics` topics `w.<i % subs>.<j>`: each reaches exactly one wildcard
subscriber. Then the same count to one plain topic with one plain subscriber. Prints msgs/s
(producer side, last SEND receipted and every message delivered) for both, and their ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
from sluicemq.protocol.codec import FrameParser, encode_frame
from sluicemq.protocol.frames import Frame

BODY = b"w" * 1024


async def open_conn(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    r, w = await asyncio.open_connection("127.0.0.1", port, limit=1 << 24)
    w.write(encode_frame(Frame("CONNECT", {"accept-version": "1.2", "host": "h"})))
    await r.readuntil(b"\0")
    return r, w


async def drain(r: asyncio.StreamReader, want: list[int], done: asyncio.Event) -> None:
    parser = FrameParser()
    while True:
        data = await r.read(1 << 20)
        if not data:
            return
        for f in parser.feed(data):
            if f.command == "MESSAGE":
                want[0] -= 1
                if want[0] == 0:
                    done.set()


async def run(port: int, topics: int, subs: int, count: int, wildcard: bool) -> float:
    conns = [await open_conn(port) for _ in range(10 if wildcard else 1)]
    want = [count]
    done = asyncio.Event()
    if wildcard:
        for i in range(subs):
            _r, w = conns[i % len(conns)]
            w.write(encode_frame(Frame("SUBSCRIBE", {"destination": f"/topic/w.{i}.*",
                                                     "id": str(i)})))
    else:
        conns[0][1].write(encode_frame(Frame("SUBSCRIBE", {"destination": "/topic/plain",
                                                           "id": "p"})))
    for _r, w in conns:
        w.write(encode_frame(Frame("SUBSCRIBE", {"destination": "/queue/sync", "id": "sync",
                                                 "receipt": "ready"})))
        await w.drain()
    readers = []
    for r, _w in conns:
        await r.readuntil(b"\0")  # the receipt: every SUBSCRIBE before it is live
        readers.append(asyncio.create_task(drain(r, want, done)))
    pr, pw = await open_conn(port)
    started = time.perf_counter()
    batch = []
    for k in range(count):
        dest = f"/topic/w.{k % subs}.{k % topics}" if wildcard else "/topic/plain"
        batch.append(encode_frame(Frame("SEND", {"destination": dest}, BODY)))
        if len(batch) == 500:
            pw.write(b"".join(batch))
            batch = []
            await pw.drain()
    pw.write(b"".join(batch))
    await asyncio.wait_for(done.wait(), 600)
    elapsed = time.perf_counter() - started
    for t in readers:
        t.cancel()
    for _r, w in [*conns, (pr, pw)]:
        w.close()
    return count / elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--topics", type=int, default=10_000)
    ap.add_argument("--subs", type=int, default=1_000)
    ap.add_argument("--count", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    opts = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.Popen([sys.executable, "-m", "sluicemq", "broker", "--port", "0",
                                 "--data-dir", f"{tmp}/data", "--console-port", "off",
                                 "--ws-port", "off"], stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        port = 0
        for line in proc.stdout:
            m = re.search(r"listening on stomp://[\d.]+:(\d+)", line)
            if m:
                port = int(m.group(1))
                break
        try:
            rates: dict[str, list[float]] = {"wildcard": [], "plain": []}
            for _ in range(opts.repeat):
                for kind in ("wildcard", "plain"):
                    rates[kind].append(asyncio.run(run(port, opts.topics, opts.subs,
                                                       opts.count, kind == "wildcard")))
        finally:
            proc.terminate()
            proc.wait(30)
    med = {k: sorted(v)[len(v) // 2] for k, v in rates.items()}
    print(f"{opts.subs} wildcard subscriptions over {opts.topics} topics: "
          f"{med['wildcard']:,.0f} msgs/s; one plain topic: {med['plain']:,.0f} msgs/s; "
          f"ratio {med['wildcard'] / med['plain']:.2f} (medians of {opts.repeat})")
    print("runs:", {k: [round(x) for x in v] for k, v in rates.items()})


if __name__ == "__main__":
    main()
