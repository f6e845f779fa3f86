"""Wildcard publish cost: N topics, M wildcard subscriptions, against a plain topic.

    .venv/bin/python bench/wildcards.py [--topics 10000] [--subs 1000] [--count 100000]

Starts a broker, opens `--subs` wildcard subscriptions (`/topic/w.<i>.*`, spread over 10
connections that drain in auto-ack) and publishes `--count` non-persistent 1 KiB messages
round-robin over `--topics` topics `w.<i % subs>.<j>`: each reaches exactly one wildcard
subscriber. Then the same count to one plain topic with one plain subscriber. Prints msgs/s
(from the first SEND until every message was delivered) for both, and their ratio, with the
load average before and after.

The broker runs with the destination caps raised (``[limits] max_destinations``; the
per-user cap off): at the defaults (10,000 broker-wide, 2,000 per user) the SENDs would be
refused or measure the idle-destination sweep instead of wildcard matching.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from sluicemq.protocol.codec import FrameParser, encode_frame
from sluicemq.protocol.frames import Frame
from streams import start_broker

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
    ap.add_argument("--json", type=Path, help="append the result as one JSON line")
    opts = ap.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "broker.toml"
        config.write_text(f"[limits]\nmax_destinations = {opts.topics + 1000}\n"
                          "max_destinations_per_user = 0\n")
        proc, url = start_broker(Path(tmp) / "data", ["--config", str(config),
                                                      "--console-port", "off",
                                                      "--ws-port", "off"])
        port = int(url.rsplit(":", 1)[1])
        try:
            rates: dict[str, list[float]] = {"wildcard": [], "plain": []}
            for _ in range(opts.repeat):
                for kind in ("wildcard", "plain"):
                    rates[kind].append(asyncio.run(run(port, opts.topics, opts.subs,
                                                       opts.count, kind == "wildcard")))
        finally:
            proc.terminate()
            proc.wait(30)
    load_after = os.getloadavg()
    med = {k: sorted(v)[len(v) // 2] for k, v in rates.items()}
    print(f"{opts.subs} wildcard subscriptions over {opts.topics} topics: "
          f"{med['wildcard']:,.0f} msgs/s; one plain topic: {med['plain']:,.0f} msgs/s; "
          f"ratio {med['wildcard'] / med['plain']:.2f} (medians of {opts.repeat}); "
          f"load {load_before[0]:.2f} -> {load_after[0]:.2f}")
    print("runs:", {k: [round(x) for x in v] for k, v in rates.items()})
    if opts.json:
        line = {"date": time.strftime("%Y-%m-%d %H:%M"), "scenario": "wildcard-publish",
                "topics": opts.topics, "subs": opts.subs, "count": opts.count,
                "repeat": opts.repeat, "median_msgs_per_s": {k: round(v) for k, v in med.items()},
                "ratio": round(med["wildcard"] / med["plain"], 3),
                "runs": {k: [round(x) for x in v] for k, v in rates.items()},
                "load_before": load_before, "load_after": load_after}
        with opts.json.open("a") as fh:
            fh.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    main()
