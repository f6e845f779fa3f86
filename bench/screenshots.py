"""Screenshots of every console page, for docs/screenshots/: `python bench/screenshots.py`.

Starts a throwaway broker, gives it something to show (queues with depth, a consumer, a dead
letter, a WebSocket-free TCP connection, a stream half received) and photographs each page
in headless Debian chromium through playwright.
"""

from __future__ import annotations

import hashlib
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from playwright.sync_api import sync_playwright

from sluicemq.protocol.codec import FrameParser, encode_frame
from sluicemq.protocol.frames import Frame
from sluicemq.streaming.manifest import ChunkInfo

OUT = Path(__file__).resolve().parent.parent / "docs" / "screenshots"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


class Stomp:
    """Just enough blocking STOMP to set the scene."""

    def __init__(self, port: int, **headers: str) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.parser = FrameParser(version="1.2")
        self.frames: list[Frame] = []
        self.call("CONNECT", {"accept-version": "1.2", "host": "localhost", **headers})

    def call(self, command: str, headers: dict[str, str], body: bytes = b"") -> Frame:
        receipt = {} if command == "CONNECT" else {"receipt": "r"}
        self.sock.sendall(encode_frame(Frame(command, {**headers, **receipt}, body), "1.2"))
        while True:
            while not self.frames:
                self.frames.extend(self.parser.feed(self.sock.recv(65536)))
            frame = self.frames.pop(0)
            if frame.command != "MESSAGE":
                return frame


def start_broker(data: Path) -> tuple[subprocess.Popen[str], str, int]:
    proc = subprocess.Popen([sys.executable, "-m", "sluicemq", "broker", "--port", "0",
                             "--console-port", "auto", "--ws-port", "auto",
                             "--data-dir", str(data)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    console = port = None
    assert proc.stdout is not None
    for line in proc.stdout:
        if m := re.search(r"console on (http://\S+)", line):
            console = m.group(1)
        if m := re.search(r"listening on stomp://[\d.]+:(\d+)", line):
            port = int(m.group(1))
            break
    assert console and port, "broker did not start"
    return proc, console, port


def set_scene(port: int) -> list[Stomp]:
    producer = Stomp(port, login="producer")
    for i in range(42):
        producer.call("SEND", {"destination": "/queue/orders", "persistent": "true",
                               "order-id": str(1000 + i), "content-type": "application/json"},
                      f'{{"order": {1000 + i}, "items": {i % 5 + 1}}}'.encode())
    for i in range(7):
        producer.call("SEND", {"destination": "/queue/invoices"}, f"invoice {i}".encode())
    producer.call("SEND", {"destination": "/topic/prices"}, b"EURUSD 1.0842")
    consumer = Stomp(port, login="billing", **{"client-id": "billing-1"})
    consumer.call("SUBSCRIBE", {"destination": "/queue/invoices", "id": "inv", "ack": "client",
                                "activemq.prefetchSize": "5"})
    consumer.call("SUBSCRIBE", {"destination": "/topic/prices", "id": "px"})
    dlq = Stomp(port, login="worker")
    dlq.call("SEND", {"destination": "/queue/DLQ.payments", "persistent": "true",
                      "sluice-dlq-origin": "/queue/payments", "sluice-dlq-deliveries": "7"},
             b"card declined")
    chunk = b"\0" * 256 * 1024
    for seq in range(3):
        producer.call("SEND", {"destination": "/queue/files", "persistent": "true",
                               **ChunkInfo("backup-2024", seq, seq * len(chunk),
                                           "backup.tar").headers()}, chunk)
    data = chunk * 2
    for seq in range(2):
        final = seq == 1
        producer.call("SEND", {"destination": "/queue/files", "persistent": "true",
                               **ChunkInfo("report-q3", seq, seq * len(chunk), "report.pdf",
                                           final=final, size=len(data) if final else None,
                                           sha256=hashlib.sha256(data).hexdigest() if final
                                           else None).headers()}, chunk)
    return [producer, consumer, dlq]


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        proc, console, port = start_broker(Path(tmp) / "data")
        try:
            keep = set_scene(port)
            time.sleep(3)  # a few rate samples for the chart
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
                page = browser.new_page(viewport={"width": 1280, "height": 860})
                for name, path in [("overview", "/"), ("destinations", "/destinations"),
                                   ("destination", "/destination?kind=queue&name=orders"),
                                   ("streams", "/streams"), ("connections", "/connections")]:
                    page.goto(console + path)
                    page.wait_for_selector("#status:has-text('updated')")
                    if name == "destination":
                        page.locator("tr.msg a").first.click()
                        page.wait_for_selector("pre.body")
                    page.wait_for_timeout(600)
                    page.screenshot(path=str(OUT / f"{name}.png"), full_page=True)
                    print(f"wrote {OUT / f'{name}.png'}")
                browser.close()
            del keep
        finally:
            proc.terminate()
            proc.wait(10)


if __name__ == "__main__":
    main()
