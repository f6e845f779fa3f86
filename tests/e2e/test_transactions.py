"""Transactions: SEND and ACK inside BEGIN…COMMIT apply atomically; ABORT discards."""

from __future__ import annotations

from stomp_helpers import connect, nothing_delivered, send_with_receipt, wait_receipt

from sluicemq import Client


def test_sends_are_invisible_until_commit(broker) -> None:
    c, lc = connect(broker)
    c.subscribe("/queue/tx", id="s")
    p, lp = connect(broker)
    tx = p.begin()
    for i in range(3):
        p.send("/queue/tx", f"t{i}", transaction=tx, receipt=f"t{i}",
               headers={"persistent": "true"})
        wait_receipt(lp, f"t{i}")
    assert nothing_delivered(c, lc)
    p.commit(tx, receipt="c")
    assert lp.receipts.get(timeout=5) == "c"
    assert [lc.next().body for _ in range(3)] == ["t0", "t1", "t2"]


def test_abort_discards_sends(broker) -> None:
    p, lp = connect(broker)
    tx = p.begin()
    p.send("/queue/txa", "never", transaction=tx)
    p.abort(tx)
    send_with_receipt(p, lp, "/queue/txa", "after", "r")
    with Client(broker.url) as q:
        assert q.head("/queue/txa").count == 1, "the aborted SEND is not in the queue"
    c, lc = connect(broker)
    c.subscribe("/queue/txa", id="s")
    assert lc.next().body == "after"


def test_transactional_ack_takes_effect_on_commit_only(broker) -> None:
    p, lp = connect(broker)
    send_with_receipt(p, lp, "/queue/txack", "m", "r", persistent="true")
    c, lc = connect(broker)
    c.subscribe("/queue/txack", id="s", ack="client-individual")
    f = lc.next()
    tx = c.begin()
    c.ack(f.headers["ack"], transaction=tx)
    c.abort(tx)
    c.disconnect()  # ack was aborted: the message comes back
    c2, lc2 = connect(broker)
    c2.subscribe("/queue/txack", id="s", ack="client-individual")
    f2 = lc2.next()
    assert f2.body == "m"
    tx2 = c2.begin()
    c2.ack(f2.headers["ack"], transaction=tx2)
    c2.commit(tx2, receipt="commit")
    wait_receipt(lc2, "commit")  # the ACK inside it is durable
    c2.disconnect()
    with Client(broker.url) as q:
        assert q.head("/queue/txack").count == 0, "the committed ACK consumed it"


def test_disconnect_discards_open_transaction(broker) -> None:
    p, _ = connect(broker)
    tx = p.begin()
    p.send("/queue/txd", "x", transaction=tx)
    p.disconnect()
    with Client(broker.url) as q:
        assert q.head("/queue/txd").count == 0


def test_committed_transaction_survives_kill(broker) -> None:
    p, lp = connect(broker)
    tx = p.begin()
    for i in range(4):
        p.send("/queue/txk", f"k{i}", transaction=tx, headers={"persistent": "true"})
    p.commit(tx, receipt="c")
    assert lp.receipts.get(timeout=5) == "c"
    uncommitted = p.begin()
    p.send("/queue/txk", "no", transaction=uncommitted, headers={"persistent": "true"})
    broker.kill()
    broker.restart()
    with Client(broker.url) as q:
        assert q.head("/queue/txk").count == 4, "the uncommitted SEND is not in the queue"
    c, lc = connect(broker)
    c.subscribe("/queue/txk", id="s")
    assert [lc.next().body for _ in range(4)] == ["k0", "k1", "k2", "k3"]


def test_large_transaction_is_spooled_not_held(broker) -> None:
    p, lp = connect(broker)
    tx = p.begin()
    chunk = b"z" * (256 << 10)
    for _ in range(40):  # 10 MiB inside one transaction: spills to disk, several TX records
        p.send("/queue/txbig", chunk, transaction=tx, headers={"persistent": "true"})
    p.commit(tx, receipt="c")
    assert lp.receipts.get(timeout=30) == "c"
    broker.kill()
    broker.restart()
    c, lc = connect(broker)
    c.subscribe("/queue/txbig", id="s")
    got = [lc.next(timeout=20) for _ in range(40)]
    assert all(len(f.body) == len(chunk) for f in got)
