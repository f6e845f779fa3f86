"""Mutation fuzzing of the STOMP codec: millions of inputs, zero crashes allowed.

Run: ``.venv/bin/python bench/fuzz_codec.py [--inputs 10000000] [--seed 1] [--out DIR]``.

Each input is a mutated byte string grown from a corpus of valid frames (all commands, all
three versions, escapes, content-length and NUL-terminated bodies): bit flips, byte inserts and
deletes, splices of two inputs, repeated runs and truncation. It is fed to a fresh
``FrameParser`` cut at random points, with small limits so the limit paths run too. The only
acceptable outcomes are frames or ``ProtocolError``; any other exception is a crash, saved
under ``--out`` with its traceback. Every frame that parses is also re-encoded and parsed again:
a frame that the encoder refuses is fine (ValueError), one that comes back different is a bug.

atheris (coverage-guided) is used instead when it is installed and ``--atheris`` is given.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
import traceback
from pathlib import Path

from sluicemq.errors import ProtocolError
from sluicemq.protocol.codec import FrameParser, encode_frame
from sluicemq.protocol.frames import ALL_COMMANDS, Frame

VERSIONS = ("1.0", "1.1", "1.2")


def corpus() -> list[bytes]:
    """Valid frames of every command and version, plus classic edge cases."""
    seeds: list[bytes] = []
    headers = [{}, {"destination": "/queue/a", "receipt": "r1"},
               {"id": "1", "ack": "client-individual", "selector": "x = 'a:b'"},
               {"message-id": "ID:sluice-1", "k\\ey": "va:l\nue", "transaction": "tx"}]
    for command in sorted(ALL_COMMANDS):
        for version in VERSIONS:
            for h in headers:
                for body in (b"", b"hello", b"a\0b", bytes(range(256))):
                    try:
                        seeds.append(encode_frame(Frame(command, dict(h), body), version))
                    except ValueError:
                        continue
    seeds += [b"\n\n\r\n", b"SEND\ncontent-length:5\n\nab\0cd\0",
              b"SEND\r\ndestination:/queue/a\r\n\r\nx\0", b"CONNECT\n\n\0" * 3,
              b"SEND\ncontent-length:-1\n\n\0", b"SEND\ncontent-length:99999999999\n\n\0",
              b"MESSAGE\nk:\\x\n\n\0", b"SEND\n" + b"h:v\n" * 50 + b"\n\0"]
    return seeds


def mutate(data: bytes, rng: random.Random, pool: list[bytes]) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randint(1, 6)):
        op = rng.randrange(7)
        pos = rng.randrange(len(buf) + 1)
        if op == 0 and buf:
            buf[min(pos, len(buf) - 1)] ^= 1 << rng.randrange(8)
        elif op == 1:
            buf[pos:pos] = bytes([rng.choice(b"\0\n\r:\\cntSx\xff")])
        elif op == 2 and buf:
            del buf[pos:pos + rng.randint(1, 8)]
        elif op == 3:
            other = rng.choice(pool)
            start = rng.randrange(len(other) + 1)
            buf[pos:pos] = other[start:start + rng.randint(1, 64)]
        elif op == 4 and buf:
            chunk = buf[pos:pos + rng.randint(1, 16)]
            buf[pos:pos] = chunk * rng.randint(1, 20)
        elif op == 5:
            buf = buf[:pos]
        else:
            buf[pos:pos] = rng.randbytes(rng.randint(1, 8))
    return bytes(buf)


def run_one(data: bytes, rng: random.Random) -> None:
    """Parse `data` in random pieces; re-encode what parsed and check it round-trips. The
    same pieces parsed a few frames per call (``max_frames``, what a session does to spread a
    read over loop turns) must give the same frames and the same refusal."""
    version = rng.choice(VERSIONS)
    limits = {"version": version, "max_frame_bytes": rng.choice((64, 4096, 1 << 20)),
              "max_headers": rng.choice((2, 100)), "max_header_line": rng.choice((16, 8192)),
              "max_header_bytes": rng.choice((24, 1 << 20))}
    steps = []
    pos = 0
    while pos < len(data):
        step = rng.choice((1, 3, 17, len(data)))
        steps.append(data[pos:pos + step])
        pos += step
    frames, refused = _parse(FrameParser(**limits), steps, 0)  # type: ignore[arg-type]
    again, refused_again = _parse(FrameParser(**limits), steps,  # type: ignore[arg-type]
                                  rng.choice((1, 2)))
    # A refusal drops the frames parsed in the same call, so a few-at-a-time run may have
    # returned more of them before it; otherwise they must be the same.
    if refused_again != refused or again[:len(frames)] != frames or (
            not refused and again != frames):
        raise AssertionError(f"max_frames changed {frames!r}/{refused} into "
                             f"{again!r}/{refused_again}")
    if refused:
        return
    for frame in frames:
        try:
            wire = encode_frame(frame, version)
        except ValueError:
            continue  # not representable in this version: the encoder says so
        again = FrameParser(version=version).feed(wire)
        if [_sans_length(f) for f in again] != [_sans_length(frame)]:
            raise AssertionError(f"round trip changed {frame!r} into {again!r}")


def _parse(parser: FrameParser, steps: list[bytes], max_frames: int) -> tuple[list[Frame], bool]:
    """Frames from feeding ``steps`` (``max_frames`` a call, then parsing on until nothing is
    left), and whether the stream was refused."""
    frames: list[Frame] = []
    try:
        for piece in steps:
            got = parser.feed(piece, max_frames=max_frames)
            frames += got
            while max_frames and len(got) == max_frames:
                got = parser.feed(b"", max_frames=max_frames)
                frames += got
    except ProtocolError:
        return frames, True
    return frames, False


def _sans_length(frame: Frame) -> Frame:
    """The encoder writes its own content-length, so only the rest must survive."""
    headers = {k: v for k, v in frame.headers.items() if k != "content-length"}
    return Frame(frame.command, headers, frame.body)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inputs", type=int, default=10_000_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, default=Path("fuzz-crashes"))
    ap.add_argument("--atheris", action="store_true", help="coverage-guided, if installed")
    args = ap.parse_args()
    if args.atheris:
        return run_atheris()
    rng = random.Random(args.seed)
    pool = corpus()
    crashes = 0
    started = time.perf_counter()
    for i in range(args.inputs):
        data = mutate(rng.choice(pool), rng, pool)
        try:
            run_one(data, rng)
        except Exception:
            crashes += 1
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / f"crash-{i}.bin").write_bytes(data)
            (args.out / f"crash-{i}.txt").write_text(traceback.format_exc())
        if len(pool) < 5000 and rng.random() < 0.01:
            pool.append(data)  # mutants breed: deeper states over time
        if (i + 1) % 200_000 == 0:
            rate = (i + 1) / (time.perf_counter() - started)
            print(f"{i + 1:,} inputs, {crashes} crashes, {rate:,.0f}/s", flush=True)
    elapsed = time.perf_counter() - started
    print(f"fuzz_codec: {args.inputs:,} inputs in {elapsed:.1f}s "
          f"({args.inputs / elapsed:,.0f}/s), {crashes} crashes")
    return 1 if crashes else 0


def run_atheris() -> int:  # pragma: no cover - optional tool
    try:
        import atheris
    except ImportError:
        print("atheris is not installed; run without --atheris", file=sys.stderr)
        return 2

    def one(data: bytes) -> None:
        run_one(data, random.Random(len(data)))

    atheris.Setup(sys.argv[:1], one)
    atheris.Fuzz()
    return 0


if __name__ == "__main__":
    sys.exit(main())
