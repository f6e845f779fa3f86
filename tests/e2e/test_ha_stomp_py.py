"""Any STOMP client, not only ours, survives a takeover: stomp.py given both brokers' addresses
(its own host list, as ActiveMQ users configure it) reconnects to the new master after a kill -9
and finds every message the old master receipted, in order, once.

stomp.py does not re-send or re-subscribe by itself (that is what our failover URL adds): the
application reconnects and subscribes again, as it would with ActiveMQ.
"""

from __future__ import annotations

import threading
from typing import Any

import stomp
from stomp_helpers import Collector, wait_receipt


class Watcher(Collector):
    """Collector that also says when the connection dropped."""

    def __init__(self) -> None:
        super().__init__()
        self.dropped = threading.Event()

    def on_disconnected(self) -> None:
        self.dropped.set()


def stomp_py(*ports: int) -> tuple[Any, Watcher]:
    """A stomp.py 1.2 connection listing every broker; each connect() tries them in order,
    again and again (bounded: 100 rounds ~0.1 s apart) while none answers."""
    conn = stomp.Connection12([("127.0.0.1", p) for p in ports], heartbeats=(0, 0),
                              auto_content_length=True, reconnect_sleep_initial=0.1,
                              reconnect_sleep_increase=0.0, reconnect_sleep_jitter=0.0,
                              reconnect_sleep_max=0.1, reconnect_attempts_max=100, timeout=5)
    watcher = Watcher()
    conn.set_listener("w", watcher)
    conn.connect(wait=True)
    return conn, watcher


def test_stomp_py_reconnects_to_the_new_master_and_finds_every_receipted_message(
        cluster) -> None:
    master = cluster.master()
    standby = cluster.standby()
    ports = (master.port, standby.port)
    producer, heard = stomp_py(*ports)
    for i in range(100):
        producer.send("/queue/any", f"m{i}", receipt=f"s{i}", headers={"persistent": "true"})
        wait_receipt(heard, f"s{i}")
    consumer, got = stomp_py(*ports)
    consumer.subscribe("/queue/any", id="1", ack="client-individual",
                       headers={"activemq.prefetchSize": "30"})
    first = [got.next() for _ in range(30)]
    assert [f.body for f in first] == [f"m{i}" for i in range(30)]
    for n, frame in enumerate(first[:20]):  # m20..m29 stay delivered, not acknowledged
        consumer.ack(frame.headers["ack"], receipt=f"a{n}")
        wait_receipt(got, f"a{n}")

    master.kill()
    assert heard.dropped.wait(10) and got.dropped.wait(10)
    # the 20 ACKs made room in the prefetch window, so the old master sent more before it died;
    # nobody acknowledged those, so they are not gone either
    stale = [got.messages.get_nowait().body for _ in range(got.messages.qsize())]
    assert stale == [f"m{i}" for i in range(30, 30 + len(stale))]

    consumer.connect(wait=True)  # the old master refuses, the standby answers once it serves
    assert consumer.transport.current_host_and_port == ("127.0.0.1", standby.port)
    consumer.subscribe("/queue/any", id="1", ack="client-individual")
    producer.connect(wait=True)
    producer.send("/queue/any", "after", receipt="s-after", headers={"persistent": "true"})
    wait_receipt(heard, "s-after")
    rest = [got.next().body for _ in range(81)]
    # the acknowledged ones stay gone; the unacknowledged ones come first again; nothing twice
    assert rest == [f"m{i}" for i in range(20, 100)] + ["after"]
    for conn in (producer, consumer):
        conn.disconnect()
