"""Advisory topics, in process: what ``Advisories`` publishes for each broker event, and that
it builds nothing when no one listens. The broker's publication is a list here; the topics
as clients see them over the wire: tests/e2e/test_activemq_compat.py."""

from __future__ import annotations

import itertools
import json

from sluicemq.core.routing.advisories import PREFIX, Advisories
from sluicemq.core.routing.message import Message


class Board:
    """An ``Advisories`` whose publication lands in ``published``; ``listening`` says which
    advisory topics have a subscriber (all, by default); its clock is ``now`` (seconds)."""

    def __init__(self, listening: set[str] | None = None, enabled: bool = True) -> None:
        self.now = 1_800_000_000.25
        self.published: list[tuple[str, Message]] = []
        self.asked: list[str] = []
        ids = itertools.count(1)

        def listens(topic: str) -> bool:
            self.asked.append(topic)
            return listening is None or topic in listening

        self.advisories = Advisories(enabled, listens,
                                     lambda topic, m: self.published.append((topic, m)),
                                     lambda: next(ids), clock=lambda: self.now)

    def topics(self) -> list[str]:
        return [t.removeprefix(PREFIX) for t, _ in self.published]

    def last(self) -> tuple[dict[str, str], dict[str, object]]:
        _, m = self.published[-1]
        assert m.body is not None
        return m.headers, json.loads(bytes(m.body))


def test_a_consumer_advisory_carries_its_facts_as_headers_and_json() -> None:
    board = Board()
    board.advisories.consumer("added", "queue", "orders", "conn-7", "sub-1")
    (topic, message), = board.published
    assert topic == f"{PREFIX}Consumer.Queue.orders"
    assert message.destination == f"/topic/{topic}" and not message.persistent
    headers, body = board.last()
    assert headers["advisory-type"] == "ConsumerInfo" and headers["event"] == "added"
    # facts named like a MESSAGE's own headers are prefixed, the rest kept as they are
    assert headers["advisory-destination"] == "/queue/orders"
    assert headers["advisory-subscription"] == "sub-1" and headers["connection"] == "conn-7"
    assert body["type"] == "ConsumerInfo" and body["destination"] == "/queue/orders"
    assert body["subscription"] == "sub-1"


def test_an_advisory_is_stamped_by_the_brokers_clock() -> None:
    board = Board()
    board.advisories.connection("added", "c1", "10.0.0.7:4000", None)
    board.now += 90
    board.advisories.connection("removed", "c1", "10.0.0.7:4000", None)
    stamps = [(m.timestamp, m.headers["timestamp"], json.loads(bytes(m.body or b""))["time"])
              for _, m in board.published]
    assert stamps == [(1_800_000_000_250, "1800000000250", 1_800_000_000_250),
                      (1_800_000_090_250, "1800000090250", 1_800_000_090_250)]


def test_nothing_is_built_for_a_topic_nobody_listens_to_or_when_disabled() -> None:
    board = Board(listening={f"{PREFIX}Connection"})
    board.advisories.consumer("added", "topic", "prices", "c1", "s1")
    board.advisories.connection("added", "c1", "10.0.0.7:4000", "ops")
    assert board.topics() == ["Connection"] and board.advisories.published == 1
    off = Board(enabled=False)
    off.advisories.connection("added", "c1", "10.0.0.7:4000", None)
    off.advisories.producer("c1", "queue", "q")
    assert off.published == [] and off.asked == []


def test_a_connection_is_advised_as_the_producer_of_each_destination_once_until_it_ends(
        ) -> None:
    board = Board()
    for _ in range(3):
        board.advisories.producer("c1", "queue", "orders")
    board.advisories.producer("c1", "topic", "prices")
    board.advisories.producer("c2", "queue", "orders")
    assert board.topics() == ["Producer.Queue.orders", "Producer.Topic.prices",
                              "Producer.Queue.orders"]
    board.published.clear()
    board.advisories.connection_ended("c1")
    assert sorted(board.topics()) == ["Producer.Queue.orders", "Producer.Topic.prices"]
    assert {m.headers["event"] for _, m in board.published} == {"removed"}
    assert {m.headers["connection"] for _, m in board.published} == {"c1"}
    board.published.clear()
    board.advisories.connection_ended("c1")  # ended once: nothing left to advise about
    assert board.published == []


def test_wildcard_consumers_advisory_topics_and_the_brokers_own_queues_are_not_advised() -> None:
    board = Board()
    board.advisories.consumer("added", "queue", "orders.>", "c1", "s1")
    board.advisories.destination("added", "topic", f"{PREFIX}Connection")
    board.advisories.destination("added", "queue", "sluice.scheduler.3")
    assert board.published == []
    board.advisories.destination("added", "queue", "orders")
    board.advisories.destination("removed", "topic", "prices")
    assert board.topics() == ["Queue", "Topic"]
    assert [m.headers["event"] for _, m in board.published] == ["added", "removed"]


def test_expired_and_dead_lettered_messages_are_advised_one_by_one() -> None:
    board = Board()
    board.advisories.expired("/queue/orders", ["m-1", "m-2"])
    board.advisories.dead_lettered("/topic/prices", "/queue/DLQ.prices", "m-3", "max deliveries")
    assert board.topics() == ["Expired.Queue.orders", "Expired.Queue.orders",
                              "MessageDLQd.Topic.prices"]
    assert [m.headers["advisory-message-id"] for _, m in board.published] == ["m-1", "m-2",
                                                                              "m-3"]
    headers, body = board.last()
    assert headers["event"] == "dead-lettered" and headers["dlq"] == "/queue/DLQ.prices"
    assert body["reason"] == "max deliveries"
