"""A small JSON client for the admin API, and a receipted SEND, shared by admin specs."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any


class ConsoleClient:
    """Calls the admin API and returns (status, decoded JSON) without raising on 4xx/5xx."""

    def __init__(self, base: str) -> None:
        self.base = base.rstrip("/")

    def request(self, method: str, path: str, body: Any = None,
                headers: dict[str, str] | None = None, raw: bytes | None = None
                ) -> tuple[int, Any]:
        h = {"Content-Type": "application/json"} if method == "POST" else {}
        h.update(headers or {})
        data = raw if raw is not None else (json.dumps(body).encode()
                                            if body is not None or method == "POST" else None)
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=h)
        try:
            with urllib.request.urlopen(req, timeout=15) as resp:
                payload, status = resp.read(), resp.status
        except urllib.error.HTTPError as exc:
            payload, status = exc.read(), exc.code
        try:
            return status, json.loads(payload)
        except ValueError:
            return status, payload

    def get(self, path: str) -> Any:
        status, data = self.request("GET", path)
        assert status == 200, (status, data)
        return data

    def post(self, path: str, body: Any = None, expect: int = 200) -> Any:
        status, data = self.request("POST", path, body if body is not None else {})
        assert status == expect, (status, data)
        return data

    def delete(self, path: str, expect: int = 200) -> Any:
        status, data = self.request("DELETE", path)
        assert status == expect, (status, data)
        return data

    def destination(self, kind: str, name: str) -> dict[str, Any] | None:
        for d in self.get("/api/destinations")["destinations"]:
            if d["kind"] == kind and d["name"] == name:
                return d
        return None

    def bodies(self, queue: str) -> list[str]:
        page = self.get(f"/api/destinations/queue/{queue}/messages?limit=1000")
        return [m["body_preview"] for m in page["messages"]]


def send(raw_conn: Any, destination: str, body: str, **headers: str) -> None:
    """SEND with a receipt and wait for it, so the message is routed (and on disk)."""
    receipt = f"r-{destination}-{body}"
    raw_conn.send("SEND", {"destination": destination, "receipt": receipt, **headers},
                  body.encode())
    frame = raw_conn.recv()
    assert frame.command == "RECEIPT" and frame.headers["receipt-id"] == receipt, frame
