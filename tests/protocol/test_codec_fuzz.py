"""Property specs of the codec: round trips through any split of the stream, and robustness.

Examples per test default to a CI-friendly count; set SLUICE_FUZZ_EXAMPLES to search harder,
e.g. ``SLUICE_FUZZ_EXAMPLES=20000 pytest tests/protocol/test_codec_fuzz.py``.
"""

from __future__ import annotations

import os
from itertools import pairwise

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluicemq.errors import ProtocolError
from sluicemq.protocol.codec import FrameParser, encode_frame
from sluicemq.protocol.frames import ALL_COMMANDS, Frame
from sluicemq.protocol.headers import UNESCAPED_COMMANDS

EXAMPLES = int(os.environ.get("SLUICE_FUZZ_EXAMPLES", "200"))
fuzz_settings = settings(
    max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

# Any character UTF-8 can carry, except NUL, which never belongs in a header.
header_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"))
tricky_text = st.text(st.sampled_from(list(":\\\n\rabc é✓")), max_size=12)
any_text = st.one_of(header_text, tricky_text)
bodies = st.one_of(st.binary(max_size=300), st.sampled_from([b"", b"\0", b"\n\0\r\n", b"\0" * 9]))
heart_beats = st.sampled_from([b"", b"", b"\n", b"\r\n", b"\n\n", b"\r\n\n\r\n"])


def representable(command: str, version: str, key: str, value: str) -> bool:
    """Whether the version can carry this header losslessly (escaping needs 1.1+, CR needs 1.2)."""
    if key == "content-length":
        return False  # the encoder owns it
    if version == "1.0" or command in UNESCAPED_COMMANDS:
        return "\n" not in key + value and ":" not in key and not value.endswith("\r")
    return version == "1.2" or not value.endswith("\r")


@st.composite
def frames_for(draw: st.DrawFn, version: str) -> Frame:
    command = draw(st.sampled_from(sorted(ALL_COMMANDS)))
    pairs = draw(st.lists(st.tuples(any_text, any_text), max_size=6))
    headers = {k: v for k, v in pairs if representable(command, version, k, v)}
    return Frame(command, headers, draw(bodies))


@st.composite
def streams(draw: st.DrawFn) -> tuple[str, list[Frame], bytes, list[int]]:
    """A version, frames, their encoding interleaved with heart-beats, and read boundaries."""
    version = draw(st.sampled_from(["1.0", "1.1", "1.2"]))
    frames = draw(st.lists(frames_for(version), min_size=1, max_size=5))
    parts = [draw(heart_beats)]
    for frame in frames:
        parts += (encode_frame(frame, version), draw(heart_beats))
    data = b"".join(parts)
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=8)))
    return version, frames, data, cuts


def chunks(data: bytes, cuts: list[int]) -> list[bytes]:
    bounds = [0, *cuts, len(data)]
    return [data[a:b] for a, b in pairwise(bounds)]


def as_received(frame: Frame) -> Frame:
    """What the parser must produce: the frame plus the content-length the encoder wrote."""
    headers = dict(frame.headers)
    if frame.body:
        headers["content-length"] = str(len(frame.body))
    return Frame(frame.command, headers, frame.body)


@fuzz_settings
@given(streams(), st.sampled_from([bytes, bytearray, memoryview]))
def test_round_trip_through_any_split_and_coalescing(
    stream: tuple[str, list[Frame], bytes, list[int]], kind: type
) -> None:
    version, frames, data, cuts = stream
    parser = FrameParser(version=version)
    got: list[Frame] = []
    for chunk in chunks(data, cuts):
        got += parser.feed(kind(chunk))
    assert got == [as_received(f) for f in frames]
    assert parser.buffered == 0


def mutate(data: bytes, edits: list[tuple[int, int, int]]) -> bytes:
    """Apply (kind, position, byte) edits: 0 flips a byte, 1 inserts one, 2 deletes one."""
    out = bytearray(data)
    for kind, pos, byte in edits:
        if not out:
            out.append(byte)
            continue
        pos %= len(out)
        if kind == 0:
            out[pos] = byte
        elif kind == 1:
            out.insert(pos, byte)
        else:
            del out[pos]
    return bytes(out)


interesting_bytes = st.one_of(st.integers(0, 255), st.sampled_from(b"\n\r\0:\\c0123456789"))
edits = st.lists(
    st.tuples(st.integers(0, 2), st.integers(0, 10_000), interesting_bytes), max_size=6
)
hostile = st.one_of(
    st.binary(max_size=600),
    st.builds(lambda s, e: mutate(s[2], e), streams(), edits),
)

LIMITS = {"max_frame_bytes": 512, "max_headers": 8, "max_header_line": 96}


def run(data: bytes, cuts: list[int], version: str) -> tuple[list[Frame], int] | None:
    """Feed ``data`` in reads; return (frames, buffered), or None if it was rejected."""
    parser = FrameParser(version=version, **LIMITS)
    got: list[Frame] = []
    try:
        for chunk in chunks(data, cuts):
            got += parser.feed(chunk)
            assert parser.buffered <= LIMITS["max_frame_bytes"]
    except ProtocolError as exc:
        assert exc.fatal
        return None
    for frame in got:
        assert len(frame.headers) <= LIMITS["max_headers"]
        assert len(frame.body) < LIMITS["max_frame_bytes"]
    return got, parser.buffered


@fuzz_settings
@given(
    hostile,
    st.lists(st.integers(0, 700), max_size=10),
    st.sampled_from(["1.0", "1.1", "1.2"]),
)
def test_hostile_bytes_yield_frames_or_protocol_error_within_bounded_memory(
    data: bytes, cuts: list[int], version: str
) -> None:
    cuts = sorted(c for c in cuts if c <= len(data))
    chunked = run(data, cuts, version)
    # Reads must not change the verdict: same frames and leftover, or rejected either way.
    assert chunked == run(data, [], version)
    assert chunked == run(data, list(range(1, len(data))), version)
