"""Spec of ``Keepalive``, in process: one connection's heart-beat timer on the spec's clock and
timer (tests/inprocess.py), so time is moved, never waited for. The session it closes is a
real one of the in-process broker. When beats are owed and a peer is dead is the sans-IO
``HeartbeatMonitor`` (tests/protocol/test_heartbeat.py); the same over a socket:
tests/transport/test_tcp.py and tests/e2e/test_protocol.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from inprocess import Connection, InProcessBroker, config_for
from sluicemq.transport.keepalive import Keepalive


class Line:
    """A transport connection as ``Keepalive`` sees it: a session, when bytes last went each
    way (on the spec's clock), whether reading is paused, and the beats it was asked to send."""

    def __init__(self, node: InProcessBroker, conn: Connection) -> None:
        self.node = node
        self.conn = conn
        self.session = conn.session
        self.last_received = self.last_sent = node.clock.now
        self.reading_paused = False
        self.beats: list[float] = []  # when each heart-beat was sent

    @property
    def gone(self) -> bool:
        return self.session.closed

    def send_heartbeat(self) -> None:
        self.beats.append(self.node.clock.now - START)

    def keepalive(self, send_ms: int, expect_ms: int) -> Keepalive:
        return Keepalive(self, send_ms, expect_ms, clock=self.node.clock,
                         call_later=self.node.loop.call_later)


START = 1_800_000_000.0


@pytest.fixture
def node(tmp_path: Path) -> Iterator[InProcessBroker]:
    broker = InProcessBroker(config_for(tmp_path / "data"))
    broker.clock.now = START
    yield broker
    broker.close()


def test_a_beat_goes_out_after_each_whole_interval_we_were_quiet(node: InProcessBroker) -> None:
    line = Line(node, node.connect())
    line.keepalive(send_ms=1000, expect_ms=0)
    node.loop.advance(0.5)
    line.last_sent = node.clock.now  # a frame went out: it counts as a beat
    node.loop.advance(3.5)
    assert line.beats == [1.5, 2.5, 3.5]


def test_a_peer_silent_for_twice_its_interval_is_closed_with_an_error(
        node: InProcessBroker) -> None:
    line = Line(node, node.connect())
    line.keepalive(send_ms=0, expect_ms=1000)
    node.loop.advance(1.5)
    line.last_received = node.clock.now  # it spoke once
    node.loop.advance(2.0)
    assert not line.conn.out.closed  # 2 s of silence is still within twice the interval
    node.loop.advance(0.5)
    [error] = line.conn.take("ERROR")
    assert "heart-beat timeout" in error.headers["message"]
    assert line.conn.out.closed and line.session.closed


def test_silence_while_reading_is_paused_is_ours_not_the_peers(node: InProcessBroker) -> None:
    line = Line(node, node.connect())
    line.keepalive(send_ms=0, expect_ms=1000)
    line.reading_paused = True  # flow control holds its frames unread
    node.loop.advance(10.0)
    assert not line.conn.out.closed
    line.reading_paused = False
    node.loop.advance(2.5)
    assert line.conn.out.closed


def test_a_cancelled_keepalive_neither_beats_nor_closes(node: InProcessBroker) -> None:
    line = Line(node, node.connect())
    line.keepalive(send_ms=1000, expect_ms=1000).cancel()
    node.loop.advance(60.0)
    assert line.beats == [] and not line.conn.out.closed
