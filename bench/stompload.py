"""stompload: a raw STOMP 1.2 load generator that measures any broker with the same code.

Scenarios (each run uses a fresh queue; one JSON line per invocation, medians with --repeat):

  persist     persistent SENDs, each receipted, P producers x W in flight, no consumer; then drain
  nonpersist  fire-and-forget SENDs (receipt only on the last), then one consumer drains
  e2e         consumer in a child process, producer stamps x-ts (CLOCK_MONOTONIC ns); --rate paces
  large       a big payload as persistent chunks with receipts, window W, concurrent consumer

Broker memory is sampled from /proc/PID/status when --broker-pid or --pid-file is given.
Standard library only (uvloop when importable), so it runs under any python3.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stompwire import StompConnection, WireError, WireFrame

Result = dict[str, Any]
MIB = 1024 * 1024
STREAM_BATCH_BYTES = 256 * 1024  # frames per writelines in fire-and-forget mode, by size


# ---------------------------------------------------------------- measurement helpers


def percentile(sorted_values: list[int], q: float) -> float:
    """Nearest-rank percentile of already sorted values (q in 0..100)."""
    if not sorted_values:
        return float("nan")
    rank = max(0, min(len(sorted_values) - 1, math.ceil(q / 100 * len(sorted_values)) - 1))
    return float(sorted_values[rank])


def latency_summary(prefix: str, samples_ns: list[int]) -> Result:
    """p50/p99/max in milliseconds, the units every table here uses."""
    if not samples_ns:
        return {}
    ordered = sorted(samples_ns)
    return {
        f"{prefix}_p50_ms": round(percentile(ordered, 50) / 1e6, 3),
        f"{prefix}_p99_ms": round(percentile(ordered, 99) / 1e6, 3),
        f"{prefix}_max_ms": round(ordered[-1] / 1e6, 3),
    }


def fdatasync_waits(directory: Path, samples: int, gap_s: float = 0.0) -> list[int]:
    """Sorted ns of pwrite(1 KiB) + fdatasync appended into a zero-filled file in ``directory``
    (``gap_s`` idle between): what a lone persistent producer's receipt waits for on this disk."""
    directory.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=directory, prefix="fdatasync-")
    try:
        zeros = bytes(MIB)
        for i in range(16):
            os.pwrite(fd, zeros, i * MIB)
        os.fsync(fd)
        record, waits = os.urandom(1024), []
        for i in range(samples):
            t0 = time.perf_counter_ns()
            os.pwrite(fd, record, (i * 1040) % (15 * MIB))
            os.fdatasync(fd)
            waits.append(time.perf_counter_ns() - t0)
            if gap_s:
                time.sleep(gap_s)
    finally:
        os.close(fd)
        os.unlink(name)
    waits.sort()
    return waits


def read_rss(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process in bytes; VmHWM is the kernel's own lifetime peak."""
    rss = hwm = 0
    with open(f"/proc/{pid}/status", "rb") as status:
        for line in status:
            if line.startswith(b"VmRSS:"):
                rss = int(line.split()[1]) * 1024
            elif line.startswith(b"VmHWM:"):
                hwm = int(line.split()[1]) * 1024
    return rss, hwm


def read_cpu(pid: int) -> float:
    """CPU seconds (user + system, all threads) a process has used so far."""
    with open(f"/proc/{pid}/stat", "rb") as stat:
        fields = stat.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class RssSampler:
    """Samples a broker's resident memory every 50 ms for the duration of one run, and notes
    the CPU time it used meanwhile (same-run CPU per message is steadier than rates on a
    shared machine)."""

    def __init__(self, pid: int | None, interval: float = 0.05) -> None:
        self.pid = pid
        self.interval = interval
        self.start = self.peak = 0
        self.cpu_start = 0.0
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> RssSampler:
        if self.pid is not None:
            self.start = self.peak = read_rss(self.pid)[0]
            self.cpu_start = read_cpu(self.pid)
            self._task = asyncio.create_task(self._sample())
        return self

    async def _sample(self) -> None:
        assert self.pid is not None
        while True:
            await asyncio.sleep(self.interval)
            self.peak = max(self.peak, read_rss(self.pid)[0])

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()

    def report(self, messages: int) -> Result:
        """Figures of the run; ``messages``: how many it moved, for CPU a message."""
        if self.pid is None:
            return {}
        rss, hwm = read_rss(self.pid)
        cpu = read_cpu(self.pid) - self.cpu_start
        self.peak = max(self.peak, rss)
        return {
            "broker_cpu_s": round(cpu, 2),
            "broker_cpu_us_per_msg": round(cpu / max(1, messages) * 1e6, 1),
            "rss_start_mib": round(self.start / MIB, 1),
            "rss_peak_mib": round(self.peak / MIB, 1),
            "rss_final_mib": round(rss / MIB, 1),
            "rss_hwm_mib": round(hwm / MIB, 1),
        }


async def wait_progress(conn: StompConnection, fut: asyncio.Future[None],
                        progress: Callable[[], int], idle_timeout: float, what: str) -> None:
    """Wait for `fut` while `progress()` keeps moving: a stalled broker is an error, not a hang."""
    seen = -1
    while not fut.done():
        now = progress()
        if now == seen:
            raise TimeoutError(f"{what} stalled at {now} for {idle_timeout:g}s")
        seen = now
        with contextlib.suppress(TimeoutError):
            await conn.guard(asyncio.shield(fut), idle_timeout)
    fut.result()


# ---------------------------------------------------------------- producing


class Producer:
    """Sends `count` SENDs on one connection.

    window >= 1: every SEND carries a receipt and at most `window` are unreceipted; the next
    SEND goes out from the receipt callback, so no coroutine wakes per message.
    window == 0: fire-and-forget in large writes, with a receipt only on the last SEND so that
    "done" means the broker has processed everything. `rate` paces fire-and-forget sends.
    """

    def __init__(
        self,
        conn: StompConnection,
        dest: bytes,
        count: int,
        body: bytes,
        *,
        window: int,
        persistent: bool,
        stamp: bool = False,
        rate: float = 0.0,
        idle_timeout: float = 30.0,
    ) -> None:
        self.conn = conn
        self.idle_timeout = idle_timeout
        self.count = count
        self.body = body
        self.window = window
        self.stamp = stamp
        self.rate = rate
        self.head = (
            b"SEND\ndestination:" + dest + b"\ncontent-length:%d\n" % len(body)
            + (b"persistent:true\n" if persistent else b"")
        )
        self.sent = 0
        self.receipted = 0
        self.latencies: list[int] = []
        self._sent_at: dict[bytes, int] = {}
        self._done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def _frame(self, receipt: bytes | None) -> list[bytes]:
        head = self.head
        if receipt is not None:
            head += b"receipt:" + receipt + b"\n"
        if self.stamp:
            head += b"x-ts:%d\n" % time.monotonic_ns()
        return [head + b"\n", self.body, b"\x00"]

    async def run(self) -> None:
        if self.count == 0:
            return
        if self.window > 0:
            self.conn.on_receipt = self._on_receipt
            self._pump()
            self.conn.flush()
            await wait_progress(self.conn, self._done, lambda: self.receipted, self.idle_timeout,
                                "receipts")
        elif self.rate > 0:
            await self._paced()
        else:
            await self._stream()

    def _pump(self) -> None:
        while self.sent - self.receipted < self.window and self.sent < self.count:
            rid = b"%d" % self.sent
            self._sent_at[rid] = time.perf_counter_ns()
            for part in self._frame(rid):
                self.conn.queue(part)
            self.sent += 1

    def _on_receipt(self, rid: bytes) -> None:
        sent_at = self._sent_at.pop(rid, None)
        if sent_at is None:
            return
        self.latencies.append(time.perf_counter_ns() - sent_at)
        self.receipted += 1
        if self.receipted == self.count:
            self._done.set_result(None)
        else:
            self._pump()

    async def _stream(self) -> None:
        per_batch = max(1, STREAM_BATCH_BYTES // (len(self.body) + 100))
        while self.sent < self.count:
            parts: list[bytes] = []
            for _ in range(min(per_batch, self.count - self.sent)):
                self.sent += 1
                parts += self._frame(b"last" if self.sent == self.count else None)
            last = self.conn.expect_receipt(b"last") if self.sent == self.count else None
            self.conn.writelines(parts)
            await self.conn.drain()
        assert last is not None
        await self.conn.guard(last, self.idle_timeout)
        self.receipted = self.count

    async def _paced(self) -> None:
        """Send whatever is due at each wake-up: timers are coarse, the average rate is exact."""
        last = self.conn.expect_receipt(b"last")
        start = time.perf_counter()
        while self.sent < self.count:
            due = min(self.count, int((time.perf_counter() - start) * self.rate) + 1)
            parts: list[bytes] = []
            while self.sent < due:
                self.sent += 1
                parts += self._frame(b"last" if self.sent == self.count else None)
            if parts:
                self.conn.writelines(parts)
            await asyncio.sleep(max(0.0, start + self.sent / self.rate - time.perf_counter()))
        await self.conn.guard(last, self.idle_timeout)
        self.receipted = self.count


# ---------------------------------------------------------------- consuming


class Consumer:
    """Counts MESSAGEs on one subscription; optionally acks each and records x-ts latency."""

    def __init__(
        self,
        conn: StompConnection,
        dest: bytes,
        count: int,
        *,
        ack: str = "auto",
        prefetch: int = 1000,
        latency: bool = False,
    ) -> None:
        self.conn = conn
        self.dest = dest
        self.count = count
        self.ack = ack
        self.prefetch = prefetch
        self.latency = latency
        self.received = 0
        self.bytes = 0
        self.first_ns = self.last_ns = 0
        self.latencies: list[int] = []
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        conn.on_message = self._on_message

    async def subscribe(self) -> None:
        """SUBSCRIBE with a receipt, so the caller knows the broker will route to us."""
        headers = [(b"destination", self.dest), (b"id", b"0"), (b"ack", self.ack.encode())]
        if self.ack != "auto":
            prefetch = b"%d" % self.prefetch
            headers += [(b"activemq.prefetchSize", prefetch), (b"prefetch-count", prefetch)]
        await self.conn.request(b"SUBSCRIBE", headers)

    def _on_message(self, frame: WireFrame) -> None:
        now = time.monotonic_ns()
        if not self.received:
            self.first_ns = now
        self.received += 1
        self.bytes += frame.body_len
        if self.latency:
            stamp = frame.get(b"x-ts")
            if stamp is not None:
                self.latencies.append(now - int(stamp))
        if self.ack != "auto":
            # STOMP 1.2: echo the `ack` value exactly as received (it is escaped on the wire).
            self.conn.queue(b"ACK\nid:" + (frame.get(b"ack") or b"") + b"\n\n\x00")
        if self.received == self.count:
            self.last_ns = now
            if not self.done.done():
                self.done.set_result(None)

    async def wait(self, idle_timeout: float) -> None:
        """Wait for every message; give up when nothing arrives for `idle_timeout` seconds."""
        await wait_progress(self.conn, self.done, lambda: self.received, idle_timeout,
                            f"consumer (of {self.count} messages)")

    def report(self) -> Result:
        return {
            "received": self.received,
            "bytes": self.bytes,
            "first_ns": self.first_ns,
            "last_ns": self.last_ns,
            **latency_summary("latency", self.latencies),
        }


class ChildConsumer:
    """A Consumer in its own process, so producer and consumer do not share one core's loop."""

    def __init__(self, opts: argparse.Namespace, dest: bytes, count: int, **kwargs: Any) -> None:
        self.args = [
            sys.executable, str(Path(__file__).resolve()), "consume",
            "--host", opts.host, "--port", str(opts.port), "--vhost", opts.vhost,
            "--dest", dest.decode(), "--count", str(count),
            "--ack", kwargs.get("ack", "auto"), "--prefetch", str(kwargs.get("prefetch", 1000)),
            "--idle-timeout", str(opts.idle_timeout),
        ]
        if opts.login is not None:
            self.args += ["--login", opts.login, "--passcode", opts.passcode or ""]
        if kwargs.get("latency"):
            self.args.append("--latency")
        if kwargs.get("skip_bodies"):
            self.args.append("--skip-bodies")
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(*self.args, stdout=asyncio.subprocess.PIPE)
        line = await self._line()
        if not line.get("ready"):
            raise WireError(f"consumer failed to start: {line}")

    async def _line(self) -> Result:
        assert self.proc is not None and self.proc.stdout is not None
        raw = await self.proc.stdout.readline()
        if not raw:
            await self.proc.wait()
            raise WireError(f"consumer exited with {self.proc.returncode}")
        result: Result = json.loads(raw)
        return result

    async def result(self) -> Result:
        assert self.proc is not None
        line = await self._line()
        await self.proc.wait()
        if "error" in line:
            raise WireError(f"consumer: {line['error']}")
        return line

    def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()


async def consume_main(opts: argparse.Namespace) -> None:
    """Child-process entry: report readiness, consume, print one JSON line of results."""
    try:
        conn = await connect(opts, skip_bodies=opts.skip_bodies)
        consumer = Consumer(conn, opts.dest.encode(), opts.count, ack=opts.ack,
                            prefetch=opts.prefetch, latency=opts.latency)
        await consumer.subscribe()
        print(json.dumps({"ready": True}), flush=True)
        await consumer.wait(opts.idle_timeout)
        conn.flush()
        await conn.close()
        print(json.dumps(consumer.report()), flush=True)
    except (WireError, TimeoutError, OSError) as exc:
        print(json.dumps({"error": str(exc)}), flush=True)


# ---------------------------------------------------------------- scenarios


async def connect(opts: argparse.Namespace, *, skip_bodies: bool = False) -> StompConnection:
    return await StompConnection.open(opts.host, opts.port, login=opts.login,
                                      passcode=opts.passcode, vhost=opts.vhost,
                                      skip_bodies=skip_bodies)


def fresh_queue(scenario: str) -> bytes:
    return f"/queue/stompload.{scenario}.{secrets.token_hex(4)}".encode()


def split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


async def produce(opts: argparse.Namespace, dest: bytes, count: int, body: bytes, *,
                  window: int, persistent: bool, stamp: bool = False,
                  rate: float = 0.0) -> tuple[float, list[Producer]]:
    """Open the producers' connections, then time only the sending. Returns (seconds, producers)."""
    conns = [await connect(opts) for _ in range(opts.producers)]
    producers = [
        Producer(conn, dest, n, body, window=window, persistent=persistent, stamp=stamp,
                 rate=rate / opts.producers, idle_timeout=opts.idle_timeout)
        for conn, n in zip(conns, split(count, opts.producers), strict=True)
    ]
    started = time.perf_counter()
    try:
        await asyncio.gather(*(p.run() for p in producers))
    except BaseException:
        for conn in conns:
            conn.abort()
        raise
    elapsed = time.perf_counter() - started
    await asyncio.gather(*(c.close() for c in conns))
    return elapsed, producers


async def drain(opts: argparse.Namespace, dest: bytes, count: int) -> Result:
    conn = await connect(opts)
    consumer = Consumer(conn, dest, count)
    started = time.monotonic_ns()
    try:
        await consumer.subscribe()
        await consumer.wait(opts.idle_timeout)
    except BaseException:
        conn.abort()
        raise
    elapsed = (consumer.last_ns - started) / 1e9
    await conn.close()
    return {"drained": consumer.received, "drain_msgs_per_s": round(count / elapsed)}


async def scenario_persist(opts: argparse.Namespace) -> Result:
    dest = fresh_queue("persist")
    body = os.urandom(opts.size)
    elapsed, producers = await produce(opts, dest, opts.count, body,
                                       window=max(1, opts.window), persistent=True)
    latencies = [t for p in producers for t in p.latencies]
    result: Result = {
        "msgs_per_s": round(opts.count / elapsed),
        "mb_per_s": round(opts.count * opts.size / 1e6 / elapsed, 1),
        **latency_summary("receipt", latencies),
    }
    if not opts.no_drain:
        result.update(await drain(opts, dest, opts.count))
    return result


async def scenario_nonpersist(opts: argparse.Namespace) -> Result:
    dest = fresh_queue("nonpersist")
    body = os.urandom(opts.size)
    elapsed, _ = await produce(opts, dest, opts.count, body, window=0, persistent=False)
    drained = await drain(opts, dest, opts.count)
    result: Result = {
        "produce_msgs_per_s": round(opts.count / elapsed),
        "consume_msgs_per_s": drained["drain_msgs_per_s"],
        "drained": drained["drained"],
    }
    pid = broker_pid(opts)
    if opts.settle > 0 and pid is not None:
        # Memory given back after the burst: RSS right after the drain and `settle` s later.
        result["rss_drained_mib"] = round(read_rss(pid)[0] / MIB, 1)
        await asyncio.sleep(opts.settle)
        result["rss_settled_mib"] = round(read_rss(pid)[0] / MIB, 1)
    return result


async def scenario_e2e(opts: argparse.Namespace) -> Result:
    dest = fresh_queue("e2e")
    body = os.urandom(opts.size)
    consumer = ChildConsumer(opts, dest, opts.count, ack=opts.ack, prefetch=opts.prefetch,
                             latency=True)
    await consumer.start()
    try:
        started_ns = time.monotonic_ns()
        elapsed, _ = await produce(opts, dest, opts.count, body, window=opts.window,
                                   persistent=opts.persistent, stamp=True, rate=opts.rate)
        got = await consumer.result()
    finally:
        consumer.kill()
    span = (got["last_ns"] - started_ns) / 1e9
    return {
        "msgs_per_s": round(opts.count / span),
        "produce_msgs_per_s": round(opts.count / elapsed),
        "received": got["received"],
        **{k: v for k, v in got.items() if k.startswith("latency_")},
    }


async def scenario_large(opts: argparse.Namespace) -> Result:
    dest = fresh_queue("large")
    chunk = opts.chunk_mib * MIB
    count = opts.total_mib // opts.chunk_mib
    body = os.urandom(chunk)
    consumer = ChildConsumer(opts, dest, count, ack=opts.ack, prefetch=opts.prefetch,
                             skip_bodies=True)
    await consumer.start()
    try:
        started_ns = time.monotonic_ns()
        elapsed, _ = await produce(opts, dest, count, body, window=max(1, opts.window),
                                   persistent=True)
        got = await consumer.result()
    finally:
        consumer.kill()
    span = (got["last_ns"] - started_ns) / 1e9
    if got["bytes"] != count * chunk:
        raise WireError(f"consumer got {got['bytes']} bytes, expected {count * chunk}")
    return {
        "mb_per_s": round(count * chunk / 1e6 / span, 1),
        "produce_mb_per_s": round(count * chunk / 1e6 / elapsed, 1),
        "chunks": count,
    }


async def scenario_backlog(opts: argparse.Namespace) -> Result:
    """Deep backlog: enqueue `count` persistent messages with no consumer, note the broker's
    RSS, then drain them while the same producers send persistent messages to another queue
    (sends while the backlog pages in), and finally drain what is left."""
    dest, other = fresh_queue("backlog"), fresh_queue("backlog-side")
    body = os.urandom(opts.size)
    elapsed, _ = await produce(opts, dest, opts.count, body, window=max(1, opts.window),
                               persistent=True)
    result: Result = {"enqueue_msgs_per_s": round(opts.count / elapsed)}
    pid = broker_pid(opts)
    if pid is not None:
        await asyncio.sleep(2)
        result["rss_backlog_mib"] = round(read_rss(pid)[0] / MIB, 1)
    side = max(1000, opts.count // 20)
    # The drain runs in its own process: sharing this loop would slow the side producers.
    consumer = ChildConsumer(opts, dest, opts.count, skip_bodies=True)
    await consumer.start()
    try:
        side_s, _ = await produce(opts, other, side, body, window=max(1, opts.window),
                                  persistent=True)
        got = await consumer.result()
    finally:
        consumer.kill()
    result["drain_msgs_per_s"] = round(got["received"] / ((got["last_ns"] - got["first_ns"])
                                                         / 1e9))
    result["drained"] = got["received"]
    result["sends_during_drain_msgs_per_s"] = round(side / side_s)
    await drain(opts, other, side)
    return result


SCENARIOS: dict[str, Callable[[argparse.Namespace], Coroutine[Any, Any, Result]]] = {
    "backlog": scenario_backlog,
    "persist": scenario_persist,
    "nonpersist": scenario_nonpersist,
    "e2e": scenario_e2e,
    "large": scenario_large,
}

# Per-scenario defaults for options the user did not give.
DEFAULTS: dict[str, dict[str, Any]] = {
    "backlog": {"count": 200_000, "window": 8},
    "persist": {"count": 3000, "window": 1},
    "nonpersist": {"count": 100_000, "window": 0},
    "e2e": {"count": 50_000, "window": 0},
    "large": {"count": 0, "window": 8},
}


# ---------------------------------------------------------------- runner and CLI


def broker_pid(opts: argparse.Namespace) -> int | None:
    if opts.broker_pid is not None:
        return int(opts.broker_pid)
    if opts.pid_file is not None:
        return int(Path(opts.pid_file).read_text().split()[0])
    return None


async def run_once(opts: argparse.Namespace) -> Result:
    async with RssSampler(broker_pid(opts)) as rss:
        try:
            result = await SCENARIOS[opts.scenario](opts)
        except (WireError, TimeoutError, OSError) as exc:
            result = {"error": f"{type(exc).__name__}: {exc}"}
        messages = (opts.total_mib // opts.chunk_mib if opts.scenario == "large"
                     else opts.count or 0)
        result.update(rss.report(messages))
    return result


def combine(opts: argparse.Namespace, runs: list[Result]) -> Result:
    """Median of every numeric figure that all runs produced; the runs themselves under 'runs'."""
    params = {k: getattr(opts, k) for k in ("size", "count", "producers", "window", "persistent",
                                            "rate", "ack", "prefetch")}
    if opts.scenario in ("persist", "large"):
        params["persistent"] = True
    if opts.scenario == "large":
        params.update(total_mib=opts.total_mib, chunk_mib=opts.chunk_mib)
    out: Result = {"scenario": opts.scenario, "label": opts.label, "params": params,
                   "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
    good = [r for r in runs if "error" not in r]
    if good:
        for key in good[0]:
            values = [r[key] for r in good if isinstance(r.get(key), int | float)]
            if len(values) == len(good):
                median = statistics.median(values)
                out[key] = round(median, 3) if isinstance(median, float) else median
    errors = [r["error"] for r in runs if "error" in r]
    if errors:
        out["errors"] = errors
    if len(runs) > 1:
        out["runs"] = runs
    return out


async def main_async(opts: argparse.Namespace) -> Result:
    runs = []
    for _ in range(opts.repeat):
        runs.append(await run_once(opts))
    return combine(opts, runs)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scenario", choices=[*SCENARIOS, "consume"])
    conn = parser.add_argument_group("connection")
    conn.add_argument("--host", default="127.0.0.1")
    conn.add_argument("--port", type=int, default=61613)
    conn.add_argument("--vhost", default="localhost", help="CONNECT host header")
    conn.add_argument("--login")
    conn.add_argument("--passcode")
    load = parser.add_argument_group("load")
    load.add_argument("--size", type=int, default=1024, help="payload bytes")
    load.add_argument("--count", type=int, help="messages in total (scenario default)")
    load.add_argument("--producers", type=int, default=1, help="producer connections")
    load.add_argument("--window", type=int,
                      help="unreceipted SENDs per producer; 0 = fire-and-forget")
    load.add_argument("--persistent", action="store_true", help="e2e: persistent SENDs")
    load.add_argument("--rate", type=float, default=0.0, help="e2e: total msgs/s (0 = flat out)")
    load.add_argument("--ack", default="auto", choices=["auto", "client", "client-individual"])
    load.add_argument("--prefetch", type=int, default=1000,
                      help="sent as activemq.prefetchSize and prefetch-count for client acks")
    load.add_argument("--total-mib", type=int, default=1024, help="large: payload in total")
    load.add_argument("--chunk-mib", type=int, default=1, help="large: MiB per message")
    load.add_argument("--no-drain", action="store_true", help="persist: leave the queue full")
    load.add_argument("--settle", type=float, default=0.0,
                      help="nonpersist: seconds after the drain to read the broker's RSS again")
    load.add_argument("--idle-timeout", type=float, default=30.0,
                      help="give up when no message arrives for this many seconds")
    run = parser.add_argument_group("reporting")
    run.add_argument("--broker-pid", type=int, help="sample this process's RSS")
    run.add_argument("--pid-file", help="read the broker PID from this file")
    run.add_argument("--repeat", type=int, default=1, help="runs; figures are their medians")
    run.add_argument("--label", default="", help="free text copied into the JSON")
    child = parser.add_argument_group("child consumer (internal)")
    child.add_argument("--dest", help=argparse.SUPPRESS)
    child.add_argument("--latency", action="store_true", help=argparse.SUPPRESS)
    child.add_argument("--skip-bodies", action="store_true", help=argparse.SUPPRESS)
    return parser


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


def main(argv: list[str] | None = None) -> int:
    opts = build_parser().parse_args(argv)
    if opts.scenario == "consume":
        run(consume_main(opts))
        return 0
    for key, value in DEFAULTS[opts.scenario].items():
        if getattr(opts, key) is None:
            setattr(opts, key, value)
    result = run(main_async(opts))
    print(json.dumps(result), flush=True)
    return 1 if "errors" in result and len(result["errors"]) == opts.repeat else 0


if __name__ == "__main__":
    sys.exit(main())
