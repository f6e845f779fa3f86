"""Spec of `sluice send` / `sluice receive`, run as real subprocesses against a real broker,
including kill -9 mid-transfer on either side and a rerun that finishes the job."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from sluice_testing import eventually
from sluicemq.cli.main import build_cli
from sluicemq.cli.transfer import parse_size
from sluicemq.client import Client

SLUICE = [sys.executable, "-m", "sluicemq"]


def sluice(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SLUICE, *args], capture_output=True, text=True, timeout=timeout)


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout


def kill_once(args: list[str], started: Callable[[], bool]) -> None:
    """Start `sluice ARGS`, wait until ``started()`` shows it moved bytes, then kill -9 it
    (rate-limited, it must not have finished)."""
    proc = subprocess.Popen([*SLUICE, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        eventually(lambda: started() or proc.poll() is not None, "the transfer under way")
        assert proc.poll() is None, "finished before it could be interrupted"
    finally:
        proc.kill()
        proc.wait(30)


def test_parse_size_units() -> None:
    assert parse_size("4096") == 4096
    assert parse_size("64KiB") == parse_size("64k") == 64 * 1024
    assert parse_size("1MiB") == 1 << 20
    assert parse_size("2MB") == 2_000_000
    with pytest.raises(ValueError):
        parse_size("lots")


def test_send_then_receive_files(broker, tmp_path: Path) -> None:
    files = [tmp_path / "a.bin", tmp_path / "empty.txt", tmp_path / "c.dat"]
    for f, size in zip(files, (300_001, 0, 70_000), strict=True):
        f.write_bytes(os.urandom(size))
    out = ok(sluice("send", *map(str, files), "--url", broker.url, "--to", "files",
                    "--chunk-size", "64KiB"))
    assert out.count("sent ") == 3 and "to /queue/files as stream" in out
    result = sluice("receive", "--url", broker.url, "--from", "files", "--dir",
                    str(tmp_path / "out"), "--count", "3", "--timeout", "10")
    received = ok(result).split()
    assert sorted(Path(p).name for p in received) == ["a.bin", "c.dat", "empty.txt"]
    for f in files:
        assert (tmp_path / "out" / f.name).read_bytes() == f.read_bytes()


def test_receive_times_out_when_fewer_files_arrive(broker, tmp_path: Path) -> None:
    result = sluice("receive", "--url", broker.url, "--from", "none", "--dir", str(tmp_path),
                    "--count", "1", "--timeout", "0.5", "-q")
    assert result.returncode == 1
    assert "received 0 of 1" in result.stderr


def test_bad_chunk_size_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x")
    result = CliRunner().invoke(build_cli(), ["send", str(tmp_path / "f"), "--url",
                                              "stomp://127.0.0.1:1", "--to", "q",
                                              "--chunk-size", "huge"])
    assert result.exit_code == 2 and "not a size" in result.stderr


def test_killed_send_and_killed_receive_both_resume_on_rerun(broker, tmp_path: Path) -> None:
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(6 << 20))
    out_dir = tmp_path / "out"
    send = ["send", str(src), "--url", broker.url, "--to", "big", "--chunk-size", "64KiB",
            "--window", "1"]
    with Client(broker.url) as c:  # some chunks stored, most not
        kill_once([*send, "--limit-rate", "2MiB"], lambda: c.head("/queue/big").count >= 4)
    assert "resumed at byte" in ok(sluice(*send, "-q"))

    receive = ["receive", "--url", broker.url, "--from", "big", "--dir", str(out_dir),
               "--count", "1", "--timeout", "10", "--window", "1"]

    def partial() -> list[Path]:
        return list((out_dir / ".sluice-partial").glob("*.part"))

    kill_once([*receive, "--limit-rate", "2MiB"],
              lambda: any(p.stat().st_size > 0 for p in partial()))
    parts = partial()
    assert len(parts) == 1 and 0 < parts[0].stat().st_size < src.stat().st_size
    assert not (out_dir / "big.bin").exists()
    assert ok(sluice(*receive, "-q")).strip() == str(out_dir / "big.bin")
    assert (out_dir / "big.bin").read_bytes() == src.read_bytes()
    assert not list((out_dir / ".sluice-partial").iterdir())


def test_a_sent_file_goes_again_only_when_asked_and_to_every_destination(broker,
                                                                        tmp_path: Path) -> None:
    """A rerun never claims "sent" for bytes it did not send: a file the broker holds complete
    for that destination is skipped (said so, exit 0), even with --no-resume; --again sends
    another copy; another destination is another stream."""
    src = tmp_path / "report.csv"
    src.write_bytes(os.urandom(150_000))
    base = ["--url", broker.url, "--chunk-size", "64KiB", "-q"]

    def receive(queue: str, into: str, count: int = 1) -> subprocess.CompletedProcess[str]:
        return sluice("receive", "--url", broker.url, "--from", queue, "--dir",
                      str(tmp_path / into), "--count", str(count), "--timeout", "3", "-q")

    first = ok(sluice("send", str(src), "--to", "a", *base))
    assert first.startswith(f"sent {src} (150000 bytes) to /queue/a as stream ")
    assert ok(receive("a", "a1")).strip() == str(tmp_path / "a1" / "report.csv")
    assert (tmp_path / "a1" / "report.csv").read_bytes() == src.read_bytes()

    for extra in ([], ["--no-resume"]):  # consumed or not, the broker knows it complete
        again = ok(sluice("send", str(src), "--to", "a", *base, *extra))
        assert again.startswith(f"skipped {src}: already sent to /queue/a as stream ")
        assert "--again sends it again" in again and "\nsent " not in f"\n{again}"
    with_bar = sluice("send", str(src), "--to", "a", *base[:-1])  # no -q: a progress bar
    assert ok(with_bar).startswith(f"skipped {src}: ")
    assert "report.csv" not in with_bar.stderr, "a bar for a file that was not sent"
    assert "received 0 of 1" in receive("a", "nothing").stderr

    copy = ok(sluice("send", str(src), "--to", "a", "--again", *base))
    other = ok(sluice("send", str(src), "--to", "/queue/b", *base))
    third = ok(sluice("send", str(src), "--to", "a", "--again", *base))
    ids = {line.rsplit(" ", 1)[-1] for line in (first, copy, other, third)}
    assert len(ids) == 4 and all(line.startswith("sent ") for line in (copy, other, third))
    received = ok(receive("a", "a2", count=2)).split()
    assert len(received) == 2
    ok(receive("b", "b1"))
    for got in (tmp_path / "a2" / "report.csv", tmp_path / "b1" / "report.csv"):
        assert got.read_bytes() == src.read_bytes()


def test_receive_count_takes_no_chunk_of_the_next_stream(broker, tmp_path: Path) -> None:
    """`--count N` ends the flow at the Nth stream's end: the broker never hands the receiver
    a chunk of the stream after (which, unread, would go to the next receiver again: a
    delivered_fraction above 1), whatever the window."""
    files = [tmp_path / f"f{i}.bin" for i in range(3)]
    for f in files:
        f.write_bytes(os.urandom(10 * 4096))
    ok(sluice("send", *map(str, files), "--url", broker.url, "--to", "seq", "--chunk-size",
              "4KiB", "-q"))

    def delivered() -> dict[str, int]:
        return {s["name"]: s["delivered_bytes"] for s in broker.api("streams")["streams"]}

    for i, want in enumerate((["f0.bin"], ["f1.bin", "f2.bin"])):
        got = ok(sluice("receive", "--url", broker.url, "--from", "seq", "--dir",
                        str(tmp_path / f"out{i}"), "--count", str(len(want)), "--window", "8",
                        "--timeout", "10", "-q")).split()
        assert [Path(p).name for p in got] == want
        sizes = delivered()
        assert all(sizes[name] == 10 * 4096 for name in want), sizes
        if i == 0:
            assert sizes["f1.bin"] == sizes["f2.bin"] == 0, sizes  # not one chunk of them
    assert {s["delivered_fraction"] for s in broker.api("streams")["streams"]} == {1.0}
