"""Run the same STOMP scenarios against ActiveMQ Classic, RabbitMQ and SluiceMQ in turn.

Each broker is started fresh (empty store), warmed up, measured with `stompload.py` (one
subprocess per scenario, medians of --repeat runs), and stopped before the next one starts, so
all see the same machine. Prints a Markdown table (scenario, each broker, ratios of SluiceMQ to
each peer) and appends every JSON result to bench/results/compare-<date>.jsonl. RabbitMQ
(Debian's rabbitmq-server with its STOMP plugin, started by the shared rabbitmq.sh) runs with
`--brokers activemq,rabbitmq,sluice`.

    .venv/bin/python bench/compare.py                      # full set, --repeat 3
    .venv/bin/python bench/compare.py --quick              # smaller counts, one run each
    .venv/bin/python bench/compare.py --scenarios large    # the 1 GiB stream only
    .venv/bin/python bench/compare.py --scenarios large,large-nc  # with and without a consumer

The disk's own dd + fdatasync rate and fdatasync latency are measured first (--no-disk skips
that) and SluiceMQ's stream without a consumer and lone producer's receipt are set against them.
    .venv/bin/python bench/compare.py --table bench/results/compare-2026-11-22.jsonl

With --rounds N the brokers take turns N times (the order reversed every other round), each
round a fresh broker and --repeat runs of each scenario as without it; the table's figures are
the medians over the rounds. Why: on this VM the same build runs ~1.5x slower for half a
minute at a time (bench/cpuprobe.py), long enough to cover one broker's three runs in a row
and none of the other's; taking turns lets every broker meet the same minutes. (One run a
round would measure only a fresh JVM's first runs, which are ActiveMQ's slowest.)
    .venv/bin/python bench/compare.py --scenarios e2e,nonpersist --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpuprobe import probe
from stompload import MIB, fdatasync_waits, read_rss

HERE = Path(__file__).resolve().parent

Result = dict[str, Any]
# The peers' start scripts live beside the repository (../shared/bench); override if elsewhere.
SHARED = Path(os.environ.get("SLUICE_SHARED_BENCH",
                             Path(__file__).resolve().parent.parent.parent / "shared" / "bench"))
AMQ_SCRIPT = SHARED / "brokers" / "activemq.sh"
TMP = Path(os.environ.get("TMPDIR", "/tmp"))
AMQ_BASE = Path(os.environ.get("AMQ_BASE", TMP / "sluice-bench" / "amq"))  # as activemq.sh
RMQ_SCRIPT = AMQ_SCRIPT.parent / "rabbitmq.sh"
RMQ_DIR = Path(os.environ.get("RMQ_DIR", TMP / "sluice-bench" / "rabbit"))  # as rabbitmq.sh
LISTEN_RE = re.compile(r"listening on stomp://([\d.]+):(\d+)")
BROKER_NAMES = {"activemq": "ActiveMQ", "rabbitmq": "RabbitMQ", "sluice": "SluiceMQ"}
# RabbitMQ maps the CONNECT host header to a virtual host: its default one is "/".
CONNECT_ARGS = {"rabbitmq": ["--vhost", "/", "--login", "guest", "--passcode", "guest"]}


@dataclass(frozen=True)
class Row:
    """One line of the table: a figure from a scenario's JSON."""

    label: str
    key: str
    lower_is_better: bool = False


@dataclass(frozen=True)
class Scenario:
    name: str
    args: list[str]
    quick_args: list[str]
    rows: list[Row]
    opt_in: bool = False  # only run when named in --scenarios


def _rate(label: str, key: str = "msgs_per_s") -> Row:
    return Row(label, key)


def _ms(label: str, key: str) -> Row:
    return Row(label, key, lower_is_better=True)


CPU = Row("  broker CPU a message (us, all its threads)", "broker_cpu_us_per_msg",
          lower_is_better=True)
CPU_CHUNK = Row("  broker CPU a 1 MiB chunk (us, all its threads)", "broker_cpu_us_per_msg",
                lower_is_better=True)


def _persist(producers: int, window: int, count: int, quick: int) -> Scenario:
    who = f"{producers} producer{'s' if producers > 1 else ''} x W={window}"
    return Scenario(
        f"persist-{producers}x{window}",
        ["persist", "--producers", str(producers), "--window", str(window),
         "--count", str(count)],
        ["--count", str(quick)],
        [_rate(f"persistent 1 KiB + receipt, {who} (msgs/s)"),
         _ms("  receipt p50 (ms)", "receipt_p50_ms"),
         _ms("  receipt p99 (ms)", "receipt_p99_ms"),
         _rate("  drain afterwards (msgs/s)", "drain_msgs_per_s"), CPU],
    )


SCENARIOS = [
    _persist(1, 1, 3000, 1000),
    _persist(8, 1, 8000, 2000),
    _persist(8, 8, 30000, 8000),
    Scenario("nonpersist", ["nonpersist", "--count", "100000", "--settle", "3"],
             ["--count", "20000"],
             [_rate("non-persistent 1 KiB produce (msgs/s)", "produce_msgs_per_s"),
              _rate("non-persistent 1 KiB consume (msgs/s)", "consume_msgs_per_s"),
              Row("  broker RSS right after the 100k burst drained (MiB)", "rss_drained_mib",
                  lower_is_better=True),
              Row("  ... and 3 s later (MiB)", "rss_settled_mib", lower_is_better=True), CPU]),
    Scenario("e2e", ["e2e", "--count", "50000"], ["--count", "10000"],
             [_rate("end-to-end full speed (msgs/s)"),
              _ms("  latency p50 (ms)", "latency_p50_ms"),
              _ms("  latency p99 (ms)", "latency_p99_ms"), CPU]),
    Scenario("e2e-paced", ["e2e", "--rate", "1000", "--ack", "client-individual",
                           "--count", "5000"], ["--count", "2000"],
             [_ms("end-to-end paced 1k/s, client-individual: p50 (ms)", "latency_p50_ms"),
              _ms("  p99 (ms)", "latency_p99_ms"), CPU]),
    # Client acks: a peer that auto-acks may confirm a chunk it only wrote to its socket
    # (RabbitMQ confirms a persistent message once it is on disk or acked), a weaker promise
    # than ours; with client-individual acks every broker receipts a chunk only once it is
    # durable or its consumer acked it.
    Scenario("large", ["large", "--total-mib", "1024", "--chunk-mib", "1", "--window", "8",
                       "--ack", "client-individual"],
             ["--total-mib", "256"],
             [_rate("1 GiB as 1 MiB persistent chunks, W=8, e2e (MB/s)", "mb_per_s"),
              Row("  broker RSS peak during it (MiB)", "rss_peak_mib", lower_is_better=True),
              CPU_CHUNK],
             opt_in=True),
    Scenario("large-nc", ["persist", "--size", str(MIB), "--producers", "1", "--window", "8",
                          "--count", "1024", "--no-drain"], ["--count", "256"],
             [_rate("1 GiB as 1 MiB persistent chunks, W=8, no consumer (MB/s)", "mb_per_s"),
              Row("  broker RSS peak during it (MiB)", "rss_peak_mib", lower_is_better=True),
              CPU_CHUNK],
             opt_in=True),
    Scenario("backlog", ["backlog", "--producers", "8", "--window", "8", "--count", "1000000"],
             ["--count", "200000"],
             [_rate("backlog: enqueue 1 KiB persistent, 8 x W=8, no consumer (msgs/s)",
                    "enqueue_msgs_per_s"),
              Row("  broker RSS with the backlog queued (MiB)", "rss_backlog_mib",
                  lower_is_better=True),
              _rate("  drain (msgs/s)", "drain_msgs_per_s"),
              _rate("  persistent sends to another queue meanwhile (msgs/s)",
                    "sends_during_drain_msgs_per_s")],
             opt_in=True),
]
RSS_ROWS = [
    Row("broker RSS after start (MiB)", "rss_idle_mib", lower_is_better=True),
    Row("broker RSS peak over the scenarios (MiB)", "rss_peak_mib", lower_is_better=True),
    Row("broker RSS at the end (MiB)", "rss_final_mib", lower_is_better=True),
]
# A few seconds of every traffic shape first, so the JVM's JIT is not measured cold.
WARMUP = [["nonpersist", "--count", "50000"], ["persist", "--producers", "8", "--window", "8",
          "--count", "5000"], ["e2e", "--count", "10000"]]


# ---------------------------------------------------------------- brokers


def stomp_ready(host: str, port: int, timeout: float = 60.0, vhost: str = "localhost") -> None:
    """Block until the broker answers a STOMP CONNECT (a listening socket is not enough)."""
    deadline = time.monotonic() + timeout
    connect = b"CONNECT\naccept-version:1.2\nhost:%s\n\n\x00" % vhost.encode()
    while True:
        try:
            with socket.create_connection((host, port), timeout=2) as sock:
                sock.sendall(connect)
                if sock.recv(4096).startswith(b"CONNECTED"):
                    sock.sendall(b"DISCONNECT\n\n\x00")
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"no STOMP broker answered on {host}:{port}")
        time.sleep(0.25)


@dataclass
class Broker:
    """A broker this script started and must stop."""

    name: str
    host: str = "127.0.0.1"
    port: int = 0
    pid: int = 0
    proc: subprocess.Popen[str] | None = None
    data_dir: Path | None = None
    log: list[str] = field(default_factory=list)

    def stop(self) -> None:
        if self.name in SCRIPTS:
            subprocess.run([str(SCRIPTS[self.name]), "stop"], check=False, capture_output=True)
        elif self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.data_dir is not None:
            shutil.rmtree(self.data_dir, ignore_errors=True)


def start_activemq() -> Broker:
    """Fresh KahaDB each time (AMQ_FRESH=1), so both brokers start from an empty store."""
    subprocess.run([str(AMQ_SCRIPT), "stop"], check=True, capture_output=True)
    env = dict(os.environ, AMQ_FRESH="1")
    subprocess.run([str(AMQ_SCRIPT), "start"], check=True, capture_output=True, env=env)
    broker = Broker("activemq", port=int(os.environ.get("AMQ_PORT", "61613")))
    broker.pid = int((AMQ_BASE / "broker.pid").read_text().split()[0])
    stomp_ready(broker.host, broker.port, timeout=90)
    return broker


def start_rabbitmq() -> Broker:
    """A fresh node (RMQ_FRESH=1: empty mnesia) with the STOMP plugin on a loopback port."""
    subprocess.run([str(RMQ_SCRIPT), "stop"], check=True, capture_output=True)
    env = dict(os.environ, RMQ_FRESH="1")
    subprocess.run([str(RMQ_SCRIPT), "start"], check=True, capture_output=True, env=env)
    broker = Broker("rabbitmq", port=int(os.environ.get("RMQ_STOMP_PORT", "61615")))
    broker.pid = int((RMQ_DIR / "broker.pid").read_text().split()[0])
    stomp_ready(broker.host, broker.port, timeout=120, vhost="/")
    return broker


SCRIPTS = {"activemq": AMQ_SCRIPT, "rabbitmq": RMQ_SCRIPT}


def start_sluice(python: str, extra: list[str]) -> Broker:
    data_dir = Path(tempfile.mkdtemp(prefix="sluice-compare-"))
    args = [python, "-m", "sluicemq", "broker", "--host", "127.0.0.1", "--port", "0",
            "--data-dir", str(data_dir / "data"), *extra]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))
    broker = Broker("sluice", pid=proc.pid, proc=proc, data_dir=data_dir)
    assert proc.stdout is not None
    for line in proc.stdout:
        broker.log.append(line)
        match = LISTEN_RE.search(line)
        if match:
            broker.host, broker.port = match.group(1), int(match.group(2))
            break
    else:
        broker.stop()
        raise RuntimeError("sluice broker did not start:\n" + "".join(broker.log))
    # Keep reading its output so a chatty broker never blocks on a full pipe.
    threading.Thread(target=lambda: broker.log.extend(proc.stdout or []), daemon=True).start()
    stomp_ready(broker.host, broker.port)
    return broker


# ---------------------------------------------------------------- the disk itself


def dd_mb_per_s(directory: Path, mib: int = 1024) -> float:
    """`dd` of ``mib`` MiB of zeros into a new file with one fdatasync at the end (MB/s)."""
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / "dd.bin"
    try:
        started = time.perf_counter()
        subprocess.run(["dd", "if=/dev/zero", f"of={target}", "bs=1M", f"count={mib}",
                        "conv=fdatasync"], check=True, capture_output=True, timeout=600)
        return mib * MIB / 1e6 / (time.perf_counter() - started)
    finally:
        target.unlink(missing_ok=True)


def measure_disk(directory: Path, mib: int = 1024, samples: int = 2000) -> Result:
    """What the disk under the brokers' data does by itself, in the same run: `dd` of ``mib``
    MiB with one fdatasync at the end, and the fdatasync latency of a 1 KiB append into a
    zero-filled file (what a lone persistent producer's receipt waits for)."""
    dd = dd_mb_per_s(directory, mib)
    waits = fdatasync_waits(directory, samples)
    return {"broker": "disk", "name": "disk", "dd_mb_per_s": round(dd, 1),
            "fdatasync_p50_ms": round(waits[len(waits) // 2] / 1e6, 3),
            "fdatasync_p99_ms": round(waits[len(waits) * 99 // 100] / 1e6, 3),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S")}


def disk_lines(results: list[Result]) -> list[str]:
    """The disk's own figures and SluiceMQ's against them (last of each in ``results``)."""
    latest = {(r.get("broker"), r.get("name")): r for r in results}
    disk = latest.get(("disk", "disk"))
    if disk is None:
        return []
    lines = [f"disk (same run): dd + fdatasync {fmt(disk['dd_mb_per_s'])} MB/s; fdatasync of "
             f"a 1 KiB append p50 {disk['fdatasync_p50_ms']:.3f} ms, "
             f"p99 {disk['fdatasync_p99_ms']:.3f} ms"]
    nc = latest.get(("sluice", "large-nc"), {}).get("mb_per_s")
    if isinstance(nc, int | float):
        lines.append(f"SluiceMQ 1 GiB without a consumer / dd: {nc / disk['dd_mb_per_s']:.2f}x")
    p50 = latest.get(("sluice", "persist-1x1"), {}).get("receipt_p50_ms")
    if isinstance(p50, int | float):
        lines.append("SluiceMQ one synchronous producer's receipt p50 / fdatasync p50: "
                     f"{p50 / disk['fdatasync_p50_ms']:.2f}x")
    return lines


# ---------------------------------------------------------------- running


def stompload(python: str, broker: Broker, args: list[str], *, label: str,
              timeout: float) -> Result:
    """Run one stompload invocation; its single JSON line, or an error record."""
    cmd = [python, str(HERE / "stompload.py"), *args, "--host", broker.host,
           "--port", str(broker.port), "--broker-pid", str(broker.pid), "--label", label,
           *CONNECT_ARGS.get(broker.name, [])]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"errors": [f"timed out after {timeout:.0f}s"]}
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        return {"errors": [f"exit {done.returncode}: {done.stderr.strip()[-500:]}"]}
    result: Result = json.loads(lines[-1])
    return result


def scenario_args(scenario: Scenario, opts: argparse.Namespace) -> list[str]:
    """Full args, with the quick overrides replacing their flags when --quick."""
    args = list(scenario.args)
    if opts.quick:
        for flag, value in zip(scenario.quick_args[::2], scenario.quick_args[1::2], strict=True):
            args[args.index(flag) + 1] = value
    return [*args, "--repeat", str(opts.repeat)]


def run_broker(name: str, scenarios: list[Scenario], opts: argparse.Namespace,
               out: Path) -> Iterator[Result]:
    print(f"== {BROKER_NAMES[name]}: starting", file=sys.stderr, flush=True)
    broker = (start_activemq() if name == "activemq" else start_rabbitmq() if name == "rabbitmq"
              else start_sluice(opts.python, opts.sluice_arg))
    try:
        idle = read_rss(broker.pid)[0]
        for args in WARMUP:
            stompload(opts.python, broker, args, label=f"{name}:warmup", timeout=300)
        peak = idle
        for scenario in scenarios:
            load = wait_for_quiet(opts.max_load, opts.max_wait)
            speed = probe()  # each vCPU's speed just before (bench/cpuprobe.py says why)
            print(f"== {BROKER_NAMES[name]}: {scenario.name} (load {load:.2f}, vCPU probe "
                  f"{speed} ms)", file=sys.stderr, flush=True)
            result = stompload(opts.python, broker, scenario_args(scenario, opts),
                               label=f"{name}:{scenario.name}", timeout=opts.timeout)
            result.update(broker=name, name=scenario.name, loadavg_before=round(load, 2),
                          cpu_probe_ms=speed, run=opts.run_id, quick=opts.quick)
            if name == "sluice":  # which build ran: the optional mypyc one says so at start
                result["build"] = "mypyc" if "mypyc" in "".join(broker.log[:50]) else "pure"
            peak = max(peak, int(result.get("rss_peak_mib", 0) * MIB))
            record(out, result)
            yield result
        rss, hwm = read_rss(broker.pid)
        default_set = [s.name for s in SCENARIOS if not s.opt_in]
        # Only a run of the default set gives the table's RSS rows; others are kept, labelled.
        label = "rss" if [s.name for s in scenarios] == default_set else "rss:" + ",".join(
            s.name for s in scenarios)
        summary = {"broker": name, "name": label, "scenario": "rss",
                   "rss_idle_mib": round(idle / MIB, 1), "rss_peak_mib": round(peak / MIB, 1),
                   "rss_final_mib": round(rss / MIB, 1), "rss_hwm_mib": round(hwm / MIB, 1),
                   "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "run": opts.run_id,
                   "quick": opts.quick}
        record(out, summary)
        yield summary
    finally:
        broker.stop()
        print(f"== {BROKER_NAMES[name]}: stopped", file=sys.stderr, flush=True)


def wait_for_quiet(max_load: float | None, max_wait: float) -> float:
    """On a shared machine, wait (bounded) for others' jobs to finish; returns the load seen."""
    deadline = time.monotonic() + max_wait
    load = os.getloadavg()[0]
    while max_load is not None and load > max_load and time.monotonic() < deadline:
        time.sleep(5)
        load = os.getloadavg()[0]
    return load


def record(out: Path, result: Result) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a") as fh:
        fh.write(json.dumps(result) + "\n")


def over_rounds(turns: list[Result]) -> Result:
    """One record for a broker's scenario from its rounds (``--rounds``): the median of each
    figure every round has, the rounds' own runs under 'runs'."""
    merged: Result = {k: v for k, v in turns[-1].items() if not isinstance(v, int | float)}
    for key, value in turns[0].items():
        values = [t[key] for t in turns if isinstance(t.get(key), int | float)]
        if isinstance(value, int | float) and not isinstance(value, bool) and len(values) == len(
                turns):
            median = statistics.median(values)
            merged[key] = round(median, 3) if isinstance(median, float) else median
    merged["runs"] = [run for t in turns for run in t.get("runs", [t])]
    merged["rounds"] = len(turns)
    return merged


# ---------------------------------------------------------------- table


def fmt(value: Any) -> str:
    if not isinstance(value, int | float):
        return "-"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"


def table(results: list[Result], brokers: list[str]) -> str:
    """Markdown table; the last result per (broker, scenario) wins."""
    latest = {(r.get("broker"), r.get("name")): r for r in results}
    scenario_rows = [(s.name, row) for s in SCENARIOS for row in s.rows]
    rows = [*scenario_rows, *(("rss", row) for row in RSS_ROWS)]
    head = ["scenario", *(BROKER_NAMES[b] for b in brokers)]
    peers = [b for b in brokers if b != "sluice"] if "sluice" in brokers else []
    head += [f"ours/{BROKER_NAMES[p]}" for p in peers]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, row in rows:
        found = [latest.get((b, name)) for b in brokers]
        if all(f is None for f in found):
            continue
        values = [f.get(row.key) if f else None for f in found]
        cells = [row.label]
        for f, v in zip(found, values, strict=True):
            cells.append("error" if f is not None and v is None and f.get("errors") else fmt(v))
        ours = values[brokers.index("sluice")] if peers else None
        for peer in peers:
            theirs = values[brokers.index(peer)]
            ratio = "-"
            if isinstance(theirs, int | float) and isinstance(ours, int | float) and theirs:
                ratio = f"{ours / theirs:.2f}x" + (" (lower is better)"
                                                    if row.lower_is_better else "")
            cells.append(ratio)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------- CLI


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    names = [s.name for s in SCENARIOS]
    parser.add_argument("--brokers", default="activemq,sluice",
                        help="comma-separated, run in this order: activemq, rabbitmq, sluice")
    parser.add_argument("--scenarios", default="",
                        help=f"comma-separated subset of {', '.join(names)} "
                             "(default: all but large)")
    parser.add_argument("--repeat", type=int, default=None, help="runs per scenario (3)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="brokers take turns this many times; medians over the rounds")
    parser.add_argument("--quick", action="store_true",
                        help="smaller counts and one run each, for a smoke test")
    parser.add_argument("--python", default=sys.executable,
                        help="interpreter for stompload and `-m sluicemq` (needs uvloop)")
    parser.add_argument("--sluice-arg", action="append", default=[],
                        help="extra argument for `sluicemq broker` (repeatable)")
    parser.add_argument("--max-load", type=float,
                        help="before each scenario wait until the 1-min load average is below")
    parser.add_argument("--max-wait", type=float, default=300,
                        help="seconds to wait for --max-load at most")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per scenario")
    parser.add_argument("--out", type=Path,
                        default=HERE / "results" / f"compare-{time.strftime('%Y-%m-%d')}.jsonl")
    parser.add_argument("--disk", action=argparse.BooleanOptionalAction, default=True,
                        help="first measure the disk itself (dd + fdatasync, fdatasync latency)")
    parser.add_argument("--table", type=Path, help="only print the table of an existing JSONL")
    parser.add_argument("--run", action="append", default=[],
                        help="with --table: only these run ids (default: every non-quick run)")
    opts = parser.parse_args(argv)
    opts.brokers = [b for b in opts.brokers.split(",") if b]
    unknown = set(opts.brokers) - set(BROKER_NAMES)
    wanted = [s for s in opts.scenarios.split(",") if s]
    unknown |= set(wanted) - set(names)
    if unknown:
        parser.error(f"unknown broker or scenario: {', '.join(sorted(unknown))}")
    opts.selected = [s for s in SCENARIOS if (s.name in wanted if wanted else not s.opt_in)]
    if opts.repeat is None:
        opts.repeat = 1 if opts.quick else 3
    opts.run_id = time.strftime("%Y-%m-%dT%H:%M:%S")
    return opts


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    if opts.table is not None:
        results = [json.loads(ln) for ln in opts.table.read_text().splitlines() if ln.strip()]
        results = [r for r in results
                   if (r.get("run") in opts.run if opts.run else not r.get("quick"))]
        print(table(results, opts.brokers))
        for line in disk_lines(results):
            print(line)
        return 0
    results: list[Result] = []
    if opts.disk:
        disk = measure_disk(TMP / "sluice-bench" / "disk")
        disk.update(run=opts.run_id)
        record(opts.out, disk)
        results.append(disk)
    rounds: dict[tuple[str, str], list[Result]] = {}
    for turn in range(opts.rounds):
        for name in opts.brokers if turn % 2 == 0 else opts.brokers[::-1]:
            for result in run_broker(name, opts.selected, opts, opts.out):
                results.append(result)
                rounds.setdefault((name, result["name"]), []).append(result)
                if result.get("errors"):
                    print(f"   {name}:{result['name']}: {result['errors']}", file=sys.stderr)
    if opts.rounds > 1:
        for turns in rounds.values():
            merged = over_rounds(turns)
            record(opts.out, merged)
            results.append(merged)
    print(table(results, opts.brokers))
    for line in disk_lines(results):
        print(line)
    print(f"\nresults appended to {opts.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
