"""Operators see each login's share of the store (``[limits] user_store_limit``) in the admin
API (``/api/users``, and the overview's ``user_shares``) and in /metrics: stored body bytes and
messages per user, counted once per record and given back by every way a message leaves -
acknowledgement, purge, admin delete, expiry - and kept by a move to the DLQ. With security
off every client is one user, ``anonymous``."""

from __future__ import annotations

from typing import Any

from console_client import ConsoleClient
from test_metrics import scrape, value

from sluicemq.client import Client

CONFIG = """
[limits]
user_store_limit = "1 MiB"

[[policy]]
queue = "dl.>"
dead_letter_expired = true
"""
KIB = b"k" * 1024


def anonymous(console: ConsoleClient) -> dict[str, int]:
    users = console.get("/api/users")
    assert users["user_store_limit"] == 1 << 20
    found = [u for u in users["users"] if u["user"] == "anonymous"]
    return {"bytes": found[0]["bytes"], "messages": found[0]["messages"]} if found else {}


def test_a_topic_record_held_by_two_durable_subscriptions_counts_once(
        broker_factory: Any) -> None:
    """Charged once while either holds it: one acknowledges all, the other is removed."""
    broker = broker_factory(config_text=CONFIG)
    console = ConsoleClient(broker.console_url)
    with Client(broker.url, client_id="shares", timeout=10) as c:
        subs = [c.subscribe("/topic/t", durable_name=name, ack="client-individual")
                for name in ("one", "two")]
        for i in range(3):
            c.send("/topic/t", KIB, persistent=True, headers={"n": str(i)})
        assert anonymous(console) == {"bytes": 3072, "messages": 3}
        for m in [subs[0].get(timeout=10) for _ in range(3)]:
            assert m is not None
            m.ack()
        c.send("/queue/sync", b"", persistent=False)  # the acks were handled before this
        assert anonymous(console) == {"bytes": 3072, "messages": 3}  # two still hold them
        subs[1].unsubscribe(durable=True)  # removed with all it held (one UNSUB record)
        c.send("/queue/sync", b"", persistent=False)
        assert anonymous(console) == {"bytes": 0, "messages": 0}
    overview = console.get("/api/overview")["user_shares"]
    assert overview["user_store_limit"] == 1 << 20


def test_purge_delete_and_expiry_give_the_room_back_and_a_dlq_move_keeps_it(
        broker_factory: Any) -> None:
    broker = broker_factory(config_text=CONFIG)
    console = ConsoleClient(broker.console_url)
    with Client(broker.url, timeout=10) as c:
        for i in range(5):
            c.send("/queue/p", KIB, persistent=True, headers={"n": str(i)})
        c.send("/queue/e", KIB, persistent=True, headers={"expires": "1"})  # long past
        c.send("/queue/dl.q", KIB, persistent=True, headers={"expires": "1"})
        assert anonymous(console) == {"bytes": 7168, "messages": 7}
        families = scrape(broker.console_url)
        assert value(families["sluice_user_store_bytes"], user="anonymous") == 7168
        assert value(families["sluice_user_store_messages"], user="anonymous") == 7

        first = console.get("/api/destinations/queue/p/messages?limit=1")["messages"][0]
        console.delete(f"/api/destinations/queue/p/messages/{first['mid']}")
        assert anonymous(console)["bytes"] == 6144
        assert console.post("/api/destinations/queue/p/purge") == {"removed": 4}
        assert anonymous(console)["bytes"] == 2048

        for name in ("e", "dl.q"):  # a consumer makes the expired messages leave
            sub = c.subscribe(f"/queue/{name}")
            c.send("/queue/sync", b"", persistent=False)  # after the dispatch pass it caused
            sub.unsubscribe()
        # the expired one in /queue/e is gone; the other moved to DLQ.dl.q, still stored
        assert anonymous(console) == {"bytes": 1024, "messages": 1}
        dlq = c.subscribe("/queue/DLQ.dl.q", ack="client-individual")
        m = dlq.get(timeout=10)
        assert m is not None
        m.ack()
        c.send("/queue/sync", b"", persistent=False)
        assert anonymous(console) == {"bytes": 0, "messages": 0}


def test_a_parked_part_counts_from_its_commit_and_its_messages_once_published(
        broker_factory: Any) -> None:
    """Staged messages are stored (and charged) while parked, charged one by one once
    published (a topic's to each durable subscription once), and an ABORT gives a batch's
    parts back."""
    broker = broker_factory(config_text=CONFIG)
    console = ConsoleClient(broker.console_url)
    with Client(broker.url, client_id="stager", timeout=10) as c:
        subs = [c.subscribe("/topic/st", durable_name=name, ack="client-individual")
                for name in ("one", "two")]
        with c.stage("sink", "b1", "p0") as part:
            for _ in range(3):
                part.send("/queue/staged", KIB)
            part.send("/topic/st", KIB)
        with c.stage("sink", "b2", "p0") as other:
            other.send("/queue/staged", KIB)
        assert anonymous(console) == {"bytes": 5120, "messages": 5}
        assert c.abort_stage("sink", "b2") == 1
        assert anonymous(console) == {"bytes": 4096, "messages": 4}
        assert c.publish_stage("sink", "b1", ["p0"]) == ("published", 4)
        assert anonymous(console) == {"bytes": 4096, "messages": 4}
        got = [sub.get(timeout=10) for sub in subs]
        for m, left in zip(got, (4096, 3072), strict=True):
            assert m is not None
            m.ack()
            c.send("/queue/sync", b"", persistent=False)  # the ack was handled before this
            assert anonymous(console)["bytes"] == left  # the last holder gives it back
        sub = c.subscribe("/queue/staged")
        for _ in range(3):
            assert sub.get(timeout=10) is not None
        c.send("/queue/sync", b"", persistent=False)
        assert anonymous(console) == {"bytes": 0, "messages": 0}
