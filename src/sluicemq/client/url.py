"""Broker addresses: `stomp://host:port` is the one spelling every client tool accepts."""

from __future__ import annotations

from urllib.parse import urlsplit

DEFAULT_PORT = 61613
SCHEMES = frozenset({"stomp", "stomps"})


def parse_url(url: str) -> tuple[str, str, int]:
    """Split a broker URL into (scheme, host, port).

    A bare `host[:port]` is accepted as plain STOMP so a typo-free shorthand works on the
    command line; `stomps` is parsed now so configs stay valid once TLS lands.
    """
    text = url.strip()
    if "://" not in text:
        text = f"stomp://{text}"
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        raise ValueError(f"unsupported URL scheme {parts.scheme!r} in {url!r} (use stomp://)")
    try:
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"bad port in {url!r}") from exc
    host = parts.hostname
    if not host:
        raise ValueError(f"no host in {url!r}")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError(f"unexpected path or query in {url!r}")
    return scheme, host, port if port is not None else DEFAULT_PORT
