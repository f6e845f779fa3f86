"""Spec of sluicemq.protocol.heartbeat: the heart-beat header, its negotiation, the timer."""

from __future__ import annotations

import pytest

from sluicemq.errors import ProtocolError
from sluicemq.protocol.heartbeat import DEAD_AFTER, HeartbeatMonitor, negotiate, parse_heart_beat


class TestParseHeartBeat:
    def test_two_integers(self) -> None:
        assert parse_heart_beat("1000,5000") == (1000, 5000)

    def test_missing_or_blank_header_means_no_heart_beats(self) -> None:
        assert parse_heart_beat(None) == (0, 0)
        assert parse_heart_beat("") == (0, 0)

    def test_spaces_around_numbers_are_tolerated(self) -> None:
        assert parse_heart_beat(" 10 , 20 ") == (10, 20)

    @pytest.mark.parametrize(
        "value",
        ["1000", "1,2,3", "a,b", "-1,0", "1.5,0", "+1,0", "1_0,0", ",", "\uff11,0", "0x10,0"],
    )
    def test_anything_else_is_a_protocol_error(self, value: str) -> None:
        with pytest.raises(ProtocolError, match="heart-beat"):
            parse_heart_beat(value)


class TestNegotiate:
    """negotiate(client=(cx, cy), server=(sx, sy)) -> (server sends every, server expects every)."""

    def test_each_direction_uses_the_larger_of_offer_and_wish(self) -> None:
        assert negotiate((4000, 1000), (2000, 3000)) == (2000, 4000)
        assert negotiate((500, 10000), (2000, 1000)) == (10000, 1000)

    def test_server_does_not_send_when_client_wants_none_or_server_cannot(self) -> None:
        assert negotiate((1000, 0), (5000, 5000)) == (0, 5000)
        assert negotiate((1000, 1000), (0, 5000)) == (0, 5000)

    def test_server_expects_nothing_when_client_cannot_send_or_server_wants_none(self) -> None:
        assert negotiate((0, 1000), (5000, 5000)) == (5000, 0)
        assert negotiate((1000, 1000), (5000, 0)) == (5000, 0)

    def test_all_zero_disables_heart_beating(self) -> None:
        assert negotiate((0, 0), (10000, 10000)) == (0, 0)


class TestHeartbeatMonitor:
    def test_sends_an_eol_after_a_quiet_send_interval(self) -> None:
        mon = HeartbeatMonitor(send_every_ms=1000, expect_every_ms=0, now=100.0)
        assert not mon.should_send(100.999)
        assert mon.should_send(101.0)

    def test_any_outgoing_traffic_resets_the_send_timer(self) -> None:
        mon = HeartbeatMonitor(1000, 0, now=100.0)
        mon.sent(100.8)
        assert not mon.should_send(101.5)
        assert mon.should_send(101.8)

    def test_peer_is_dead_after_twice_the_expected_interval_of_silence(self) -> None:
        assert DEAD_AFTER == 2.0
        mon = HeartbeatMonitor(0, 1000, now=50.0)
        assert not mon.peer_dead(51.5)
        assert not mon.peer_dead(52.0)
        assert mon.peer_dead(52.001)

    def test_any_incoming_bytes_keep_the_peer_alive(self) -> None:
        mon = HeartbeatMonitor(0, 1000, now=50.0)
        mon.received(51.9)
        assert not mon.peer_dead(53.5)
        assert mon.peer_dead(54.0)

    def test_tolerance_is_configurable(self) -> None:
        mon = HeartbeatMonitor(0, 1000, now=0.0, dead_after=1.5)
        assert not mon.peer_dead(1.5)
        assert mon.peer_dead(1.6)

    def test_disabled_directions_never_fire(self) -> None:
        mon = HeartbeatMonitor(0, 0, now=0.0)
        assert not mon.should_send(1e9)
        assert not mon.peer_dead(1e9)
        assert mon.next_deadline() is None

    def test_next_deadline_is_the_earliest_pending_event(self) -> None:
        mon = HeartbeatMonitor(1000, 3000, now=10.0)
        assert mon.next_deadline() == pytest.approx(11.0)
        mon.sent(10.5)
        mon.received(10.5)
        assert mon.next_deadline() == pytest.approx(11.5)
        only_expect = HeartbeatMonitor(0, 3000, now=10.0)
        assert only_expect.next_deadline() == pytest.approx(16.0)
