"""Spec: an ``ack:auto`` consumer's persistent messages whose frames never left the broker
come back when its connection ends (plain TCP).

An ack:auto message is consumed when it is handed to the connection, but its frame may still
be in the broker's own buffers when the connection ends: the client resets, a slow reader is
dropped, the broker stops. Those frames are dropped, so their persistent messages go back to
the queue, in their place and order, marked ``redelivered`` as ActiveMQ marks a message that
may have been seen. What the kernel took counts as gone out: the broker's kernel sends it even
after the broker's end, so the client's messages and the ones that come back are every
persistent message once, in order - unless the client resets the connection, which drops what
the broker's kernel still had unsent (TCP's own limit, at most the socket's send buffer). A
non-persistent message in those buffers is gone, as before: keeping each one alive until its
bytes are out cost the broker's memory more than its promise is worth (README, Durability).

The reader here subscribes with a 4 KiB receive buffer, reads a few messages and stops
reading: the broker's runs to it fill its output share and stay there.
"""

from __future__ import annotations

import fcntl
import socket
import struct
import termios
from typing import Any

import pytest
from stomp_helpers import connect, nothing_delivered

from sluice_testing import BrokerProcess, RawStomp, eventually
from sluicemq.protocol.codec import FrameParser, encode_frame
from sluicemq.protocol.frames import Frame

COUNT = 1500
READS = 20
CONFIG = '[limits]\noutput_buffer_bytes = "256 KiB"\n'


def body(n: int) -> bytes:
    return str(n).encode().rjust(8, b".") * (64 + n % 50)


def persistent(n: int, mixed: bool) -> bool:
    return not mixed or n % 3 != 1


def produce(broker: BrokerProcess, destination: str, *, mixed: bool) -> None:
    """``COUNT`` SENDs numbered ``n``, pipelined; with ``mixed`` every third one is
    non-persistent."""
    p = RawStomp(broker.host, broker.port, timeout=60)
    p.connect()
    frames = [encode_frame(Frame("SEND", {
        "destination": destination, "n": str(n),
        "persistent": "true" if persistent(n, mixed) else "false",
        **({"receipt": "done"} if n == COUNT - 1 else {})}, body(n))) for n in range(COUNT)]
    p.send_bytes(b"".join(frames))
    answer = p.recv(timeout=60)
    assert answer.command == "RECEIPT", answer
    p.close()


def stuck_reader(broker: BrokerProcess, destination: str) -> tuple[RawStomp, list[int]]:
    """An ack:auto subscriber that takes ``READS`` messages and stops reading; returns it
    with the numbers it has (the frames its last read brought in too)."""
    s = RawStomp(broker.host, broker.port, timeout=30, rcvbuf=4096)
    s.connect()
    s.send("SUBSCRIBE", {"destination": destination, "id": "s", "ack": "auto", "receipt": "r"})
    assert s.recv().command == "RECEIPT"
    had = [int(s.recv().headers["n"]) for _ in range(READS)]
    had += [int(f.headers["n"]) for f in s.frames]
    s.frames.clear()
    return s, had


def output_buffered(broker: BrokerProcess) -> int:
    return max((c["output_buffered"] for c in broker.api("connections")["connections"]),
               default=0)


def unread(s: RawStomp) -> int:
    return int.from_bytes(fcntl.ioctl(s.sock.fileno(), termios.FIONREAD, bytes(4)), "little")


def settled(broker: BrokerProcess, s: RawStomp) -> None:
    """Wait until the broker holds frames for ``s`` in its buffers and nothing more reaches
    ``s``'s receive buffer (its window is shut)."""
    eventually(lambda: output_buffered(broker) > 0, "frames held for the stuck reader")
    last = [-1]

    def still() -> bool:
        now = unread(s)
        broker.api("connections")  # a round trip between two looks
        same = now == last[0] == unread(s)
        last[0] = now
        return same

    eventually(still, "the stuck reader's receive buffer settled")


def frames_in(data: bytes, parser: FrameParser) -> list[int]:
    return [int(f.headers["n"]) for f in parser.feed(data) if f.command == "MESSAGE"]


def read_to_end(s: RawStomp) -> list[int]:
    """What still reaches ``s`` until the broker's end of the connection (whole frames)."""
    got = [int(f.headers["n"]) for f in s.frames]
    s.sock.settimeout(30)
    while data := s.sock.recv(1 << 16):
        got += frames_in(data, s.parser)
    return got


def the_rest(broker: BrokerProcess, destination: str, expected: int) -> tuple[list[int], int]:
    """A new consumer gets ``expected`` messages, in order, once each, whole, the ones given
    back first, marked redelivered, and then nothing; returns their numbers and how many of
    them are marked."""
    c, lc = connect(broker)
    c.subscribe(destination, id="rest", ack="auto")
    frames = [lc.next(timeout=30) for _ in range(expected)]
    assert nothing_delivered(c, lc)
    c.disconnect()
    got = [int(f.headers["n"]) for f in frames]
    assert got == sorted(set(got)), "once each, in order"
    assert all(f.body.encode() == body(int(f.headers["n"])) for f in frames)
    marks = [f.headers.get("redelivered") == "true" for f in frames]
    given = marks.index(False) if False in marks else len(marks)
    assert not any(marks[given:])
    return got, given


@pytest.mark.parametrize("ending", ["the client resets", "dropped as a slow reader",
                                    "the broker stops"])
def test_what_never_left_the_broker_comes_back_in_order(broker_factory: Any,
                                                       ending: str) -> None:
    """Whichever way the connection ends, the reader's messages and those that come back
    are every persistent message once, in order."""
    config = CONFIG + ("slow_reader_seconds = 1.0\n" if ending == "dropped as a slow reader"
                       else "")
    broker = broker_factory(config_text=config)
    destination = "/queue/give.back"
    produce(broker, destination, mixed=ending != "the broker stops")
    mark = broker.mark()
    s, had = stuck_reader(broker, destination)
    if ending != "dropped as a slow reader":  # (which it is within a second)
        settled(broker, s)
    if ending == "the client resets":
        # what its kernel took is the client's: its unread receive buffer, read in place
        had += frames_in(s.sock.recv(1 << 20, socket.MSG_PEEK), s.parser)
        s.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
    elif ending == "dropped as a slow reader":
        broker.wait_for_log("slow reader", since=mark, timeout=60)
        had += read_to_end(s)
        s.close()
    else:
        assert broker.stop() == 0
        had += read_to_end(s)
        s.close()
        broker.restart()
    assert had == list(range(len(had)))
    assert READS <= len(had) < COUNT
    mixed = ending != "the broker stops"
    line = broker.wait_for_log("ack:auto messages still in the broker's buffers", since=mark)
    given = int(line.split(" ended with ")[1].split()[0])
    assert given > 0
    if ending == "the broker stops":  # (a restart does not know they went out once)
        got, back = the_rest(broker, destination, COUNT - len(had))
        assert (got, back) == (list(range(len(had), COUNT)), 0)
        return
    # what the queue holds now: the ones given back, then the ones never handed out
    got, back = the_rest(broker, destination, broker.api("destinations/queue/give.back")["depth"])
    assert back == given and all(persistent(n, mixed) for n in got[:back])
    assert got[back:] == list(range(got[back], COUNT)), "then the never handed out, in order"
    # handed out, neither received nor back: non-persistent, or (a reset) what the broker's
    # kernel still held right after ``had``
    missing = sorted(set(range(len(had), got[back])) - set(got))
    kernel = [n for n in missing if persistent(n, mixed)]
    if ending == "the client resets":
        after = [n for n in range(len(had), COUNT) if persistent(n, mixed)]
        assert kernel == after[:len(kernel)]
        assert sum(len(body(n)) for n in kernel) < 256 << 10, "no more than its kernel held"
    else:
        assert kernel == []
    assert any(not persistent(n, mixed) for n in missing), "non-persistent ones are not kept"
