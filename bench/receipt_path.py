"""Where a lone synchronous producer's receipt time goes, against the disk's own fdatasync.

The #15 goal sets the receipt p50 of one producer that waits for each RECEIPT (compare.py's
`persist-1x1`) against the fdatasync p50 of a 1 KiB append measured back to back. Neither
part of a receipt's time is in that figure alone, so this measures, in one run:

- the disk: fdatasync of a 1 KiB append into a zero-filled file back to back (as compare.py
  does), and again with an idle pause between syncs as long as a client's round trip, which
  is what a lone producer's syncs see (the CPU idles while the receipt travels);
- each broker's round trip for a receipted SEND without the disk (non-persistent) and with it
  (persistent), from a blocking raw-socket client (no event loop: the least a client adds).

A broker whose persistent receipt costs its own round trip plus one fdatasync adds nothing of
its own: `persistent - (round trip + gapped fdatasync)` is what the broker could still save.

`--brokers bare` is the least any server can do here: a process that answers each frame
with a RECEIPT straight from its socket loop (no STOMP, no event loop), without the disk
and with a pwrite + fdatasync of the frame first - the floor no broker gets under on this
machine, to set the goal against.

    .venv/bin/python bench/receipt_path.py                       # SluiceMQ only
    .venv/bin/python bench/receipt_path.py --brokers activemq,rabbitmq,sluice
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import CONNECT_ARGS, TMP, Broker, start_activemq, start_rabbitmq, start_sluice
from stompload import MIB, fdatasync_waits


def _p(sorted_ns: list[int], q: float) -> float:
    """The q-quantile of sorted nanoseconds, in microseconds."""
    return round(sorted_ns[min(len(sorted_ns) - 1, int(len(sorted_ns) * q))] / 1e3, 1)


def fdatasync_us(directory: Path, samples: int, gap_s: float = 0.0) -> dict[str, float]:
    """p50/p90 of pwrite(1 KiB) + fdatasync into a zero-filled file, ``gap_s`` idle between."""
    waits = fdatasync_waits(directory, samples, gap_s)
    return {"p50_us": _p(waits, 0.5), "p90_us": _p(waits, 0.9)}


def _read_frame(sock: socket.socket, buf: bytearray) -> bytes:
    """Read until one NUL-terminated frame is whole; returns it, keeps the rest in ``buf``."""
    while True:
        end = buf.find(b"\0")
        if end >= 0:
            frame = bytes(buf[:end])
            del buf[:end + 1]
            while buf and buf[0] in (10, 13):  # EOLs after a frame (heart-beats)
                del buf[:1]
            return frame
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("broker closed the connection")
        buf += chunk


def _read_sized(sock: socket.socket, buf: bytearray) -> bytes:
    """Read one frame whose head says its content-length (the body may hold NULs)."""
    while (end := buf.find(b"\n\n")) < 0:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("client closed the connection")
        buf += chunk
    length = int(buf[:end].split(b"content-length:")[1].split(b"\n")[0])
    while len(buf) < end + 2 + length + 1:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("client closed the connection")
        buf += chunk
    frame = bytes(buf[:end + 2 + length])
    del buf[:end + 3 + length]
    return frame


def receipt_us(host: str, port: int, samples: int, *, persistent: bool,
               connect_headers: dict[str, str]) -> dict[str, float]:
    """p50/p90 of SEND (1 KiB, receipt) -> RECEIPT, one at a time, the first 10% dropped."""
    with socket.create_connection((host, port), timeout=30) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        head = "".join(f"{k}:{v}\n" for k, v in connect_headers.items())
        sock.sendall(f"CONNECT\naccept-version:1.2\n{head}\n\0".encode())
        buf = bytearray()
        connected = _read_frame(sock, buf)
        if not connected.startswith(b"CONNECTED"):
            raise RuntimeError(connected[:200].decode(errors="replace"))
        dest = f"/queue/receipt-path.{os.getpid()}.{int(persistent)}".encode()
        body = os.urandom(1024)
        start = (b"SEND\ndestination:" + dest + b"\ncontent-length:1024\n"
                 + (b"persistent:true\n" if persistent else b""))
        waits = []
        for i in range(samples):
            frame = start + b"receipt:%d\n\n" % i + body + b"\0"
            t0 = time.perf_counter_ns()
            sock.sendall(frame)
            answer = _read_frame(sock, buf)
            waits.append(time.perf_counter_ns() - t0)
            if not answer.startswith(b"RECEIPT"):
                raise RuntimeError(answer[:200].decode(errors="replace"))
    kept = sorted(waits[samples // 10:])
    return {"p50_us": _p(kept, 0.5), "p90_us": _p(kept, 0.9)}


def _connect_headers(name: str) -> dict[str, str]:
    args = CONNECT_ARGS.get(name, [])
    pairs = dict(zip(args[::2], args[1::2], strict=True))
    return {"host": pairs.get("--vhost", "localhost"),
            **({"login": pairs["--login"], "passcode": pairs["--passcode"]}
               if "--login" in pairs else {})}


def _serve_bare(directory: Path) -> None:
    """The bare server: accept one connection at a time; answer the first frame with
    CONNECTED and every other with a RECEIPT, after pwrite + fdatasync when it is persistent."""
    listener = socket.create_server(("127.0.0.1", 0))
    print("listening on", listener.getsockname()[1], flush=True)
    fd, name = tempfile.mkstemp(dir=directory, prefix="bare-")
    os.unlink(name)
    for i in range(16):
        os.pwrite(fd, bytes(MIB), i * MIB)
    os.fsync(fd)
    at = 0
    while True:
        conn, _ = listener.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = bytearray()
        with conn:
            try:
                conn.sendall(b"CONNECTED\nversion:1.2\n\n\0" if _read_frame(conn, buf) else b"")
                while True:
                    frame = _read_sized(conn, buf)
                    if b"\npersistent:true\n" in frame:
                        os.pwrite(fd, frame, at)
                        os.fdatasync(fd)
                        at = (at + len(frame)) % (15 * MIB)
                    conn.sendall(b"RECEIPT\nreceipt-id:x\n\n\0")
            except ConnectionError:
                continue


def start_bare(python: str, directory: Path) -> Broker:
    """The bare server in a process of its own (its own interpreter lock, as a broker has)."""
    directory.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([python, __file__, "--serve-bare", str(directory)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    port = int(proc.stdout.readline().split()[-1])
    return Broker("bare", port=port, pid=proc.pid, proc=proc)


def measure_broker(name: str, opts: argparse.Namespace) -> dict[str, Any]:
    starters = {"activemq": start_activemq, "rabbitmq": start_rabbitmq}
    if name == "bare":
        broker = start_bare(opts.python, TMP / "sluice-bench" / "disk")
    else:
        broker = starters[name]() if name in starters else start_sluice(opts.python, [])
    try:
        headers = _connect_headers(name)
        receipt_us(broker.host, broker.port, opts.samples // 4, persistent=True,
                   connect_headers=headers)  # warm-up (a JVM's JIT, the broker's caches)
        plain = receipt_us(broker.host, broker.port, opts.samples, persistent=False,
                           connect_headers=headers)
        stored = receipt_us(broker.host, broker.port, opts.samples, persistent=True,
                            connect_headers=headers)
    finally:
        broker.stop()
    return {"non_persistent": plain, "persistent": stored}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--brokers", default="sluice",
                        help="comma-separated: activemq, rabbitmq, sluice, bare")
    parser.add_argument("--samples", type=int, default=3000)
    parser.add_argument("--python", default=sys.executable, help="interpreter for the broker")
    parser.add_argument("--serve-bare", type=Path, help=argparse.SUPPRESS)  # start_bare's child
    opts = parser.parse_args(argv)
    if opts.serve_bare is not None:
        _serve_bare(opts.serve_bare)
        return 0
    disk_dir = TMP / "sluice-bench" / "disk"
    result: dict[str, Any] = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "load_1min": os.getloadavg()[0],
        "fdatasync_back_to_back": fdatasync_us(disk_dir, opts.samples)}
    for name in opts.brokers.split(","):
        result[name] = measure_broker(name, opts)
        rtt = result[name]["non_persistent"]["p50_us"]
        gapped = fdatasync_us(disk_dir, opts.samples, gap_s=rtt / 1e6)
        stored = result[name]["persistent"]["p50_us"]
        result[name].update({
            "fdatasync_after_idle_rtt": gapped,
            "floor_p50_us": round(rtt + gapped["p50_us"], 1),
            "above_floor_p50_us": round(stored - rtt - gapped["p50_us"], 1),
            "ratio_to_back_to_back": round(
                stored / result["fdatasync_back_to_back"]["p50_us"], 2)})
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
