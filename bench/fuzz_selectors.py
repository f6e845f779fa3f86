"""Mutation fuzzing of the selector parser and evaluator: millions of inputs, zero crashes.

Run: ``.venv/bin/python bench/fuzz_selectors.py [--inputs 10000000] [--seed 1] [--out DIR]``.

A selector arrives in a SUBSCRIBE header from any client and is evaluated against headers from
any producer, so both halves must be total: each input is a mutated string grown from a corpus
of valid selectors (every operator, literal kind, escape and nesting) by character flips,
token inserts, deletes, splices, repeated runs and truncation. ``compile_selector`` may return
a Selector or raise SelectorError; a compiled one is evaluated against a few header sets
(numeric, textual, empty, missing, huge numbers) and must return a bool. Anything else is a
crash, saved under ``--out`` with its traceback. The same engine runs 100k inputs in CI
(tests/core/test_selector_fuzz.py).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
import traceback
from pathlib import Path

from sluicemq.core.selectors import SelectorError, compile_selector

SEEDS = (
    "color = 'red'", "JMSPriority > 4 AND JMSType <> 'x'", "a = 1 OR b = 2.5 OR c = -3e2",
    "name LIKE 'ab%' ESCAPE '!'", "name NOT LIKE '_x!_%' ESCAPE '!'", "x IN ('a', 'b', 'c')",
    "x NOT IN ('a')", "n BETWEEN 1 AND 10", "n NOT BETWEEN -1 AND 0x1F", "v IS NULL",
    "v IS NOT NULL", "NOT (a = 'b' AND (c > 1 OR d < 2))", "a + b * c / 2 - -1 >= 7",
    "flag = TRUE", "flag = false OR unknown", "JMSCorrelationID = 'it''s'", "x = 'é✓'",
    "big = 9223372036854775807", "f = 1.7976931348623157e308", "oct = 017 AND hex = 0XFF",
    "a_b$c = 'dollar'", "(((a)))", "convert_string_expressions:n = 5",
    "hyphenated_props:x-y = 'z'",
)
TOKENS = ("AND", "OR", "NOT", "(", ")", "'", "''", "=", "<>", "<", ">", "<=", ">=", "+", "-",
          "*", "/", "LIKE", "IN", "BETWEEN", "ESCAPE", "IS", "NULL", "TRUE", "FALSE", ",",
          "1e400", "-0", "0x", "1.", ".5", "9" * 40, "%", "_", "\\", "\0", "\n", " ", "\ud7ff",
          "((((((((((", "))))))))))", "NOT NOT NOT", "a", "JMSDeliveryMode", "convert_string_"
          "expressions:", "hyphenated_props:")
HEADERS = (
    {}, {"a": "1", "b": "2", "c": "3", "n": "5", "x": "a", "flag": "true"},
    {"a": "x", "color": "red", "name": "ab_x", "v": "", "big": "1e309", "f": "nan"},
    {"JMSPriority": "9", "JMSType": "x", "n": "-0", "oct": "15", "hex": "255", "x-y": "z"},
    {"a": "9" * 400, "b": "-inf", "c": "0", "d": "1.5e-400", "name": "%" * 50},
)


def mutate(text: str, rng: random.Random, pool: list[str]) -> str:
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(7)
        pos = rng.randint(0, len(text))
        if op == 0 and text:  # replace a character
            i = rng.randrange(len(text))
            code = rng.randrange(32, 127) if rng.random() < 0.8 else rng.randrange(0x110000)
            text = text[:i] + chr(code) + text[i + 1:]
        elif op == 1:  # insert a token
            text = text[:pos] + f" {rng.choice(TOKENS)} " + text[pos:]
        elif op == 2 and text:  # delete a run
            end = min(len(text), pos + rng.randint(1, 8))
            text = text[:pos] + text[end:]
        elif op == 3:  # splice with another input
            other = rng.choice(pool)
            text = text[:pos] + other[rng.randint(0, len(other)):]
        elif op == 4 and text:  # repeat a run
            end = min(len(text), pos + rng.randint(1, 16))
            text = text[:pos] + text[pos:end] * rng.randint(2, 50) + text[end:]
        elif op == 5:  # truncate
            text = text[:pos]
        else:  # combine with a boolean operator
            text = f"({text}) {rng.choice(('AND', 'OR'))} {rng.choice(pool)}"
    return text


def run_one(text: str) -> None:
    """Compile and evaluate; SelectorError is the only acceptable failure."""
    try:
        selector = compile_selector.__wrapped__(text)
    except SelectorError:
        return
    for headers in HEADERS:
        result = selector.matches(headers)
        if not isinstance(result, bool):
            raise TypeError(f"matches returned {result!r}")


def fuzz(inputs: int, seed: int, out: Path | None = None) -> list[tuple[str, str]]:
    """Run ``inputs`` mutated selectors; returns the crashes (input, traceback)."""
    rng = random.Random(seed)
    pool = list(SEEDS)
    crashes: list[tuple[str, str]] = []
    for i in range(inputs):
        text = mutate(rng.choice(pool), rng, pool)
        if len(text) > 8192:
            text = text[:rng.randint(0, 8192)]
        try:
            run_one(text)
        except Exception:
            crashes.append((text, traceback.format_exc()))
            if out is not None:
                out.mkdir(parents=True, exist_ok=True)
                (out / f"selector-{seed}-{i}.txt").write_text(
                    f"{text!r}\n\n{crashes[-1][1]}", encoding="utf-8")
        if rng.random() < 0.01:  # keep some mutants as seeds, never losing the originals
            if len(pool) < 200:
                pool.append(text)
            else:
                pool[rng.randrange(len(SEEDS), len(pool))] = text
    return crashes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inputs", type=int, default=10_000_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, default=Path("fuzz-crashes"))
    args = ap.parse_args()
    t0 = time.monotonic()
    crashes = fuzz(args.inputs, args.seed, args.out)
    elapsed = time.monotonic() - t0
    print(f"{args.inputs} selector inputs in {elapsed:.1f} s "
          f"({args.inputs / elapsed:,.0f}/s), {len(crashes)} crashes")
    for text, tb in crashes[:5]:
        print(repr(text), tb, sep="\n")
    return 1 if crashes else 0


if __name__ == "__main__":
    sys.exit(main())
