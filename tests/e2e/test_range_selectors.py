"""Spec: a range read with a ``selector`` header sends only the messages the selector matches
(as an ActiveMQ queue browser with a selector does), per message and in column batches, wherever
the messages are (paged out to the journal, in memory, in a transaction's record), and never
consumes anything. Where a selector would mislead (a head query's count, a commit that removes
its whole range, a streams read) it is refused with an ERROR the client can read."""

from __future__ import annotations

import json
from typing import Any

import pytest
from stomp_helpers import connect

from sluicemq.client import Client
from sluicemq.errors import ClientError

PAGED = """
[[policy]]
queue = ">"
cursor_window = 50
"""


def per_message(c: Client, destination: str, **kw: Any) -> list[tuple[int, str, str]]:
    with c.read_range(destination, **kw) as rng:
        return [(m.seq or 0, m.headers["region"], m.text()) for m in rng]


def as_columns(c: Client, destination: str, **kw: Any) -> list[tuple[int, str, str]]:
    out: list[tuple[int, str, str]] = []
    with c.read_range(destination, batch_bytes=64 << 10, **kw) as rng:
        for b in rng.batches():
            for i, seq in enumerate(b.seq):
                out.append((seq, json.loads(b.headers_json(i))["region"],
                            b.body_of(i).decode()))
    return out


def test_a_read_sends_only_what_its_selector_matches_in_either_form(broker_factory) -> None:
    b = broker_factory(config_text=PAGED)
    with Client(b.url) as c:
        for i in range(600):  # most paged out: the cursor keeps 50 in memory
            c.send("/queue/sel", f"m{i}", {"region": ("EU", "US", "APAC")[i % 3]})
        with c.transaction() as tx:
            for i in range(6):
                tx.send("/queue/sel", f"t{i}", {"region": ("EU", "US")[i % 2]})
        everything = per_message(c, "/queue/sel")
        eu = [row for row in everything if row[1] == "EU"]
        assert len(everything) == 606 and len(eu) == 203
        assert per_message(c, "/queue/sel", selector="region = 'EU'") == eu
        assert as_columns(c, "/queue/sel", selector="region = 'EU'") == eu
        assert as_columns(c, "/queue/sel", selector="region IN ('EU', 'APAC')") == [
            row for row in everything if row[1] in ("EU", "APAC")]
        assert as_columns(c, "/queue/sel", selector="region = 'nowhere'") == []
        assert as_columns(c, "/queue/sel") == everything, "browsing consumed nothing"


def test_max_and_the_end_frame_count_what_was_sent(broker) -> None:
    with Client(broker.url) as c:
        for i in range(40):
            c.send("/queue/selmax", f"m{i}", {"region": "EU" if i % 4 == 0 else "US"})
        with c.read_range("/queue/selmax", selector="region = 'EU'", max_messages=3) as rng:
            got = [m.text() for m in rng]
            head = rng.head
        assert got == ["m0", "m4", "m8"]
        assert head is not None and head.count == 3
        rest = per_message(c, "/queue/selmax", start=head.end, selector="region = 'EU'")
        assert [body for _seq, _r, body in rest] == [f"m{i}" for i in range(12, 40, 4)]


def test_a_queue_browser_with_a_selector_through_stomp_py(broker) -> None:
    conn, listener = connect(broker)
    for i in range(6):
        conn.send("/queue/selpy", f"p{i}", headers={"persistent": "true",
                                                     "kind": "odd" if i % 2 else "even"})
    conn.subscribe("/queue/selpy", id="b", headers={"browser": "true",
                                                     "selector": "kind = 'odd'"})
    frames = [listener.next() for _ in range(4)]
    assert [f.body for f in frames[:3]] == ["p1", "p3", "p5"]
    assert frames[3].headers["browser"] == "end" and frames[3].headers["sluice-count"] == "3"
    conn.disconnect()


@pytest.mark.parametrize(("headers", "says"), [
    ({"selector": "region = = 'EU'"}, "invalid selector"),
    ({"selector": "a = 1", "sluice-head-only": "true"}, "selector applies to a range read"),
    ({"selector": "a = 1", "sluice-commit-upto": "5", "sluice-ledger": "l"},
     "selector applies to a range read"),
    ({"selector": "a = 1", "sluice-streams": "complete"}, "selector applies to a range read"),
])
def test_a_selector_where_it_would_mislead_is_an_error(raw, headers, says) -> None:
    c = raw()
    c.connect()
    c.send("SUBSCRIBE", {"destination": "/queue/selbad", "id": "r", "browser": "true",
                         "receipt": "x", **headers})
    err = c.recv()
    assert err.command == "ERROR" and says in err.headers["message"], err
    c.send("SEND", {"destination": "/queue/selbad", "receipt": "ok"}, b"still serving")
    assert c.recv().headers == {"receipt-id": "ok"}


def test_our_client_raises_the_error(broker) -> None:
    with Client(broker.url) as c, pytest.raises(ClientError, match="invalid selector"):
        c.read_range("/queue/selerr", selector="region = = 'EU'").result()
