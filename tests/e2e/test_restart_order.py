"""A queue's order survives everything a restart can meet at once: a backlog paged out into
packed slot blocks, three priorities, messages given back by consumers that went away
unacknowledged (redeliveries), acks spread over the backlog, an index snapshot from a clean
stop and a kill -9 whose journal tail holds acks of what that snapshot captured.

Order is the one promise: higher priority first, and within a priority the order the messages
were sent in; a redelivered message goes back to its place, not to the end. Every step waits on
receipts or counts frames (no sleeps), and the order of events is fixed: snapshots are written
only at clean stops.
"""

from __future__ import annotations

from sluice_testing import BrokerProcess, RawStomp, restart_cycle

N = 30_000  # priority 0 fills several packed blocks of 4,096 paged-out slots


def priority(i: int) -> int:
    return 9 if i % 50 == 0 else 4 if i % 20 == 0 else 0  # 600, 900 and 28,500 messages


EXPECTED = sorted(range(N), key=lambda i: (-priority(i), i))


def client(b: BrokerProcess) -> RawStomp:
    c = RawStomp(b.host, b.port)
    c.connect()
    return c




def take(b: BrokerProcess, count: int, ack: set[int]) -> tuple[RawStomp, list[int], list[bool]]:
    """Subscribe with individual acks, receive ``count`` messages and ack those in ``ack``.

    Each ACK opens the prefetch window again, so more may follow: returned are the bodies and
    redelivered flags of every MESSAGE that came before the RECEIPT of a frame sent after the
    ACKs; whatever this consumer holds unacknowledged goes back when it or the broker goes."""
    c = client(b)
    c.send("SUBSCRIBE", {"destination": "/queue/order", "id": "s",
                         "ack": "client-individual", "activemq.prefetchSize": str(count)})
    frames = [c.recv() for _ in range(count)]
    assert all(f.command == "MESSAGE" for f in frames), frames[-1]
    for f in frames:
        if int(f.body) in ack:
            c.send("ACK", {"id": f.headers["ack"]})
    c.send("SUBSCRIBE", {"destination": "/queue/elsewhere", "id": "e", "receipt": "handled"})
    while (f := c.recv()).headers.get("receipt-id") != "handled":
        assert f.command == "MESSAGE", f
        frames.append(f)
    return c, [int(f.body) for f in frames], [f.headers.get("redelivered") == "true"
                                               for f in frames]


def give_back(c: RawStomp) -> None:
    """Unsubscribe (what the consumer holds unacknowledged goes back to the queue before the
    RECEIPT) and go."""
    c.send("UNSUBSCRIBE", {"id": "s", "receipt": "gone"})
    while c.recv().headers.get("receipt-id") != "gone":
        pass
    c.close()


def test_priority_and_fifo_order_survive_paging_redeliveries_acks_and_kill_9(
        broker_factory) -> None:
    b = broker_factory(config_text="[journal]\nsnapshot_records = 100000000\n")
    p = client(b)
    for i in range(N):
        p.send("SEND", {"destination": "/queue/order", "persistent": "true",
                        "priority": str(priority(i)), "receipt": str(i)}, str(i).encode())
    assert all(p.recv().command == "RECEIPT" for _ in range(N))
    p.close()
    acked: set[int] = set()

    # 1. A consumer takes the first 600 (priority 9), acks every third, goes away.
    c, got, _ = take(b, 600, ack=set(EXPECTED[:600:3]))
    assert got == EXPECTED[:len(got)]
    acked |= set(EXPECTED[:600:3])
    give_back(c)  # the rest of what it held goes back, each message to its own place
    left = [i for i in EXPECTED if i not in acked]
    c, got, redelivered = take(b, 50, ack=set())
    assert got == left[:50] and all(redelivered), "given back in place, marked redelivered"
    give_back(c)  # and back again

    # 2. Clean stop: the snapshot captures the backlog (column head, packed blocks behind).
    cycle = restart_cycle(b, kill=False)
    assert f"index snapshot written: {N - len(acked)} messages" in cycle

    # 3. What was given back still comes first, in order; this consumer reaches through
    # priority 0's head of column slots into its first packed block, acks every other message
    # and still holds the rest when the broker is killed: the journal tail after the snapshot
    # acks column slots before packed runs (what once put a packed block behind later ones).
    c, got, _ = take(b, 6000, ack=set(left[:6000:2]))
    assert got == left[:len(got)]
    acked |= set(left[:6000:2])
    cycle = restart_cycle(b, kill=True)
    assert f"index snapshot used: {N - 200} messages" in cycle, "the acks are in the tail"
    c.close()

    # 4. After the kill -9 and one more clean stop, the whole queue drains in order.
    restart_cycle(b, kill=False)
    left = [i for i in EXPECTED if i not in acked]
    d = client(b)
    d.send("SUBSCRIBE", {"destination": "/queue/order", "id": "d", "ack": "auto"})
    assert [int(d.recv().body) for _ in range(len(left))] == left
    d.send("UNSUBSCRIBE", {"id": "d", "receipt": "end"})
    assert d.recv().headers.get("receipt-id") == "end", "nothing more was queued"
