"""Is a browser request from our own pages?  Shared by the console and the WebSocket listener.

A hostile web page open in an operator's browser can make that browser send requests to a
broker on localhost or the intranet. Browsers say where a request comes from (Origin, and on
older ones Sec-Fetch-Site or Referer); scripts and CLIs send none of these, so a request without
them is not a browser's and is left to credentials. DNS rebinding (a hostile name resolving to
127.0.0.1) shows up as a Host that is not a loopback name on a listener bound to loopback.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from urllib.parse import urlsplit

LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain"})


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_refused(host: str, loopback_only: bool) -> str:
    """Why a request's Host header is refused ("" if it is fine)."""
    if loopback_only and not is_loopback(urlsplit(f"//{host}").hostname or ""):
        return "this listener answers only to a loopback Host name"
    return ""


def cross_site(headers: Mapping[str, str], host: str, allowed: Iterable[str] = ()) -> str:
    """Why a request did not come from a page of ``host`` itself or an ``allowed`` origin
    ("" if it did; "*" in ``allowed`` accepts every origin)."""
    allowed = set(allowed)
    origin = headers.get("Origin")
    if origin is not None:
        if urlsplit(origin).netloc == host or origin.rstrip("/") in allowed or "*" in allowed:
            return ""
        return f"Origin {origin[:100]!r} is not allowed"
    site = headers.get("Sec-Fetch-Site")
    if site is not None and site not in ("same-origin", "none"):
        return f"Sec-Fetch-Site {site[:30]!r}"
    referer = headers.get("Referer")
    if referer is not None and urlsplit(referer).netloc != host:
        return "Referer from another site"
    return ""
