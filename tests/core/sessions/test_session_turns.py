"""Spec of how a session shares the event loop (core/limits/turns.py through a real Session,
in process): a connection pipelining thousands of frames is handled a turn's budget at a
time, with reading paused in between, and a light client's frame sent meanwhile is handled
at once - not after the heavy connection's backlog. Loop time is a hand-moved clock: each
reading of it costs 0.5 ms."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from inprocess import InProcessBroker, config_for
from sluicemq.core.limits.turns import BUDGET
from sluicemq.protocol.codec import encode_frame
from sluicemq.protocol.frames import Frame

TICK = 0.0005


class SteppingClock:
    """Every reading moves time on by ``TICK``: work costs time, deterministically."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += TICK
        return self.now


@pytest.fixture
def node(tmp_path: Path) -> Iterator[InProcessBroker]:
    broker = InProcessBroker(config_for(tmp_path / "data"))
    broker.broker.turns.clock = SteppingClock()
    yield broker
    broker.close()


def pipelined(count: int, first: int = 0) -> bytes:
    return b"".join(encode_frame(Frame("SEND", {"destination": "/queue/flood",
                                                "receipt": f"h{i}"}, b"x"), "1.2")
                    for i in range(first, first + count))


def receipts(conn: object, count: int, node: InProcessBroker) -> list[str]:
    """The first ``count`` receipt ids ``conn`` was sent, in the order they came."""
    node.loop.run_until(lambda: sum(f.command == "RECEIPT" for f in conn.frames()) >= count)
    return [f.headers["receipt-id"] for f in conn.take("RECEIPT")]


def test_a_pipelining_connection_is_handled_in_slices_with_reading_paused(
        node: InProcessBroker) -> None:
    heavy = node.connect(peer="heavy:1")
    heavy.session.feed(pipelined(2000))  # one read, as a socket would deliver it
    handled = len(node.broker.queues["flood"].pending)
    assert 0 < handled < 2000
    assert heavy.out.paused  # TCP holds the client back while its frames wait
    node.loop.run()  # later turns
    assert len(node.broker.queues["flood"].pending) == 2000
    assert not heavy.out.paused
    assert receipts(heavy, 2000, node) == [f"h{i}" for i in range(2000)]


def test_one_turn_handles_a_budget_of_input_however_many_connections_pipeline(
        node: InProcessBroker) -> None:
    """Twenty busy connections each deliver a read of 500 frames in the same turn: together
    they get the turn's budget, not 20 x their own share."""
    conns = [node.connect(peer=f"heavy:{i}") for i in range(20)]
    for conn in conns:
        conn.session.use.used, conn.session.use.used_at = 1.0, node.broker.turns.clock()
    for i, conn in enumerate(conns):
        conn.session.feed(pipelined(500, i * 500))
    assert len(node.broker.queues["flood"].pending) * TICK < 2 * BUDGET
    assert all(c.out.paused for c in conns[1:])
    node.loop.run()
    assert len(node.broker.queues["flood"].pending) == 10_000


def test_a_light_clients_frame_does_not_wait_behind_a_heavy_backlog(
        node: InProcessBroker) -> None:
    heavy = node.connect(peer="heavy:1")
    light = node.connect(peer="light:1")
    for first in (0, 1000, 2000):  # far more than its share of the loop
        heavy.session.feed(pipelined(1000, first))
    light.session.feed(encode_frame(Frame("SEND", {"destination": "/queue/mine"}, b"hi"), "1.2"))
    assert len(node.broker.queues["mine"].pending) == 1  # handled in this very turn
    assert len(node.broker.queues["flood"].pending) < 3000  # while heavy input still waits
    node.loop.run()
    assert len(node.broker.queues["flood"].pending) == 3000  # none of it lost, in order:
    assert receipts(heavy, 3000, node) == [f"h{i}" for i in range(3000)]


def test_a_storm_of_connections_from_one_address_is_one_client(node: InProcessBroker) -> None:
    """Two hundred connections of one address, each with a few frames, share one use of the
    loop: once it is spent their input waits, while another address's frame goes at once."""
    storm = [node.connect(peer=f"storm:{i}") for i in range(200)]
    assert len({id(c.session.use) for c in storm}) == 1
    for i, conn in enumerate(storm):
        conn.session.feed(pipelined(5, i * 5))
    assert any(c.out.paused for c in storm)  # the address had its share of the turn
    probe = node.connect(peer="probe:1")
    probe.session.feed(encode_frame(Frame("SEND", {"destination": "/queue/mine"}, b"hi"),
                                    "1.2"))
    assert len(node.broker.queues["mine"].pending) == 1  # handled in this very turn
    node.loop.run()
    assert len(node.broker.queues["flood"].pending) == 1000


def topic_sends(count: int) -> bytes:
    return b"".join(encode_frame(Frame("SEND", {"destination": "/topic/fan"}, b"%d" % i), "1.2")
                    for i in range(count))


def test_a_send_to_many_ready_subscribers_pays_for_its_deliveries_in_the_turn(
        node: InProcessBroker) -> None:
    """Dispatch runs after the input that caused it: a SEND to a topic with forty ready
    subscribers is forty deliveries later in the turn. They count against the publisher's
    share of it now, so its next SENDs wait for a later turn; none is lost or reordered."""
    subscribers = [node.connect(peer=f"sub{i}:1") for i in range(40)]
    for i, sub in enumerate(subscribers):
        sub.request("SUBSCRIBE", {"destination": "/topic/fan", "id": str(i)})
    node.broker.turns.delivery = TICK  # what a delivery takes, as dispatch measured it
    publisher = node.connect(peer="publisher:1")
    publisher.session.feed(topic_sends(20))
    assert node.broker.topics["fan"].published == 1  # 39 deliveries owed: the turn is spent
    assert publisher.out.paused
    node.loop.run()
    for sub in subscribers:
        assert [m.body for m in sub.messages(20)] == [b"%d" % i for i in range(20)]


def test_a_send_to_one_subscriber_owes_nothing_beyond_itself(node: InProcessBroker) -> None:
    sub = node.connect(peer="sub:1")
    sub.request("SUBSCRIBE", {"destination": "/topic/fan", "id": "0"})
    node.broker.turns.delivery = TICK
    publisher = node.connect(peer="publisher:1")
    publisher.session.feed(topic_sends(20))
    assert node.broker.topics["fan"].published > 1
