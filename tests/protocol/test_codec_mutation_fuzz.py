"""Spec: 100,000 mutated byte strings (CI; bench/fuzz_codec.py runs 10 M with the same engine)
fed to the frame parser in random pieces give frames or ProtocolError, the same whether they
are parsed all at once or a frame or two per call, and every frame that parses round-trips
through the encoder."""

from __future__ import annotations

import os
import random
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from fuzz_codec import corpus, mutate, run_one

INPUTS = int(os.environ.get("SLUICE_CODEC_FUZZ_INPUTS", "100000"))


def test_mutated_frames_parse_or_are_refused_never_crash() -> None:
    rng = random.Random(16)
    pool = corpus()
    crashes: list[tuple[bytes, str]] = []
    for _ in range(INPUTS):
        data = mutate(rng.choice(pool), rng, pool)
        try:
            run_one(data, rng)
        except Exception:
            crashes.append((data, traceback.format_exc()))
        if len(pool) < 5000 and rng.random() < 0.01:
            pool.append(data)
    assert not crashes, f"{len(crashes)} crashes, first: {crashes[0][0]!r}\n{crashes[0][1]}"
