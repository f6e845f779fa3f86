"""The console never lets a producer's bytes run in its origin, and every state-changing request
must come from the console's own pages (issue #16).

Every response - pages, static files, JSON, errors, /metrics - carries ``nosniff``, a
Content-Security-Policy and ``X-Frame-Options``; a message body opened raw is a sandboxed
download, whatever content type its producer gave it.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from console_client import send

Headers = dict[str, str]


def fetch(base: str, path: str, method: str = "GET", headers: Headers | None = None,
          body: bytes | None = None) -> tuple[int, Headers, bytes]:
    h = {"Content-Type": "application/json"} if method == "POST" else {}
    h.update(headers or {})
    req = urllib.request.Request(base + path, data=body if body is not None else (
        b"{}" if method == "POST" else None), method=method, headers=h)
    try:
        with urllib.request.urlopen(req, timeout=15) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


PATHS = ["/", "/streams", "/static/app.js", "/api/overview", "/metrics",
         "/api/destinations/queue/none", "/no/such/page"]


def test_every_response_carries_the_security_headers(broker) -> None:
    for path in PATHS:
        status, headers, _ = fetch(broker.console_url, path)
        assert status in (200, 404), path
        assert headers["X-Content-Type-Options"] == "nosniff", path
        assert headers["X-Frame-Options"] == "DENY", path
        csp = headers["Content-Security-Policy"]
        assert "default-src 'none'" in csp and "script-src 'self'" in csp, path
        assert "frame-ancestors 'none'" in csp, path


def test_a_raw_html_body_is_a_sandboxed_attachment_not_a_page(broker, raw) -> None:
    """Stored XSS: a producer's text/html body with a script must not render in the console's
    origin when an admin opens it raw."""
    producer = raw()
    producer.connect()
    send(producer, "/queue/web", "<script>fetch('/api/connections')</script>",
         **{"content-type": "text/html"})
    status, _, data = fetch(broker.console_url, "/api/destinations/queue/web/messages")
    assert status == 200
    mid = json.loads(data)["messages"][0]["mid"]
    status, headers, body = fetch(broker.console_url,
                                  f"/api/destinations/queue/web/messages/{mid}?raw=1")
    assert status == 200 and body.startswith(b"<script>")
    assert headers["Content-Disposition"].startswith("attachment;")
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert "sandbox" in headers["Content-Security-Policy"]
    assert "default-src 'none'" in headers["Content-Security-Policy"]


CROSS_SITE = [
    {"Origin": "http://evil.example"},
    {"Origin": "null"},
    {"Sec-Fetch-Site": "cross-site"},
    {"Sec-Fetch-Site": "same-site"},
    {"Referer": "http://evil.example/page"},
]


WRITES = [("POST", "/api/destinations/queue/x/purge"), ("POST", "/api/destinations/queue/x/send"),
          ("DELETE", "/api/destinations/queue/x"), ("DELETE", "/api/connections/nope")]


def test_state_changing_requests_from_other_sites_are_refused(broker, raw) -> None:
    producer = raw()
    producer.connect()
    send(producer, "/queue/x", "stays")
    for method, path in WRITES:
        for headers in CROSS_SITE:
            status, _, body = fetch(broker.console_url, path, method, headers)
            assert status == 403 and b"cross-origin request refused" in body, (path, headers)
    status, _, data = fetch(broker.console_url, "/api/destinations/queue/x")
    assert status == 200 and json.loads(data)["depth"] == 1  # nothing was done to it


def test_the_consoles_own_pages_and_scripts_may_change_state(broker, raw) -> None:
    producer = raw()
    producer.connect()
    send(producer, "/queue/y", "gone")
    own = broker.console_url
    for headers in ({"Origin": own}, {"Sec-Fetch-Site": "same-origin", "Referer": own + "/"},
                    {}):
        status, _, body = fetch(own, "/api/destinations/queue/y/purge", "POST", headers)
        assert status == 200, body
