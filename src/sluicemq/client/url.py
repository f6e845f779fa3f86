"""Broker addresses: `stomp://host:port` is the one spelling every client tool accepts, and
`failover:(stomp://a:61613,stomp://b:61613)?options` (ActiveMQ's syntax) lists brokers that
share one data directory, to reconnect to in turn when the connection is lost."""

from __future__ import annotations

import os
import random
import ssl
import threading
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlsplit

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


Address = tuple[str, str, int]  # (scheme, host, port)
FAILOVER_PREFIX = "failover:"
# The longest a reconnect delay may be (ms): what a thread can wait (``threading.TIMEOUT_MAX``,
# ~292 years); a longer back-off raised OverflowError in the reader thread, whose failover ended.
LONGEST_DELAY_MS = int(threading.TIMEOUT_MAX * 1000)
_TRUE = frozenset({"true", "1", "yes", "on"})
_FALSE = frozenset({"false", "0", "no", "off"})


@dataclass(frozen=True, slots=True)
class FailoverOptions:
    """The options of a failover URL, named and defaulted as in ActiveMQ's failover transport
    (milliseconds; -1 attempts: retry forever)."""

    randomize: bool = True
    initialReconnectDelay: int = 10  # the URL options keep their camelCase spelling
    maxReconnectDelay: int = 30_000
    useExponentialBackOff: bool = True
    backOffMultiplier: float = 2.0
    maxReconnectAttempts: int = -1
    startupMaxReconnectAttempts: int = -1  # -1: bounded by the client's timeout

    def backoff(self, attempt: int) -> float:
        """Seconds to wait before reconnect attempt ``attempt`` (1-based) to the next round."""
        delay, cap = float(self.initialReconnectDelay), float(self.maxReconnectDelay)
        if self.useExponentialBackOff:
            try:
                delay *= self.backOffMultiplier ** max(attempt - 1, 0)
            except OverflowError:  # a long outage: attempt 1025 at x2 is past any float
                delay = cap
        return min(delay, cap) / 1000.0


@dataclass(frozen=True, slots=True)
class BrokerList:
    """Where a client may connect: one address, or several with failover options."""

    addresses: tuple[Address, ...]
    failover: FailoverOptions | None = None  # None: a plain URL, no reconnecting

    def ordered(self) -> list[Address]:
        """The addresses in the order to try them (shuffled with ``randomize``)."""
        out = list(self.addresses)
        if self.failover is not None and self.failover.randomize:
            random.shuffle(out)
        return out


def parse_brokers(url: str) -> BrokerList:
    """A plain broker URL, or ``failover:(url,url,...)?option=value&...`` (parentheses
    optional, as in ActiveMQ); unknown options and bad values raise ValueError."""
    text = url.strip()
    if not text.lower().startswith(FAILOVER_PREFIX):
        return BrokerList((parse_url(text),))
    rest = text[len(FAILOVER_PREFIX):]
    query = ""
    if rest.startswith("("):
        close = rest.find(")")
        if close < 0:
            raise ValueError(f"unbalanced parentheses in {url!r}")
        inner, tail = rest[1:close], rest[close + 1:]
        if tail and not tail.startswith("?"):
            raise ValueError(f"unexpected {tail!r} after the broker list in {url!r}")
        query = tail[1:]
    else:
        inner, _, query = rest.partition("?")
    addresses = tuple(parse_url(part) for part in inner.split(",") if part.strip())
    if not addresses:
        raise ValueError(f"no broker in {url!r}")
    return BrokerList(addresses, _failover_options(query, url))


def _failover_options(query: str, url: str) -> FailoverOptions:
    known = {name: type(getattr(FailoverOptions(), name))
             for name in FailoverOptions.__dataclass_fields__}
    values: dict[str, Any] = {}  # each of its field's type: converted by that type below
    for key, raw in parse_qsl(query, keep_blank_values=True, strict_parsing=False):
        kind = known.get(key)
        if kind is None:
            raise ValueError(f"unknown failover option {key!r} in {url!r} "
                             f"(known: {', '.join(sorted(known))})")
        try:
            if kind is bool:
                if raw.lower() not in _TRUE | _FALSE:
                    raise ValueError(raw)
                values[key] = raw.lower() in _TRUE
            else:
                values[key] = kind(raw)
        except ValueError:
            raise ValueError(f"bad value {raw!r} for failover option {key!r} in {url!r}") from None
    options = FailoverOptions(**values)
    # (``not >= 1`` refuses NaN too: its back-off was NaN, no pause at all between rounds)
    if not (0 <= options.initialReconnectDelay <= LONGEST_DELAY_MS
            and 0 <= options.maxReconnectDelay <= LONGEST_DELAY_MS
            and options.backOffMultiplier >= 1):
        raise ValueError(f"reconnect delays must be 0..{LONGEST_DELAY_MS} ms and "
                         f"backOffMultiplier >= 1 in {url!r}")
    return options


def format_address(address: Address) -> str:
    scheme, host, port = address
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"


def tls_context(given: ssl.SSLContext | None = None) -> ssl.SSLContext:
    """The context for a stomps:// connection: `given`, else one built from the environment.

    SLUICE_TLS_CA (CA file to trust instead of the system roots), SLUICE_TLS_CERT and
    SLUICE_TLS_KEY (a client certificate) and SLUICE_TLS_INSECURE=1 (no verification, for
    throwaway test brokers) let every CLI command speak TLS without extra flags.
    """
    if given is not None:
        return given
    from sluicemq.tls import client_context

    return client_context(os.environ.get("SLUICE_TLS_CA") or None,
                          os.environ.get("SLUICE_TLS_CERT") or None,
                          os.environ.get("SLUICE_TLS_KEY") or None,
                          verify=os.environ.get("SLUICE_TLS_INSECURE", "") not in ("1", "true"))
