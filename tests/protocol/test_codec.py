"""Spec of sluicemq.protocol.codec: the incremental STOMP frame parser and the encoder."""

from __future__ import annotations

import time
from typing import Any

import pytest

from sluicemq.buffers import BufferPool, InputBuffers
from sluicemq.errors import ProtocolError
from sluicemq.protocol.codec import (
    MAX_COMMAND_LINE,
    FrameParser,
    encode_frame,
    encode_frames,
    encode_head,
)
from sluicemq.protocol.frames import Frame


def parse_all(data: bytes, **kwargs: Any) -> list[Frame]:
    """Parse a whole stream in one feed and insist nothing is left over."""
    parser = FrameParser(**kwargs)
    frames = parser.feed(data)
    assert parser.buffered == 0
    return frames


def parse_bytewise(data: bytes, **kwargs: Any) -> list[Frame]:
    parser = FrameParser(**kwargs)
    frames: list[Frame] = []
    for i in range(len(data)):
        frames += parser.feed(data[i : i + 1])
    assert parser.buffered == 0
    return frames


def rejects(data: bytes, match: str, **kwargs: Any) -> ProtocolError:
    """Assert the stream is refused whether it arrives at once or byte by byte."""
    for feed in (parse_all, parse_bytewise):
        with pytest.raises(ProtocolError, match=match) as info:
            feed(data, **kwargs)
    assert info.value.fatal
    return info.value


class TestFraming:
    def test_frame_with_content_length(self) -> None:
        data = b"SEND\ndestination:/queue/a\ncontent-length:5\n\nhello\x00"
        assert parse_all(data) == [
            Frame("SEND", {"destination": "/queue/a", "content-length": "5"}, b"hello")
        ]

    def test_without_content_length_the_body_ends_at_the_first_nul(self) -> None:
        frames = parse_all(b"SEND\ndestination:/q\n\nab\x00SEND\n\ncd\x00")
        assert frames == [Frame("SEND", {"destination": "/q"}, b"ab"), Frame("SEND", {}, b"cd")]
        assert parse_all(b"SEND\n\nab\x00") == [Frame("SEND", {}, b"ab")]

    def test_content_length_body_may_contain_nul_and_newlines(self) -> None:
        body = b"\x00\n\n\x00\r\n"
        frames = parse_all(b"SEND\ncontent-length:6\n\n" + body + b"\x00")
        assert frames[0].body == body

    def test_frame_without_headers_or_body(self) -> None:
        assert parse_all(b"DISCONNECT\n\n\x00") == [Frame("DISCONNECT")]

    def test_zero_content_length(self) -> None:
        assert parse_all(b"SEND\ncontent-length:0\n\n\x00")[0].body == b""

    def test_several_frames_in_one_feed_come_out_in_order(self) -> None:
        data = b"BEGIN\ntransaction:t\n\n\x00SEND\ncontent-length:1\n\nx\x00COMMIT\n\n\x00"
        assert [f.command for f in parse_all(data)] == ["BEGIN", "SEND", "COMMIT"]

    def test_any_split_of_the_stream_gives_the_same_frames(self) -> None:
        data = (
            b"\nSEND\r\ndestination:/q\r\ncontent-length:3\r\n\r\nabc\x00\r\n"
            b"SUBSCRIBE\nid:1\ndestination:/q\n\n\x00\n\nACK\nid:7\n\nzz\x00"
        )
        expected = parse_all(data)
        assert len(expected) == 3
        assert parse_bytewise(data) == expected
        for cut in range(1, len(data)):
            parser = FrameParser()
            assert parser.feed(data[:cut]) + parser.feed(data[cut:]) == expected
            assert parser.buffered == 0

    def test_partial_frame_is_held_and_counted_in_buffered(self) -> None:
        parser = FrameParser()
        assert parser.feed(b"SEND\ncontent-length:11\n\nhel") == []
        assert parser.buffered == len(b"SEND\ncontent-length:11\n\nhel")
        assert parser.feed(b"lo worl") == []
        [frame] = parser.feed(b"d\x00")
        assert frame.body == b"hello world"
        assert parser.buffered == 0

    @pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
    def test_accepts_bytes_bytearray_and_memoryview(self, kind: type) -> None:
        parser = FrameParser()
        data = b"SEND\ncontent-length:3\n\nabc\x00SEND\n\nde"
        assert parser.feed(kind(data)) == [Frame("SEND", {"content-length": "3"}, b"abc")]
        assert parser.feed(kind(b"f\x00")) == [Frame("SEND", {}, b"def")]

    @pytest.mark.parametrize("size", [10, 1000, 5000, 20_000])
    def test_a_frame_held_over_from_one_read_completes_with_the_next_whatever_its_length(
            self, size: int) -> None:
        """A short partial frame is joined to the next read, a long one added to in place:
        either way the same frames, every body its own bytes, nothing held at the end."""
        frames = [Frame("SEND", {"destination": "/q", "n": str(i), "content-length": str(size)},
                        bytes([65 + i]) * size) for i in range(4)]
        stream = b"".join(encode_frame(f) for f in frames)
        for read in (size // 2 + 7, size + 33, 3 * size + 1):
            parser = FrameParser()
            got: list[Frame] = []
            for at in range(0, len(stream), read):
                got += parser.feed(stream[at:at + read])
            assert got == frames
            assert all(type(f.body) is bytes for f in got) and parser.buffered == 0

    def test_frames_do_not_alias_a_buffer_the_caller_reuses(self) -> None:
        parser = FrameParser()
        chunk = bytearray(b"SEND\ncontent-length:3\n\nabc\x00SEND\ncontent-length:2\n\nx")
        frames = parser.feed(chunk)
        chunk[:] = b"\xff" * len(chunk)
        frames += parser.feed(bytearray(b"y\x00"))
        assert [f.body for f in frames] == [b"abc", b"xy"]
        assert all(type(f.body) is bytes for f in frames)

    def test_large_body_in_small_reads_is_reassembled_exactly(self) -> None:
        body = bytes(range(256)) * 4096  # 1 MiB, NULs included
        data = encode_frame(Frame("SEND", {"destination": "/q"}, body))
        parser = FrameParser()
        frames: list[Frame] = []
        for i in range(0, len(data), 65536):
            frames += parser.feed(data[i : i + 65536])
        assert frames == [Frame("SEND", {"destination": "/q", "content-length": str(len(body))},
                                body)]

    def test_large_body_costs_linear_time_in_its_reads(self) -> None:
        # 32 MiB in 64 KiB reads: a parser that re-joined or rescanned per read would take
        # seconds here; a linear one takes milliseconds.
        size = 32 << 20
        head = b"SEND\ncontent-length:" + str(size).encode() + b"\n\n"
        chunk = b"x" * 65536
        parser = FrameParser()
        start = time.process_time()
        parser.feed(head)
        for _ in range(size // len(chunk)):
            assert parser.feed(chunk) == []
        [frame] = parser.feed(b"\x00")
        assert len(frame.body) == size
        assert time.process_time() - start < 2.0

    def test_nul_terminated_large_body_is_scanned_once(self) -> None:
        size = 16 << 20
        parser = FrameParser()
        parser.feed(b"SEND\n\n")
        start = time.process_time()
        chunk = b"y" * 65536
        for _ in range(size // len(chunk)):
            assert parser.feed(chunk) == []
        [frame] = parser.feed(b"\x00")
        assert len(frame.body) == size
        assert time.process_time() - start < 2.0

    def test_pipelined_small_frames_parse_in_linear_time(self) -> None:
        # A parser that rescanned its buffer from the start for every frame would be quadratic
        # here: 10k frames in one read, then the same frames straddling 64 KiB read boundaries.
        one = encode_frame(Frame("SEND", {"destination": "/q"}, b"z" * 100))
        data = one * 10_000
        start = time.process_time()
        assert len(FrameParser().feed(data)) == 10_000
        parser = FrameParser()
        frames: list[Frame] = []
        for i in range(0, len(data), 65536):
            frames += parser.feed(data[i : i + 65536])
        assert len(frames) == 10_000
        assert time.process_time() - start < 2.0


def test_a_feed_may_stop_after_some_frames_and_parse_on_later() -> None:
    """A caller spreading a large read over several turns gets every frame once, in order."""
    stream = b"".join(encode_frame(Frame("SEND", {"n": str(i)}, b"x" * (i % 3)), "1.2")
                      for i in range(10)) + b"SEND\nn:10\n"  # and half of the eleventh
    parser = FrameParser()
    got = parser.feed(stream, max_frames=4)
    assert [f.headers["n"] for f in got] == ["0", "1", "2", "3"]
    got += parser.feed(b"", max_frames=4)
    got += parser.feed(b"\nlast\x00")  # no limit: the rest, and the eleventh completed
    assert [f.headers["n"] for f in got] == [str(i) for i in range(11)]
    assert got[-1].body == b"last" and parser.buffered == 0


class TestLineEndingsAndHeartBeats:
    @pytest.mark.parametrize("eol", [b"\n", b"\r\n", b"\n\n\r\n\n"])
    def test_heart_beats_between_frames_are_skipped(self, eol: bytes) -> None:
        frame = b"SEND\n\nx\x00"
        assert parse_all(eol + frame + eol + frame + eol) == [Frame("SEND", {}, b"x")] * 2

    def test_a_stream_of_only_heart_beats_yields_nothing_and_holds_nothing(self) -> None:
        parser = FrameParser()
        for _ in range(100):
            assert parser.feed(b"\n") == []
            assert parser.feed(b"\r\n") == []
        assert parser.buffered == 0

    def test_crlf_command_and_header_lines(self) -> None:
        data = b"SEND\r\ndestination:/q\r\nreceipt:1\r\n\r\nhi\x00"
        assert parse_all(data) == [Frame("SEND", {"destination": "/q", "receipt": "1"}, b"hi")]

    def test_mixed_line_endings_in_one_frame(self) -> None:
        data = b"SEND\r\na:1\nb:2\r\n\nbody\x00"
        assert parse_all(data) == [Frame("SEND", {"a": "1", "b": "2"}, b"body")]

    def test_crlf_blank_line_wins_over_a_later_lf_blank_line_in_the_body(self) -> None:
        data = b"SEND\r\na:1\r\n\r\nx\n\ny\x00"
        assert parse_all(data) == [Frame("SEND", {"a": "1"}, b"x\n\ny")]

    def test_a_cr_ending_a_header_line_does_not_end_the_headers(self) -> None:
        data = b"SEND\na:1\r\nb:2\n\nx\r\n\r\ny\x00"
        assert parse_all(data) == [Frame("SEND", {"a": "1", "b": "2"}, b"x\r\n\r\ny")]


class TestHeaders:
    def test_first_occurrence_of_a_repeated_header_wins(self) -> None:
        data = b"MESSAGE\nfoo:World\nfoo:Hello\n\n\x00"
        assert parse_all(data)[0].headers == {"foo": "World"}

    def test_values_are_not_trimmed(self) -> None:
        assert parse_all(b"SEND\n a : b \n\n\x00")[0].headers == {" a ": " b "}

    def test_empty_value(self) -> None:
        assert parse_all(b"SEND\nreceipt:\n\n\x00")[0].headers == {"receipt": ""}

    def test_raw_colon_in_value_splits_at_the_first_colon(self) -> None:
        # Lenient on purpose: many 1.0-era clients send message ids like "ID:host-1:2".
        assert parse_all(b"ACK\nid:ID:host-1:2\n\n\x00")[0].headers == {"id": "ID:host-1:2"}

    def test_utf8_keys_and_values(self) -> None:
        data = "SEND\nclé:valeur ✓\n\n\x00".encode()
        assert parse_all(data)[0].headers == {"clé": "valeur ✓"}

    def test_stomp_1_2_unescapes_keys_and_values(self) -> None:
        data = b"SEND\nk\\cey:a\\cb\\nc\\\\d\\re\n\n\x00"
        assert parse_all(data)[0].headers == {"k:ey": "a:b\nc\\d\re"}

    def test_first_occurrence_is_judged_after_unescaping(self) -> None:
        data = b"SEND\na\\cb:1\na\\cb:2\n\n\x00"
        assert parse_all(data)[0].headers == {"a:b": "1"}

    def test_stomp_1_1_has_no_cr_escape(self) -> None:
        assert parse_all(b"SEND\nk:a\\nb\n\n\x00", version="1.1")[0].headers == {"k": "a\nb"}
        rejects(b"SEND\nk:a\\rb\n\n\x00", "undefined escape", version="1.1")

    def test_stomp_1_0_takes_header_text_literally(self) -> None:
        data = b"SEND\npath:C:\\temp\\new\n\n\x00"
        assert parse_all(data, version="1.0")[0].headers == {"path": "C:\\temp\\new"}

    @pytest.mark.parametrize("command", ["CONNECT", "STOMP", "CONNECTED"])
    def test_handshake_frames_are_never_unescaped(self, command: str) -> None:
        data = command.encode() + b"\npasscode:se\\cret\\t\n\n\x00"
        assert parse_all(data)[0].headers == {"passcode": "se\\cret\\t"}

    def test_version_can_change_after_negotiation(self) -> None:
        parser = FrameParser(version="1.0")
        assert parser.feed(b"SEND\nk:a\\nb\n\n\x00")[0].headers == {"k": "a\\nb"}
        parser.version = "1.2"
        assert parser.feed(b"SEND\nk:a\\nb\n\n\x00")[0].headers == {"k": "a\nb"}

    def test_unknown_version_is_refused(self) -> None:
        with pytest.raises(ValueError, match="version"):
            FrameParser(version="2.0")
        parser = FrameParser()
        with pytest.raises(ValueError, match="version"):
            parser.version = "1.3"

    def test_content_length_may_carry_surrounding_spaces(self) -> None:
        assert parse_all(b"SEND\ncontent-length: 2 \n\nab\x00")[0].body == b"ab"

    def test_limits_are_inclusive(self) -> None:
        headers = b"".join(b"h%d:v\n" % i for i in range(5))
        assert len(parse_all(b"SEND\n" + headers + b"\n\x00", max_headers=5)[0].headers) == 5
        line = b"k:" + b"v" * 98
        assert parse_all(b"SEND\n" + line + b"\n\n\x00", max_header_line=100)
        frame = b"SEND\ncontent-length:4\n\nabcd\x00"
        assert parse_all(frame, max_frame_bytes=len(frame))
        for eol in (b"\n", b"\r\n"):  # command and header lines, up to the blank line
            head = b"SEND" + eol + b"k:" + b"v" * 90
            frame = head + eol + eol + b"\x00"
            limit = len(head) + len(eol) - 1  # a CRLF's CR counts, as part of its line
            assert parse_all(frame, max_header_bytes=limit)
            assert parse_bytewise(frame, max_header_bytes=limit)


class TestErrors:
    def test_overlong_command_line(self) -> None:
        rejects(b"A" * (MAX_COMMAND_LINE + 1), "command line")

    @pytest.mark.parametrize(
        "data",
        [
            b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\n\n\x00",  # a TLS ClientHello
            b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
            b"SEND 1\n\n\x00",
            b"S\xc3\xa9ND\n\n\x00",
        ],
    )
    def test_command_that_is_not_ascii_letters(self, data: bytes) -> None:
        rejects(data, "invalid command")

    def test_bad_command_is_refused_on_arrival_not_at_end_of_line(self) -> None:
        with pytest.raises(ProtocolError, match="invalid command"):
            FrameParser().feed(b"\x16\x03\x01")
        with pytest.raises(ProtocolError, match="invalid command"):
            FrameParser().feed(b"GET /")

    def test_header_line_without_colon(self) -> None:
        rejects(b"SEND\ndestination /q\n\n\x00", "without ':'")

    def test_too_many_headers(self) -> None:
        headers = b"".join(b"h%d:v\n" % i for i in range(6))
        rejects(b"SEND\n" + headers + b"\n\x00", "max_headers=5", max_headers=5)

    def test_header_line_too_long(self) -> None:
        line = b"k:" + b"v" * 99
        rejects(b"SEND\n" + line + b"\n\n\x00", "max_header_line=100", max_header_line=100)

    def test_header_line_too_long_is_refused_before_it_ends(self) -> None:
        parser = FrameParser(max_header_line=100)
        with pytest.raises(ProtocolError, match="max_header_line"):
            parser.feed(b"SEND\nk:" + b"v" * 200)

    def test_header_section_too_large(self) -> None:
        for eol in (b"\n", b"\r\n"):
            head = b"SEND" + eol + b"a:" + b"v" * 50 + eol + b"b:" + b"v" * 50
            frame = head + eol + eol + b"\x00"
            limit = len(head) + len(eol) - 2
            rejects(frame, f"frame headers exceed max_header_bytes={limit}",
                    max_header_bytes=limit)

    def test_header_section_too_large_is_refused_before_it_ends(self) -> None:
        """Megabytes of headers cost the broker more than their size: never buffered whole."""
        parser = FrameParser(max_header_bytes=1000)
        parser.feed(b"SEND\n")
        with pytest.raises(ProtocolError, match="max_header_bytes=1000"):
            for i in range(100):
                parser.feed(b"h%d:%s\n" % (i, b"v" * 90))

    def test_content_length_over_the_limit_is_refused_before_the_body_arrives(self) -> None:
        parser = FrameParser(max_frame_bytes=1000)
        with pytest.raises(ProtocolError, match="exceeds max_frame_bytes=1000"):
            parser.feed(b"SEND\ncontent-length:5000\n\n")

    def test_frame_one_byte_over_the_limit(self) -> None:
        frame = b"SEND\ncontent-length:4\n\nabcd\x00"
        rejects(frame, "max_frame_bytes", max_frame_bytes=len(frame) - 1)
        rejects(b"SEND\n\nabcd\x00", "max_frame_bytes", max_frame_bytes=10)

    def test_nul_terminated_body_over_the_limit_is_refused_without_waiting_for_nul(self) -> None:
        parser = FrameParser(max_frame_bytes=1000)
        parser.feed(b"SEND\n\n")
        with pytest.raises(ProtocolError, match="max_frame_bytes"):
            for _ in range(100):
                parser.feed(b"x" * 100)

    def test_endless_headers_are_refused_at_the_frame_limit(self) -> None:
        parser = FrameParser(max_frame_bytes=1000, max_headers=10_000)
        parser.feed(b"SEND\n")
        with pytest.raises(ProtocolError, match="max_frame_bytes"):
            for _ in range(1000):
                parser.feed(b"k:v\n")

    @pytest.mark.parametrize(
        "value", [b"abc", b"-1", b"1.5", b"", b"0x10", b"+3", b"1_0", "\uff13".encode(), b"9" * 30,
                  b"9" * 5000]  # past int()'s 4,300 digits: was ValueError, not ProtocolError
    )
    def test_bad_content_length(self, value: bytes) -> None:
        rejects(b"SEND\ncontent-length:" + value + b"\n\nabc\x00", "content-length")

    def test_body_not_followed_by_nul(self) -> None:
        rejects(b"SEND\ncontent-length:2\n\nabc\x00", "not followed by NUL")

    def test_undefined_escape(self) -> None:
        rejects(b"SEND\nk:a\\tb\n\n\x00", r"undefined escape sequence '\\\\t'")

    def test_invalid_utf8_in_headers(self) -> None:
        rejects(b"SEND\nk:\xff\xfe\n\n\x00", "UTF-8")

    def test_nul_inside_headers_means_a_missing_blank_line(self) -> None:
        # The 1.0 spec's own DISCONNECT example forgets the blank line; fail fast, don't hang.
        rejects(b"DISCONNECT\nreceipt:77\n\x00", "blank line missing")

    def test_parser_is_unusable_after_an_error(self) -> None:
        parser = FrameParser()
        with pytest.raises(ProtocolError):
            parser.feed(b"SEND\nno colon here\n\n\x00")
        assert parser.buffered == 0
        with pytest.raises(ProtocolError, match="already rejected"):
            parser.feed(b"SEND\n\n\x00")


class TestEncode:
    def test_exact_wire_format(self) -> None:
        frame = Frame("SEND", {"destination": "/queue/a", "receipt": "r1"}, b"hello")
        assert encode_frame(frame) == (
            b"SEND\ndestination:/queue/a\nreceipt:r1\ncontent-length:5\n\nhello\x00"
        )

    def test_empty_body_has_no_content_length(self) -> None:
        receipt = Frame("RECEIPT", {"receipt-id": "7"})
        assert encode_frame(receipt) == b"RECEIPT\nreceipt-id:7\n\n\x00"
        assert encode_frame(Frame("DISCONNECT")) == b"DISCONNECT\n\n\x00"

    def test_stale_content_length_header_is_replaced(self) -> None:
        frame = Frame("MESSAGE", {"content-length": "999", "destination": "/q"}, b"abc")
        assert encode_frame(frame) == b"MESSAGE\ndestination:/q\ncontent-length:3\n\nabc\x00"
        empty = Frame("MESSAGE", {"content-length": "999"})
        assert encode_frame(empty) == b"MESSAGE\n\n\x00"

    def test_header_order_is_preserved(self) -> None:
        frame = Frame("SEND", {"z": "1", "a": "2", "m": "3"})
        assert encode_frame(frame) == b"SEND\nz:1\na:2\nm:3\n\n\x00"

    def test_escaping_follows_the_version(self) -> None:
        frame = Frame("MESSAGE", {"k:1": "a\\b\nc\r"})
        assert encode_frame(frame, "1.2") == b"MESSAGE\nk\\c1:a\\\\b\\nc\\r\n\n\x00"
        frame11 = Frame("MESSAGE", {"k:1": "a\\b\nc\rd"})
        assert encode_frame(frame11, "1.1") == b"MESSAGE\nk\\c1:a\\\\b\\nc\rd\n\n\x00"
        frame10 = Frame("MESSAGE", {"id": "ID:x\\y"})
        assert encode_frame(frame10, "1.0") == b"MESSAGE\nid:ID:x\\y\n\n\x00"

    @pytest.mark.parametrize("command", ["CONNECT", "STOMP", "CONNECTED"])
    def test_handshake_frames_are_never_escaped(self, command: str) -> None:
        frame = Frame(command, {"passcode": "a:b\\c"})
        assert encode_frame(frame, "1.2") == command.encode() + b"\npasscode:a:b\\c\n\n\x00"

    @pytest.mark.parametrize(
        ("frame", "version"),
        [
            (Frame("SEND", {"k": "a\nb"}), "1.0"),
            (Frame("SEND", {"k:x": "v"}), "1.0"),
            (Frame("SEND", {"k": "v\r"}), "1.0"),
            (Frame("SEND", {"k": "v\r"}), "1.1"),
            (Frame("CONNECT", {"login": "a\nb"}), "1.2"),
            (Frame("CONNECTED", {"a:b": "v"}), "1.2"),
            (Frame("SEND", {"k": "a\x00b"}), "1.2"),
            (Frame("SEND", {}), "2.0"),
        ],
    )
    def test_unrepresentable_headers_are_refused(self, frame: Frame, version: str) -> None:
        with pytest.raises(ValueError):
            encode_frame(frame, version)

    def test_head_body_and_nul_can_be_written_separately(self) -> None:
        frame = Frame("MESSAGE", {"destination": "/q"}, b"payload")
        assert encode_head(frame) + frame.body + b"\x00" == encode_frame(frame)

    def test_encode_frames_concatenates(self) -> None:
        frames = [Frame("SEND", {"a": "1"}, b"x"), Frame("RECEIPT", {"receipt-id": "2"})]
        assert encode_frames(frames, "1.1") == b"".join(encode_frame(f, "1.1") for f in frames)
        assert encode_frames([]) == b""

    def test_bytearray_and_memoryview_bodies(self) -> None:
        for body in (bytearray(b"abc"), memoryview(b"abc")):
            assert encode_frame(Frame("SEND", {}, body)) == b"SEND\ncontent-length:3\n\nabc\x00"

    def test_encoded_frames_parse_back(self) -> None:
        frame = Frame("MESSAGE", {"message-id": "ID:1:2", "x": "é\n\\"}, b"\x00body\x00")
        for version in ("1.1", "1.2"):
            [back] = parse_all(encode_frame(frame, version), version=version)
            assert back.headers == {**frame.headers, "content-length": "6"}
            assert back.body == frame.body


# -- large bodies arriving in pieces (gathered, joined once) -----------------------------------

def _large_frames(size: int) -> tuple[bytes, bytes]:
    body = bytes(range(256)) * (size // 256) + b"\x01" * (size % 256)
    first = b"SEND\ndestination:/queue/big\ncontent-length:%d\n\n" % size + body + b"\x00"
    second = b"SEND\ndestination:/queue/small\n\nhi\x00"
    return body, first + b"\n" + second


@pytest.mark.parametrize("piece", [997, 4096, 65535, 65536, 100_000, 1 << 20])
def test_a_large_body_cut_anywhere_arrives_whole_and_the_next_frame_follows(piece: int) -> None:
    body, stream = _large_frames(300_001)
    for data_type in (bytes, bytearray, memoryview):
        parser = FrameParser()
        frames: list[Frame] = []
        for i in range(0, len(stream), piece):
            frames += parser.feed(data_type(stream[i : i + piece]))
        assert [f.headers["destination"] for f in frames] == ["/queue/big", "/queue/small"]
        assert frames[0].body == body and type(frames[0].body) is bytes
        assert frames[1].body == b"hi"
        assert parser.buffered == 0


@pytest.mark.parametrize("piece", [997, 65536, 200_000])
def test_with_body_buffers_a_large_body_is_gathered_in_place_into_a_kept_buffer(
        piece: int) -> None:
    """A parser given ``body_buffers`` copies a large body straight into the buffer it is
    offered and hands out a view of it: same bytes, no join, no fresh multi-MiB allocation."""
    body, stream = _large_frames(300_001)
    offered: list[bytearray] = []

    def kept(size: int) -> memoryview:
        offered.append(bytearray(size + 1000))  # larger than asked, as a pool's may be
        return memoryview(offered[-1])

    parser = FrameParser(body_buffers=kept)
    frames: list[Frame] = []
    for i in range(0, len(stream), piece):
        frames += parser.feed(memoryview(stream[i : i + piece]))
    assert [f.body for f in frames] == [body, b"hi"]
    assert isinstance(frames[0].body, memoryview) and frames[0].body.obj is offered[0]
    assert len(offered) == 1 and parser.buffered == 0


def test_a_kept_buffer_is_viewed_while_it_is_filled_so_a_pool_cannot_hand_it_out_twice(
        ) -> None:
    body, stream = _large_frames(300_001)
    pool = BufferPool(keep=1, largest=1 << 20)
    parser = FrameParser(body_buffers=pool.take)

    def in_two_reads() -> Frame:
        parser.feed(stream[:100_000])
        big, _small = parser.feed(stream[100_000:])
        return big

    parser.feed(stream[:100_000])
    assert pool.take(10) is None  # the only kept buffer is being filled
    [first, _small] = parser.feed(stream[100_000:])
    assert isinstance(first.body, memoryview) and pool.take(10) is None  # first's body now
    second = in_two_reads()
    assert type(second.body) is bytes and second.body == body == first.body  # joined afresh
    kept = first.body.obj
    del first
    third = in_two_reads()
    assert isinstance(third.body, memoryview) and third.body.obj is kept  # reused
    assert third.body == body


def test_without_a_kept_buffer_on_offer_the_body_is_joined_as_before() -> None:
    body, stream = _large_frames(300_001)
    parser = FrameParser(body_buffers=lambda size: None)
    [big, small] = parser.feed(stream)
    assert big.body == body and type(big.body) is bytes and small.body == b"hi"


def test_a_large_body_split_exactly_before_its_nul_waits_for_the_nul() -> None:
    body, stream = _large_frames(200_000)
    cut = stream.index(body) + len(body)
    parser = FrameParser()
    assert parser.feed(stream[:1000]) == []
    assert parser.feed(stream[1000:cut]) == []
    assert parser.buffered == len(body)  # counted while it is gathered
    frames = parser.feed(stream[cut:])
    assert [f.body for f in frames] == [body, b"hi"]
    assert parser.buffered == 0


def test_a_large_body_not_ended_by_nul_where_content_length_says_is_refused() -> None:
    body, stream = _large_frames(200_000)
    end = stream.index(body) + len(body)
    bad = stream[:end] + b"X" + stream[end + 1 :]
    parser = FrameParser()
    parser.feed(bad[:5000])
    with pytest.raises(ProtocolError, match="not followed by NUL"):
        parser.feed(bad[5000:])
    with pytest.raises(ProtocolError, match="already rejected"):
        parser.feed(b"\n")


@pytest.mark.parametrize("own_bytes", [False, True])
@pytest.mark.parametrize("piece", [997, 65536, 200_000])
def test_input_read_into_the_body_room_makes_the_same_frames_as_feeding_it(
        piece: int, own_bytes: bool) -> None:
    """A transport that reads into buffers puts a large body's bytes where ``body_room``
    says and reports them with ``filled``; everything else (heads, the NUL after the body)
    goes through ``feed``. The frames are the same as when every byte is fed; read into bytes
    of its own (the broker's ``InputBuffers.body``), the body is those bytes, not a view."""
    body, stream = _large_frames(300_001)
    pool = BufferPool(keep=1, largest=1 << 20)
    parser = FrameParser(body_buffers=InputBuffers().body if own_bytes else pool.take)
    frames: list[Frame] = []
    pos = roomed = 0
    while pos < len(stream):
        room = parser.body_room()
        n = min(piece, len(stream) - pos) if room is None else min(piece, len(room))
        if room is None:
            frames += parser.feed(stream[pos:pos + n])
        else:
            room[:n] = stream[pos:pos + n]
            parser.filled(n)
            roomed += n
        pos += n
    assert [f.body for f in frames] == [body, b"hi"]
    assert 0 < roomed < len(body) and parser.body_room() is None and parser.buffered == 0
    assert type(frames[0].body) is (bytes if own_bytes else memoryview)


def test_there_is_no_body_room_without_a_kept_buffer_or_between_frames() -> None:
    body, stream = _large_frames(300_001)
    assert FrameParser().body_room() is None
    joined = FrameParser()  # no body_buffers: a large body is gathered in pieces and joined
    joined.feed(stream[:1000])
    assert joined.body_room() is None
    kept = FrameParser(body_buffers=BufferPool(keep=1, largest=1 << 20).take)
    kept.feed(stream[:1000])
    room = kept.body_room()
    assert room is not None and len(room) == len(body) - (1000 - stream.index(body))
