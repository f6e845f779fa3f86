"""What one open TCP connection costs the broker in RSS: the figure behind
``transport/tcp.CONNECTION_BYTES`` (issue #16).

Run: ``.venv/bin/python bench/connection_cost.py [N]`` (default 3,000).

Starts a broker (``bench/hostile.py``'s), makes one console call (aiohttp mapped, as in the
hostile table's idle), then three rounds on the same broker: N connections from several
loopback addresses (the per-address cap is 1,000), each CONNECTed with one SUBSCRIBE, held
together; the same again (arenas the first round left are reused); N idle sockets that never
send CONNECT. Each line gives RSS settled before, while all are open, per connection, and
after they closed. Why three: the first round pays for new small-object arenas, the second
shows the marginal cost on a broker that has seen a storm, the third what an unauthenticated
socket holds.
"""

from __future__ import annotations

import asyncio
import resource
import sys
import tempfile
import time
from pathlib import Path

from hostile import Broker, MiB, Stomp  # bench/ is the script's directory: on sys.path


async def _round(b: Broker, n: int, connect: bool) -> int:
    conns = []
    for i in range(n):
        Stomp.source = f"127.0.2.{10 + i // 900}"
        s = await Stomp.open(b.port, connect=connect)
        if connect:
            s.send("SUBSCRIBE", {"destination": f"/queue/c.{i % 10}", "id": "s"})
        conns.append(s)
    if connect:
        for s in conns[-3:]:
            await s.sync()
    await asyncio.sleep(1)
    held = b.rss()
    for s in conns:
        await s.close()
    return held


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    with tempfile.TemporaryDirectory() as tmp:
        b = Broker.start(Path(tmp))
        try:
            time.sleep(1)
            b.accounted()
            for connect in (True, True, False):
                b.settle()
                before = b.rss()
                held = asyncio.run(_round(b, n, connect))
                b.settle()
                what = "CONNECTed + one SUBSCRIBE" if connect else "idle (no CONNECT)"
                print(f"{what}: {n} open: {before / MiB:.1f} -> {held / MiB:.1f} MiB "
                      f"({(held - before) / n / 1024:.2f} KiB each), after close "
                      f"{b.rss() / MiB:.1f} MiB", flush=True)
        finally:
            b.proc.terminate()
            b.proc.wait(30)


if __name__ == "__main__":
    main()
