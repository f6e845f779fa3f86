"""Broker addresses: `stomp://host:port` is the one spelling every client tool accepts."""

from __future__ import annotations

import os
import ssl
from urllib.parse import urlsplit

DEFAULT_PORT = 61613
DEFAULT_TLS_PORT = 61612
SCHEMES = frozenset({"stomp", "stomps"})


def parse_url(url: str) -> tuple[str, str, int]:
    """Split a broker URL into (scheme, host, port).

    A bare `host[:port]` is accepted as plain STOMP so a typo-free shorthand works on the
    command line; `stomps` (STOMP over TLS) defaults to port 61612.
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
    if port is None:
        port = DEFAULT_TLS_PORT if scheme == "stomps" else DEFAULT_PORT
    return scheme, host, port


def tls_context(given: ssl.SSLContext | None = None) -> ssl.SSLContext:
    """The context for a stomps:// connection: `given`, else one built from the environment.

    SLUICE_TLS_CA (CA file to trust instead of the system roots), SLUICE_TLS_CERT and
    SLUICE_TLS_KEY (a client certificate) and SLUICE_TLS_INSECURE=1 (no verification, for
    throwaway test brokers) let every CLI command speak TLS without extra flags.
    """
    if given is not None:
        return given
    from sluicemq.transport.tls import client_context

    return client_context(os.environ.get("SLUICE_TLS_CA") or None,
                          os.environ.get("SLUICE_TLS_CERT") or None,
                          os.environ.get("SLUICE_TLS_KEY") or None,
                          verify=os.environ.get("SLUICE_TLS_INSECURE", "") not in ("1", "true"))
