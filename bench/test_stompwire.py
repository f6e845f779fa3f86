"""Spec of the load generator's client-side wire layer and its statistics helpers.

Run with `.venv/bin/python -m pytest bench/test_stompwire.py` (bench/ is outside testpaths).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stompload import build_parser, combine, latency_summary, percentile, run_once, split
from stompwire import FrameParser, WireError, WireFrame, encode_frame, header_value

MESSAGE = (
    b"MESSAGE\ndestination:/queue/a\nmessage-id:ID\\cvm-1\\c7\nack:ID\\cvm-1\\c7\n"
    b"content-length:5\n\nhel\x00o\x00"
)


def feed_in_chunks(parser: FrameParser, data: bytes, cuts: list[int]) -> list[WireFrame]:
    frames: list[WireFrame] = []
    last = 0
    for cut in [*sorted(set(cuts)), len(data)]:
        frames += parser.feed(data[last:cut])
        last = cut
    return frames


def test_content_length_frame_may_contain_nul() -> None:
    [frame] = FrameParser().feed(MESSAGE)
    assert frame.command == b"MESSAGE"
    assert frame.body == b"hel\x00o"
    assert frame.body_len == 5


def test_header_values_stay_escaped_so_ack_ids_echo_byte_for_byte() -> None:
    [frame] = FrameParser().feed(MESSAGE)
    assert frame.get(b"ack") == b"ID\\cvm-1\\c7"
    assert frame.get(b"missing") is None


def test_first_header_occurrence_wins() -> None:
    [frame] = FrameParser().feed(b"MESSAGE\nfoo:1\nfoo:2\n\n\x00")
    assert frame.get(b"foo") == b"1"


def test_header_lookup_matches_whole_names_only() -> None:
    assert header_value(b"\nx-receipt-id:9\nreceipt-id:7", b"receipt-id") == b"7"


def test_body_without_content_length_ends_at_first_nul() -> None:
    frames = FrameParser().feed(b"RECEIPT\nreceipt-id:7\n\n\x00ERROR\nmessage:bad\n\noops\x00")
    assert [f.command for f in frames] == [b"RECEIPT", b"ERROR"]
    assert frames[0].get(b"receipt-id") == b"7"
    assert frames[1].body == b"oops"


def test_crlf_line_endings_are_accepted() -> None:
    [frame] = FrameParser().feed(b"CONNECTED\r\nversion:1.2\r\nserver:x\r\n\r\n\x00")
    assert frame.command == b"CONNECTED"
    assert frame.get(b"version") == b"1.2"
    assert frame.get(b"server") == b"x"


def test_heartbeat_eols_between_frames_are_ignored() -> None:
    frames = FrameParser().feed(b"\n\r\n" + MESSAGE + b"\n\n" + MESSAGE + b"\n")
    assert len(frames) == 2


def test_frame_without_headers() -> None:
    [frame] = FrameParser().feed(b"RECEIPT\n\n\x00")
    assert frame.command == b"RECEIPT"
    assert frame.get(b"receipt-id") is None


@given(st.lists(st.integers(min_value=0, max_value=3 * len(MESSAGE)), max_size=40))
def test_any_chunking_yields_the_same_frames(cuts: list[int]) -> None:
    stream = MESSAGE + b"\n" + b"RECEIPT\nreceipt-id:1\n\n\x00" + MESSAGE
    frames = feed_in_chunks(FrameParser(), stream, cuts)
    assert [(f.command, f.body) for f in frames] == [
        (b"MESSAGE", b"hel\x00o"), (b"RECEIPT", b""), (b"MESSAGE", b"hel\x00o")
    ]


@given(st.lists(st.integers(min_value=0, max_value=3 * len(MESSAGE)), max_size=40))
def test_skipped_bodies_are_counted_not_kept(cuts: list[int]) -> None:
    frames = feed_in_chunks(FrameParser(skip_bodies=True), MESSAGE * 3, cuts)
    assert [(f.body, f.body_len) for f in frames] == [(None, 5)] * 3
    assert [f.get(b"ack") for f in frames] == [b"ID\\cvm-1\\c7"] * 3


def test_large_body_streamed_in_small_reads_is_skipped_in_linear_time() -> None:
    body = b"x" * (8 * 1024 * 1024)
    data = b"MESSAGE\ncontent-length:%d\n\n" % len(body) + body + b"\x00"
    parser = FrameParser(skip_bodies=True)
    started = time.perf_counter()
    frames = feed_in_chunks(parser, data, list(range(0, len(data), 4096)))
    assert time.perf_counter() - started < 2.0
    assert [f.body_len for f in frames] == [len(body)]


def test_header_end_search_does_not_rescan_a_trickling_header_block() -> None:
    data = b"MESSAGE\n" + b"h:" + b"v" * 200_000 + b"\n\n\x00"
    parser = FrameParser()
    started = time.perf_counter()
    frames = feed_in_chunks(parser, data, list(range(0, len(data), 16)))
    assert time.perf_counter() - started < 2.0
    assert len(frames) == 1


def test_body_not_followed_by_nul_is_an_error() -> None:
    with pytest.raises(WireError):
        FrameParser().feed(b"MESSAGE\ncontent-length:2\n\nabc\x00")


def test_unterminated_header_block_is_bounded() -> None:
    with pytest.raises(WireError):
        FrameParser().feed(b"MESSAGE\n" + b"x" * 300_000)


def test_encode_frame_round_trips_through_the_parser() -> None:
    headers = [(b"destination", b"/queue/q"), (b"content-length", b"3")]
    [frame] = FrameParser().feed(encode_frame(b"SEND", headers, b"a\x00b"))
    assert frame.command == b"SEND"
    assert frame.get(b"destination") == b"/queue/q"
    assert frame.body == b"a\x00b"


def test_percentile_is_nearest_rank() -> None:
    values = list(range(1, 101))
    assert percentile(values, 50) == 50
    assert percentile(values, 99) == 99
    assert percentile(values, 100) == 100
    assert percentile([7], 99) == 7


def test_latency_summary_reports_milliseconds() -> None:
    assert latency_summary("lat", [1_000_000, 2_000_000, 3_000_000]) == {
        "lat_p50_ms": 2.0, "lat_p99_ms": 3.0, "lat_max_ms": 3.0
    }
    assert latency_summary("lat", []) == {}


def test_split_spreads_the_remainder() -> None:
    assert split(10, 3) == [4, 3, 3]
    assert sum(split(8000, 8)) == 8000


def test_combine_takes_medians_and_keeps_runs_and_errors() -> None:
    opts = argparse.Namespace(
        scenario="persist", label="x", size=1024, count=10, producers=1, window=1,
        persistent=False, rate=0.0, ack="auto", prefetch=1000,
    )
    runs = [{"msgs_per_s": 100}, {"msgs_per_s": 300}, {"msgs_per_s": 200}, {"error": "boom"}]
    out = combine(opts, runs)
    assert out["msgs_per_s"] == 200
    assert out["errors"] == ["boom"]
    assert out["params"]["persistent"] is True
    assert len(out["runs"]) == 4


def test_a_broker_that_stops_answering_fails_the_run_instead_of_hanging() -> None:
    async def scenario() -> dict[str, object]:
        async def silent_broker(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\x00")
            writer.write(b"CONNECTED\nversion:1.2\n\n\x00")  # then never a RECEIPT
            await reader.read()

        server = await asyncio.start_server(silent_broker, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        opts = build_parser().parse_args(
            ["persist", "--port", str(port), "--count", "5", "--window", "1",
             "--idle-timeout", "0.3"])
        async with server:
            return await run_once(opts)

    started = time.perf_counter()
    result = asyncio.run(scenario())
    assert "stalled" in str(result["error"])
    assert time.perf_counter() - started < 5
