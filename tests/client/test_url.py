"""Spec of broker URL parsing."""

from __future__ import annotations

import pytest

from sluicemq.client import parse_url


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
