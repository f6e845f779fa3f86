"""Spec: memory that a drained burst used is given back to the operating system.

A broker that stays at its burst-time size for good takes RAM from everything else on the
machine; once the queued bytes fall far below their peak, the broker trims its heap
(core/paging/trim.py) and says so in its log.
"""

from __future__ import annotations

import re

from ha_helpers import wait_lines
from sluice_testing import BrokerProcess, RawStomp, rss_mib
from sluicemq.protocol.codec import encode_frame
from sluicemq.protocol.frames import Frame

COUNT = 40_000
BODY = b"x" * 2048


def test_the_heap_is_trimmed_once_a_burst_drained(broker: BrokerProcess) -> None:
    c = RawStomp(broker.host, broker.port, timeout=60)
    c.connect()
    for start in range(0, COUNT, 2000):
        frames = [encode_frame(Frame("SEND", {"destination": "/queue/burst"}, BODY), "1.2")
                  for _ in range(1999)]
        frames.append(encode_frame(Frame("SEND", {"destination": "/queue/burst",
                                                  "receipt": str(start)}, BODY), "1.2"))
        c.send_bytes(b"".join(frames))
        assert c.recv(timeout=60).headers["receipt-id"] == str(start)
    full = rss_mib(broker.pid)
    c.send("SUBSCRIBE", {"destination": "/queue/burst", "id": "s", "ack": "auto",
                         "activemq.prefetchSize": "1000"})
    for _ in range(COUNT):
        assert c.recv(timeout=60).command == "MESSAGE"
    wait_lines(broker, re.compile(r"heap trimmed after \d+ MiB"), 1, timeout=20)
    after = rss_mib(broker.pid)
    c.close()
    assert after < full - 40, (full, after)  # ~80 MiB of bodies were held at the peak
