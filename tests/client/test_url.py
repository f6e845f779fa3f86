"""Spec of broker URL parsing."""

from __future__ import annotations

import pytest

from sluicemq.client import parse_url
from sluicemq.client.url import BrokerList, FailoverOptions, parse_brokers


@pytest.mark.parametrize(("url", "expected"), [
    ("stomp://example.com:1234", ("stomp", "example.com", 1234)),
    ("stomp://example.com", ("stomp", "example.com", 61613)),
    ("STOMP://Example.com:1/", ("stomp", "example.com", 1)),
    ("stomps://secure.example:61614", ("stomps", "secure.example", 61614)),
    ("localhost:5555", ("stomp", "localhost", 5555)),
    ("stomp://[::1]:61613", ("stomp", "::1", 61613)),
])
def test_valid_urls(url: str, expected: tuple[str, str, int]) -> None:
    assert parse_url(url) == expected


@pytest.mark.parametrize("url", ["http://example.com", "stomp://", "stomp://h:notaport",
                                 "stomp://h:1/queue/x", "stomp://h:99999"])
def test_invalid_urls_are_rejected(url: str) -> None:
    with pytest.raises(ValueError):
        parse_url(url)


def test_a_failover_url_lists_brokers_and_activemq_options() -> None:
    """ActiveMQ's spelling, stomp:// and stomps:// mixed, options by their ActiveMQ names."""
    brokers = parse_brokers("failover:(stomp://a:61613,stomps://b)?randomize=false"
                            "&initialReconnectDelay=100&maxReconnectDelay=5000"
                            "&maxReconnectAttempts=-1")
    assert brokers.addresses == (("stomp", "a", 61613), ("stomps", "b", 61612))
    options = brokers.failover
    assert options is not None
    assert (options.randomize, options.initialReconnectDelay, options.maxReconnectDelay,
            options.maxReconnectAttempts) == (False, 100, 5000, -1)
    assert brokers.ordered() == list(brokers.addresses)  # randomize=false keeps the order


def test_failover_without_parentheses_and_defaults() -> None:
    brokers = parse_brokers("failover:stomp://a:1,stomp://b:2")
    assert brokers.addresses == (("stomp", "a", 1), ("stomp", "b", 2))
    assert brokers.failover == FailoverOptions()  # ActiveMQ's defaults: randomize, 10 ms, 30 s


def test_a_plain_url_has_no_failover() -> None:
    assert parse_brokers("stomp://h:7") == BrokerList((("stomp", "h", 7),))


def test_back_off_doubles_from_the_initial_delay_up_to_the_cap() -> None:
    options = parse_brokers("failover:(stomp://a)?initialReconnectDelay=100"
                            "&maxReconnectDelay=500").failover
    assert options is not None
    assert [options.backoff(n) for n in (1, 2, 3, 4, 5)] == [0.1, 0.2, 0.4, 0.5, 0.5]
    flat = parse_brokers("failover:(stomp://a)?useExponentialBackOff=false"
                         "&initialReconnectDelay=50").failover
    assert flat is not None and flat.backoff(7) == 0.05


def test_back_off_stays_at_the_cap_however_long_the_outage() -> None:
    """Attempt 1025 at x2 is past any float: the delay is the cap, not an OverflowError that
    would end the client's failover for good."""
    options = parse_brokers("failover:(stomp://a)?maxReconnectDelay=200").failover
    assert options is not None
    assert [options.backoff(n) for n in (1024, 1025, 10**6)] == [0.2, 0.2, 0.2]


@pytest.mark.parametrize("url", [
    "failover:()", "failover:(stomp://a", "failover:(http://a)", "failover:(stomp://a)x",
    "failover:(stomp://a)?nosuch=1", "failover:(stomp://a)?randomize=maybe",
    "failover:(stomp://a)?initialReconnectDelay=soon",
    "failover:(stomp://a)?backOffMultiplier=0.5",
    "failover:(stomp://a)?backOffMultiplier=nan",  # a NaN back-off: no pause between rounds
    "failover:(stomp://a)?maxReconnectDelay=10000000000000",  # past what a thread can wait
    "failover:(stomp://a)?initialReconnectDelay=10000000000000",
])
def test_bad_failover_urls_are_rejected_with_a_reason(url: str) -> None:
    with pytest.raises(ValueError):
        parse_brokers(url)
