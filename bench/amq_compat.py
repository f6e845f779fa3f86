"""Behaviour table: the ActiveMQ-compatibility scenarios run against ActiveMQ 5.17 and SluiceMQ.

Each scenario is a short STOMP conversation over a raw socket (no SluiceMQ code on the client
side, so both brokers are driven by the same bytes); it returns what it saw, as a short
string. The table prints both outcomes and whether they agree; deliberate differences are
listed in the README's compatibility table.

ActiveMQ: the Debian package (activemq 5.17), started through the shared
``../shared/bench/brokers/activemq.sh`` from a private base directory with this script's own
broker configuration: ``schedulerSupport="true"`` (scheduled delivery), the redelivery plugin
(back-off on NACK), and XStream + Jettison on its class path (advisories over STOMP).

    python bench/amq_compat.py [--only NAME,...] [--json out.jsonl]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from streams import start_broker

SHARED = Path(os.environ.get("SLUICE_SHARED_BENCH",
                             Path(__file__).resolve().parents[2] / "shared" / "bench"))
JARS = ("xstream.jar", "jettison.jar", "xpp3.jar")
# ActiveMQ's redelivery plugin refuses delays of 1 s or less
RETRY = dict(max=3, initial=1500, delay=1500, multiplier=2, cap=4000)

AMQ_XML = """<beans xmlns="http://www.springframework.org/schema/beans"
  xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
  xsi:schemaLocation="http://www.springframework.org/schema/beans
  http://www.springframework.org/schema/beans/spring-beans-2.0.xsd
  http://activemq.apache.org/schema/core http://activemq.apache.org/schema/core/activemq-core.xsd">
  <bean class="org.springframework.beans.factory.config.PropertyPlaceholderConfigurer"/>
  <broker xmlns="http://activemq.apache.org/schema/core" useJmx="false" brokerName="compat"
          dataDirectory="${{activemq.data}}" schedulerSupport="true">
    <destinationPolicy><policyMap><policyEntries>
      <policyEntry queue=">" advisoryForSlowConsumers="true"/>
      <policyEntry topic=">" advisoryForSlowConsumers="true"/>
    </policyEntries></policyMap></destinationPolicy>
    <plugins>
      <redeliveryPlugin fallbackToDeadLetter="true" sendToDlqIfMaxRetriesExceeded="true">
        <redeliveryPolicyMap><redeliveryPolicyMap>
          <redeliveryPolicyEntries>
            <redeliveryPolicy queue="retry.>" maximumRedeliveries="{max}"
              initialRedeliveryDelay="{initial}" redeliveryDelay="{delay}"
              useExponentialBackOff="true" backOffMultiplier="{multiplier}"
              maximumRedeliveryDelay="{cap}"/>
          </redeliveryPolicyEntries>
          <defaultEntry><redeliveryPolicy maximumRedeliveries="6"
            initialRedeliveryDelay="2000" redeliveryDelay="2000"/></defaultEntry>
        </redeliveryPolicyMap></redeliveryPolicyMap>
      </redeliveryPlugin>
    </plugins>
    <persistenceAdapter><kahaDB directory="${{activemq.data}}/kahadb"/></persistenceAdapter>
    <transportConnectors>
      <transportConnector name="stomp" uri="stomp://127.0.0.1:${{stomp.port}}"/>
    </transportConnectors>
  </broker>
</beans>
""".format(**RETRY)

SLUICE_TOML = """
[[policy]]
queue = "retry.>"
max_redeliveries = {max}
initial_redelivery_delay = {initial}
redelivery_delay = {delay}
use_exponential_backoff = true
backoff_multiplier = {multiplier}
maximum_redelivery_delay = {cap}
[advisories]
slow_consumer_seconds = 2
""".format(**RETRY)


# -- a raw STOMP 1.2 client (independent of SluiceMQ) --------------------------------------
@dataclass
class Frame:
    command: str
    headers: dict[str, str]
    body: bytes


class Raw:
    """One connection; frames read with a timeout (TimeoutError when none comes)."""

    def __init__(self, port: int, client_id: str | None = None) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.buf = b""
        headers = {"accept-version": "1.2", "host": "localhost", "heart-beat": "0,0",
                   "login": "admin", "passcode": "admin"}
        if client_id:
            headers["client-id"] = client_id
        self.send("CONNECT", headers)
        assert self.recv().command == "CONNECTED"

    def send(self, command: str, headers: dict[str, str], body: bytes = b"") -> None:
        head = "".join(f"{k}:{v}\n" for k, v in headers.items())
        self.sock.sendall(f"{command}\n{head}content-length:{len(body)}\n\n".encode()
                          + body + b"\x00")

    def recv(self, timeout: float = 10.0) -> Frame:
        deadline = time.monotonic() + timeout
        while True:
            frame = self._parse()
            if frame is not None:
                return frame
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                raise TimeoutError from None
            if not data:
                raise ConnectionError("closed")
            self.buf += data

    def _parse(self) -> Frame | None:
        buf = self.buf.lstrip(b"\r\n")
        end = buf.find(b"\n\n")
        if end < 0:
            self.buf = buf
            return None
        lines = buf[:end].decode().split("\n")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            k, _, v = line.rstrip("\r").partition(":")
            headers.setdefault(k, v.replace("\\c", ":").replace("\\n", "\n"))
        start = end + 2
        if "content-length" in headers:
            stop = start + int(headers["content-length"])
            if len(buf) < stop + 1:
                self.buf = buf
                return None
        else:
            stop = buf.find(b"\x00", start)
            if stop < 0:
                self.buf = buf
                return None
        self.buf = buf[stop + 1:]
        return Frame(lines[0], headers, buf[start:stop])

    def request(self, command: str, headers: dict[str, str], body: bytes = b"") -> Frame:
        """Send with a receipt; return the RECEIPT or ERROR (MESSAGEs before it are kept)."""
        receipt = f"r{time.monotonic_ns()}"
        self.send(command, {**headers, "receipt": receipt}, body)
        kept: list[Frame] = []
        while True:
            f = self.recv()
            if f.command in ("RECEIPT", "ERROR"):
                self.buf = b"".join(_encode(k) for k in kept) + self.buf
                return f
            kept.append(f)

    def messages(self, wait: float) -> list[Frame]:
        """Every MESSAGE that comes within ``wait`` seconds of the last one."""
        out = []
        with contextlib.suppress(TimeoutError):
            while True:
                f = self.recv(timeout=wait)
                if f.command == "MESSAGE":
                    out.append(f)
        return out

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.send("DISCONNECT", {})
            self.sock.close()


def _encode(f: Frame) -> bytes:
    head = "".join(f"{k}:{v}\n" for k, v in f.headers.items() if k != "content-length")
    return (f"{f.command}\n{head}content-length:{len(f.body)}\n\n".encode() + f.body
            + b"\x00")


def sub(c: Raw, destination: str, sid: str, **extra: str) -> Frame:
    return c.request("SUBSCRIBE", {"destination": destination, "id": sid, **extra})


def put(c: Raw, destination: str, body: str, **extra: str) -> Frame:
    return c.request("SEND", {"destination": destination, **extra}, body.encode())


def bodies(frames: list[Frame]) -> str:
    return ",".join(sorted(f.body.decode() for f in frames)) or "-"


def err(f: Frame) -> str:
    return "ERROR" if f.command == "ERROR" else "accepted"


# -- scenarios: each gets a fresh namespace ``ns`` ----------------------------------------
def wildcard_topics(port: int, ns: str) -> str:
    c = Raw(port)
    sub(c, f"/topic/{ns}.prices.*", "star")
    sub(c, f"/topic/{ns}.prices.>", "rest")
    for t in ("prices", "prices.ibm", "prices.ibm.eu", "orders.x"):
        put(c, f"/topic/{ns}.{t}", t)
    got = c.messages(1.5)
    star = [f for f in got if f.headers["subscription"] == "star"]
    rest = [f for f in got if f.headers["subscription"] == "rest"]
    c.close()
    return f"*: {bodies(star)}; >: {bodies(rest)}"


def wildcard_queues(port: int, ns: str) -> str:
    c = Raw(port)
    put(c, f"/queue/{ns}.orders.eu", "eu")
    put(c, f"/queue/{ns}.orders.us.west", "us.west")
    sub(c, f"/queue/{ns}.orders.>", "rest")
    put(c, f"/queue/{ns}.orders.asia", "asia (new queue)")
    got = c.messages(1.5)
    dests = sorted({f.headers["destination"].rsplit(".", 1)[-1] for f in got})
    c.close()
    return f"{bodies(got)}; destination header names {'/'.join(dests)}"


def composite_send(port: int, ns: str) -> str:
    c = Raw(port)
    put(c, f"/queue/{ns}.a,/queue/{ns}.b,/topic/{ns}.c", "x", persistent="true")
    got = []
    for q in ("a", "b"):
        sub(c, f"/queue/{ns}.{q}", q)
        got += c.messages(1.0)
    c.close()
    return f"queues got {len(got)} of 2"


def composite_subscribe(port: int, ns: str) -> str:
    c, p = Raw(port), Raw(port)
    put(p, f"/queue/{ns}.a", "a before")
    put(p, f"/queue/{ns}.b", "b before")
    sub(c, f"/queue/{ns}.a,/queue/{ns}.b", "both")
    before = c.messages(1.5)
    put(p, f"/queue/{ns}.a", "a after")
    put(p, f"/queue/{ns}.b", "b after")
    after = c.messages(1.5)
    ids = ",".join(sorted({f.headers.get("subscription", "?") for f in before + after}))
    c.close()
    p.close()
    return f"waiting: {bodies(before)}; sent later: {bodies(after)} (subscription {ids})"


def temp_reply_to(port: int, ns: str) -> str:
    req, svc = Raw(port), Raw(port)
    sub(req, "/temp-queue/replies", "r")
    sub(svc, f"/queue/{ns}.svc", "s")
    put(req, f"/queue/{ns}.svc", "ping", **{"reply-to": "/temp-queue/replies"})
    [request] = svc.messages(1.5)[:1] or [Frame("none", {"reply-to": "-"}, b"")]
    reply_to = request.headers.get("reply-to", "-")
    if reply_to != "-":
        put(svc, reply_to, "pong")
    got = req.messages(1.5)
    req.close()
    svc.close()
    prefix = reply_to.split("/")[1] if reply_to.startswith("/") else reply_to
    return f"reply-to rewritten to /{prefix}/...; reply {bodies(got)}"


def virtual_topic(port: int, ns: str) -> str:
    c = Raw(port)
    sub(c, f"/queue/Consumer.A.VirtualTopic.{ns}", "a")
    sub(c, f"/queue/Consumer.B.VirtualTopic.{ns}", "b")
    put(c, f"/topic/VirtualTopic.{ns}", "v", persistent="true")
    got = c.messages(1.5)
    c.close()
    return f"group copies {len(got)} of 2"


def scheduled_delay(port: int, ns: str) -> str:
    c = Raw(port)
    sub(c, f"/queue/{ns}.later", "s")
    sent = time.monotonic()
    put(c, f"/queue/{ns}.later", "delayed", AMQ_SCHEDULED_DELAY="1500", persistent="true")
    put(c, f"/queue/{ns}.later", "plain")
    got = c.messages(3.0)
    order = [f.body.decode() for f in got]
    late = got[-1] if got else None
    c.close()
    took = "" if late is None else f", after >= 1.5 s: {time.monotonic() - sent >= 1.5}"
    return f"order {'/'.join(order)}{took}"


def scheduled_repeat(port: int, ns: str) -> str:
    c = Raw(port)
    sub(c, f"/queue/{ns}.ticks", "s")
    put(c, f"/queue/{ns}.ticks", "tick", AMQ_SCHEDULED_DELAY="200", AMQ_SCHEDULED_PERIOD="300",
        AMQ_SCHEDULED_REPEAT="3")
    got = c.messages(1.5)
    ids = {f.headers["message-id"] for f in got}
    c.close()
    return f"{len(got)} copies, {len(ids)} distinct message-ids"


def scheduled_cron(port: int, ns: str) -> str:
    out = []
    for entry in ("*/5 * * * *", "* * * MON *"):
        c = Raw(port)
        try:
            answer = err(put(c, f"/queue/{ns}.cron", "c", AMQ_SCHEDULED_CRON=entry))
        except (ConnectionError, OSError):
            out.append(f"{entry!r} connection closed, no ERROR frame")
            continue
        try:
            sub(c, f"/queue/{ns}.other", "still")
            kept = "connection kept"
        except (ConnectionError, OSError, TimeoutError):
            kept = "connection closed"
        out.append(f"{entry!r} {answer}" + (f" ({kept})" if answer == "ERROR" else ""))
        c.close()
    return "; ".join(out)


def redelivery_backoff(port: int, ns: str) -> str:
    c = Raw(port)
    sub(c, f"/queue/retry.{ns}", "s", ack="client-individual")
    put(c, f"/queue/retry.{ns}", "poison", persistent="true")
    first = c.recv()
    waits = []
    frame = first
    for _ in range(3):
        t = time.monotonic()
        c.send("NACK", {"id": frame.headers["ack"]})
        try:
            frame = c.recv(timeout=10)
        except TimeoutError:
            break
        waits.append(round((time.monotonic() - t) * 1000, -2))
    same_id = frame.headers.get("message-id") == first.headers.get("message-id")
    redelivered = frame.headers.get("redelivered", "-")
    c.send("NACK", {"id": frame.headers["ack"]})
    dlq = Raw(port)
    dead = [f.headers["destination"] for f in dlq.messages(0.1)]
    for name in (f"DLQ.retry.{ns}", "ActiveMQ.DLQ"):
        sub(dlq, f"/queue/{name}", name)
        dead += [f.headers["destination"] for f in dlq.messages(1.5)
                 if f.body == b"poison"]
    c.close()
    dlq.close()
    return (f"waits ~{'/'.join(str(int(w)) for w in waits)} ms, redelivered:{redelivered}, "
            f"same message-id {same_id}, then {','.join(sorted(set(dead))) or 'no DLQ'}")


def advisories(port: int, ns: str) -> str:
    w = Raw(port)
    for i, t in enumerate((f"Consumer.Queue.{ns}.adv", f"Producer.Queue.{ns}.adv",
                           "Connection")):
        sub(w, f"/topic/ActiveMQ.Advisory.{t}", f"w{i}")
    w.messages(0.5)  # whatever was retained or already there
    c = Raw(port)
    sub(c, f"/queue/{ns}.adv", "s")
    put(c, f"/queue/{ns}.adv", "x")
    got = w.messages(1.5)
    kinds = sorted({f.headers["destination"].split("Advisory.")[1].split(".")[0]
                    for f in got})
    body = got[0].body.decode()[:60].replace("\n", " ") if got else "-"
    w.close()
    c.close()
    return f"got {'/'.join(kinds) or 'none'}; body {body!r}"


def message_headers(port: int, ns: str) -> str:
    c = Raw(port)
    put(c, f"/queue/{ns}.h", "h")
    sub(c, f"/queue/{ns}.h", "s")
    [m] = c.messages(1.0)[:1] or [Frame("-", {}, b"")]
    c.close()
    return ",".join(k for k in ("priority", "expires", "persistent", "timestamp")
                    if k in m.headers) or "-"


def durable_on_queue(port: int, ns: str) -> str:
    c = Raw(port, client_id=f"{ns}-q")
    f = sub(c, f"/queue/{ns}.q", "s", **{"activemq.subscriptionName": "keep"})
    c.close()
    return err(f)


def durable_wildcard(port: int, ns: str) -> str:
    c = Raw(port, client_id=f"{ns}-dw")
    sub(c, f"/topic/{ns}.prices.>", "d", **{"activemq.subscriptionName": "watch"})
    c.close()
    p = Raw(port)
    put(p, f"/topic/{ns}.prices.ibm", "while away", persistent="true")
    p.close()
    c = Raw(port, client_id=f"{ns}-dw")
    sub(c, f"/topic/{ns}.prices.>", "d", **{"activemq.subscriptionName": "watch"})
    got = c.messages(1.5)
    c.close()
    return f"kept {bodies(got)}"


def consumer_priority(port: int, ns: str) -> str:
    low, high, p = Raw(port), Raw(port), Raw(port)
    sub(low, f"/queue/{ns}.prio", "low", ack="client-individual", **{"activemq.priority": "1"})
    sub(high, f"/queue/{ns}.prio", "high", ack="client-individual",
        **{"activemq.priority": "9", "activemq.prefetchSize": "2"})
    for i in range(3):
        put(p, f"/queue/{ns}.prio", str(i))
    result = f"high {bodies(high.messages(1.0))}, low {bodies(low.messages(0.5))}"
    for c in (low, high, p):
        c.close()
    return result


def expired_message(port: int, ns: str) -> str:
    c = Raw(port)
    put(c, f"/queue/{ns}.late", "late", persistent="true",
        expires=str(int(time.time() * 1000) - 1000))
    sub(c, f"/queue/{ns}.late", "s")
    delivered = c.messages(1.0)
    found = []
    for name in (f"DLQ.{ns}.late", "ActiveMQ.DLQ"):
        sub(c, f"/queue/{name}", name)
        found += [name for f in c.messages(1.0) if f.body == b"late"]
    c.close()
    return f"delivered {len(delivered)}; DLQ: {','.join(found) or 'none'}"


SCENARIOS: dict[str, Callable[[int, str], str]] = {
    "wildcard topics (* one segment, > the rest)": wildcard_topics,
    "wildcard queues (now and later)": wildcard_queues,
    "composite SEND": composite_send,
    "composite SUBSCRIBE": composite_subscribe,
    "temp queue request/reply": temp_reply_to,
    "virtual topic groups": virtual_topic,
    "AMQ_SCHEDULED_DELAY": scheduled_delay,
    "AMQ_SCHEDULED_PERIOD/REPEAT": scheduled_repeat,
    "AMQ_SCHEDULED_CRON": scheduled_cron,
    "redelivery back-off on NACK": redelivery_backoff,
    "advisories (Consumer, Producer, Connection)": advisories,
    "MESSAGE headers": message_headers,
    "durable name on a queue": durable_on_queue,
    "durable wildcard subscription": durable_wildcard,
    "consumer priority": consumer_priority,
    "expired persistent message": expired_message,
}


# -- brokers ------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_stomp(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            Raw(port).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


@contextlib.contextmanager
def activemq() -> Iterator[tuple[int, int]]:
    """A private ActiveMQ on a free loopback port (stopped after): (port, pid)."""
    base = Path(tempfile.mkdtemp(prefix="amq-compat-"))
    scripts = base / "scripts"
    scripts.mkdir()
    shutil.copy(SHARED / "brokers" / "activemq.sh", scripts / "activemq.sh")
    (scripts / "activemq.xml").write_text(AMQ_XML)  # the script installs its neighbour
    (base / "amq" / "lib").mkdir(parents=True)
    for jar in JARS:
        with contextlib.suppress(FileExistsError, FileNotFoundError):
            (base / "amq" / "lib" / jar).symlink_to(Path("/usr/share/java") / jar)
    port = free_port()
    env = dict(os.environ, AMQ_BASE=str(base / "amq"), AMQ_PORT=str(port), AMQ_HEAP="512m",
               AMQ_FRESH="1")
    script = ["sh", str(scripts / "activemq.sh")]
    subprocess.run([*script, "start"], check=True, env=env, capture_output=True)
    try:
        wait_stomp(port, 120)
        yield port, int((base / "amq" / "broker.pid").read_text().split()[0])
    finally:
        subprocess.run([*script, "stop"], env=env, capture_output=True, timeout=120)
        shutil.rmtree(base, ignore_errors=True)


@contextlib.contextmanager
def sluice() -> Iterator[int]:
    base = Path(tempfile.mkdtemp(prefix="sluice-compat-"))
    config = base / "broker.toml"
    config.write_text(SLUICE_TOML)
    proc, url = start_broker(base / "data", ["--config", str(config)])
    try:
        yield int(url.rsplit(":", 1)[1])
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(base, ignore_errors=True)


def run_all(port: int, names: list[str]) -> dict[str, str]:
    out = {}
    for i, name in enumerate(names):
        try:
            out[name] = SCENARIOS[name](port, f"c{i}x{os.getpid()}")
        except Exception as exc:  # a broker that does not do it at all
            out[name] = f"failed: {type(exc).__name__} {exc}"[:120]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="comma-separated scenario names (substring match)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    names = [n for n in SCENARIOS if not args.only
             or any(part in n for part in args.only.split(","))]
    with activemq() as (port, _pid):
        amq = run_all(port, names)
    with sluice() as port:
        ours = run_all(port, names)
    width = max(len(n) for n in names)
    for name in names:
        same = "same" if amq[name] == ours[name] else "DIFFERS"
        print(f"{name:<{width}}  {same}\n    ActiveMQ 5.17: {amq[name]}\n"
              f"    SluiceMQ:      {ours[name]}")
    if args.json:
        with args.json.open("a") as fh:
            fh.write(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M"),
                                 "activemq": amq, "sluice": ours}) + "\n")


if __name__ == "__main__":
    main()
