"""The web console in headless Chromium: live depths, browsing, purging, stream progress.

Needs Debian's chromium at /usr/bin/chromium and the `playwright` package (`make test`
installs both in CI); without them the specs skip and say why.
"""

from __future__ import annotations

import hashlib
import json
import os
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]

sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is missing")
if not os.path.exists(CHROMIUM):
    pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium)", allow_module_level=True)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    pg.on("dialog", lambda dialog: dialog.accept())  # confirm() before purge
    yield pg
    context.close()
    assert not errors, f"JavaScript errors: {errors}"


def send(conn: Any, destination: str, body: bytes, **headers: str) -> None:
    conn.send("SEND", {"destination": destination, "receipt": "r", "persistent": "true",
                       **headers}, body)
    frame = conn.recv()
    assert frame.command == "RECEIPT", frame


def test_destinations_page_follows_depth_then_browse_and_purge(broker, raw, page) -> None:
    expect = sync_api.expect
    conn = raw()
    conn.connect()
    send(conn, "/queue/web", b"first body", color="green")
    page.goto(f"{broker.console_url}/destinations")
    depth = page.locator('tr[data-name="web"] td.depth')
    expect(depth).to_have_text("1")
    for i in range(4):
        send(conn, "/queue/web", f"more {i}".encode())
    expect(depth).to_have_text("5")  # the page polls: no reload

    page.fill("#filter", "nothing-matches")
    expect(page.locator('tr[data-name="web"]')).to_have_count(0)
    page.fill("#filter", "we")
    page.click('tr[data-name="web"] a')
    expect(page.locator("#title")).to_have_text("/queue/web")
    expect(page.locator("#page-info")).to_have_text("1\u20135 of 5 waiting")

    page.locator("tr.msg a").first.click()
    expect(page.locator("pre.body")).to_have_text("first body")
    expect(page.locator("pre.headers")).to_contain_text("color: green")

    page.click("#purge")
    expect(page.locator("#page-info")).to_have_text("no waiting messages")
    expect(page.locator("#card-depth .value")).to_have_text("0")

    for path in ("/", "/streams", "/connections"):
        page.goto(f"{broker.console_url}{path}")
        expect(page.locator("#status")).to_contain_text("updated")
        if path == "/":  # every [limits] setting, by the name an ERROR gives it
            limits = page.locator("#card-configured-limits")
            expect(limits).to_contain_text("connect_timeout 10")
            expect(limits).to_contain_text("max_frame_bytes 64.0 MiB")
            expect(page.locator("#card-user-shares")).to_contain_text(
                "user_store_limit not set")


def test_overview_shows_each_users_share_of_the_store(broker_factory, page) -> None:
    """With ``user_store_limit`` set the overview lists each user's stored bytes (security off:
    every client is ``anonymous``)."""
    from sluicemq.client import Client

    broker = broker_factory(config_text='[limits]\nuser_store_limit = "1 MiB"\n')
    with Client(broker.url, timeout=10) as c:
        c.send("/queue/kept", b"x" * 1024, persistent=True)
    page.goto(f"{broker.console_url}/")
    shares = page.locator("#card-user-shares")
    sync_api.expect(shares).to_contain_text("≤ 1.0 MiB")
    sync_api.expect(shares).to_contain_text("anonymous 1.0 KiB in 1")


def test_streams_page_shows_progress_of_a_stream(broker, raw, page) -> None:
    with urllib.request.urlopen(f"{broker.console_url}/api/streams", timeout=5) as resp:
        if not json.loads(resp.read())["available"]:
            pytest.skip("this broker has no large streams yet (broker.streams is missing)")
    from sluicemq.streaming.manifest import ChunkInfo

    expect = sync_api.expect
    conn = raw()
    conn.connect()
    chunk = b"x" * 1000
    data = chunk * 3
    for seq in range(2):
        send(conn, "/queue/files", chunk,
             **ChunkInfo("st-1", seq, seq * len(chunk), "big.bin").headers())
    page.goto(f"{broker.console_url}/streams")
    row = page.locator('tr.stream[data-id="st-1"]')
    expect(row).to_have_attribute("data-state", "receiving")
    expect(row.locator(".bar.in span")).to_have_text("2.0 KiB")  # size unknown until the end
    final = ChunkInfo("st-1", 2, 2 * len(chunk), "big.bin", final=True, size=len(data),
                      sha256=hashlib.sha256(data).hexdigest())
    send(conn, "/queue/files", chunk, **final.headers())
    expect(row.locator(".bar.in span")).to_have_text("100.0% · 2.9 KiB")
    expect(row).not_to_have_attribute("data-state", "receiving")
