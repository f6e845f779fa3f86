"""Spec: a queue's lone auto-ack consumer is served in runs (``dispatch._auto_run``,
``SessionContext.deliver_run``), and a run keeps every promise the message-by-message path
keeps - through the real broker, read by stomp.py, our client and raw sockets.

What a run took off the queue but could not write (the connection ran out of room) is back at
the head, in order, never marked redelivered, whichever way the consumer then goes (closed,
unsubscribed, dropped as a slow reader), from memory or paged out after a restart, behind
what the connection's end gave back of what it had written (``test_auto_ack_give_back.py``:
frames still in the broker's buffers, marked redelivered); a consumer
arriving between runs shares the queue without loss or reordering; redelivered messages keep
their count; priorities still come first; and a run writes byte for byte the frames the
single path writes for the same message, in every protocol version.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from stomp_helpers import connect, nothing_delivered, subscribe_with_receipt

from sluice_testing import BrokerProcess, RawStomp, eventually, produce
from sluicemq import Client
from sluicemq.protocol.codec import FrameParser, encode_frame
from sluicemq.protocol.frames import Frame

COUNT = 3000  # ~3.5 MB: far more than a connection's output share and its socket hold
# A connection may hold 32 KiB unsent (the floor), less than one pass's run of 64 messages
# (dispatchpass.DISPATCH_BUDGET): runs stop part way at the room the connection has left
SMALL_SHARE = '[limits]\noutput_buffer_bytes = "32 KiB"\n'


def _body(n: int) -> bytes:
    """Mostly small bodies (a run carries them), every 41st from 4 KiB (the single path)."""
    size = 5000 + n % 7 if n % 41 == 0 else 600 + n * 31 % 900
    return str(n).encode().rjust(8, b".") * (size // 8)


def _headers(n: int) -> dict[str, str]:
    """Every 97th message is of a group (``_each`` places it, the run stops before it): the
    runs between are longer than the room (``SMALL_SHARE``)."""
    h = {"n": str(n), "note": "a:b\\c"}
    if n % 97 == 0:
        h["JMSXGroupID"] = f"g{n % 3}"
    return h


def queue_state(broker: BrokerProcess, name: str) -> dict[str, Any]:
    found: dict[str, Any] = broker.api(f"destinations/queue/{name}")
    return found


def stuck_reader(broker: BrokerProcess, destination: str, reads: int) -> RawStomp:
    """An auto-ack subscriber that reads its first ``reads`` messages and then nothing more
    (a tiny receive buffer): the broker's runs to it stop at the room its connection has."""
    s = RawStomp(broker.host, broker.port, timeout=30, rcvbuf=4096)
    s.connect()
    s.send("SUBSCRIBE", {"destination": destination, "id": "s", "ack": "auto", "receipt": "r"})
    first = s.recv()
    assert first.command == "RECEIPT", first
    for n in range(reads):
        frame = s.recv()
        assert frame.command == "MESSAGE" and frame.headers["n"] == str(n), frame
        assert frame.body == _body(n)
    return s


def abort(s: RawStomp) -> None:
    """Close with a reset (SO_LINGER 0): the consumer is killed, its unread bytes dropped."""
    s.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()


@pytest.mark.parametrize("backlog", ["in memory", "paged out after a restart"])
@pytest.mark.parametrize("leaving", ["killed", "unsubscribed", "dropped as a slow reader"])
def test_what_a_run_could_not_write_waits_at_the_head_in_order(broker_factory, backlog: str,
                                                              leaving: str) -> None:
    """An auto-ack consumer stuck mid-backlog leaves: the messages its runs never wrote come
    next, in order, whole, not marked redelivered, behind those its connection's end gave
    back (written but still in the broker's buffers: marked redelivered); none that left the
    broker comes back - not even after a restart; then the queue holds no memory."""
    config = SMALL_SHARE + '[[policy]]\nqueue = "runs.>"\ncursor_window = 500\n'
    if leaving == "dropped as a slow reader":
        config = config.replace("[limits]\n", "[limits]\nslow_reader_seconds = 1.0\n")
    b = broker_factory(config_text=config)
    name = "runs.stuck"
    produce(b, f"/queue/{name}", COUNT, headers=_headers, body=_body)
    if backlog != "in memory":
        b.stop()
        b.restart()
        assert queue_state(b, name)["paged"] == COUNT
    mark = b.mark()
    s = stuck_reader(b, f"/queue/{name}", 50)
    if leaving == "killed":
        abort(s)
    elif leaving == "unsubscribed":
        s.send("UNSUBSCRIBE", {"id": "s"})
    else:
        b.wait_for_log("slow reader", since=mark, timeout=60)
    eventually(lambda: queue_state(b, name)["consumers"] == 0, "the stuck consumer gone")
    written = queue_state(b, name)["dequeued"]
    assert 50 <= written < COUNT, "the runs stopped at the connection's room"
    # what the connection's end gave back (none when the kernel had taken all it was given)
    given = queue_state(b, name)["depth"] - (COUNT - written)
    assert given >= 0 and (given == 0 or leaving != "unsubscribed")
    if given:
        b.wait_for_log(f"ended with {given} ack:auto messages still in the broker's buffers",
                       since=mark)

    c, lc = connect(b)
    c.subscribe(f"/queue/{name}", id="rest", ack="auto")
    for n in range(written - given, written):
        frame = lc.next(timeout=30)
        assert (frame.headers["n"], frame.headers["redelivered"]) == (str(n), "true")
    for n in range(written, COUNT):
        frame = lc.next(timeout=30)
        assert frame.headers["n"] == str(n)
        assert "redelivered" not in frame.headers
        assert frame.headers["note"] == "a:b\\c"
        assert frame.body.encode() == _body(n)
    assert nothing_delivered(c, lc)
    state = queue_state(b, name)
    assert (state["depth"], state["memory_bytes"], state["paged"]) == (0, 0, 0)
    c.disconnect()
    if leaving == "killed":
        s.close()
    else:  # unsubscribed: the frames its connection still holds come back now
        abort(s)
    eventually(lambda: not b.api("connections")["connections"], "the connections gone")
    given = queue_state(b, name)["depth"]
    assert given == 0 or leaving == "unsubscribed"
    b.stop()
    b.restart()
    with Client(b.url) as q:
        assert q.head(f"/queue/{name}").count == given, "an auto-acked message came back"


@pytest.mark.parametrize("second", ["plain", "with a selector"])
def test_a_consumer_arriving_between_runs_shares_the_queue_without_loss_or_reorder(
        broker_factory, second: str) -> None:
    """While a lone auto-ack consumer's runs are held up by its room, a second consumer (our
    client; plain, or with a selector every message matches) subscribes: every message
    reaches exactly one of them, each sees its own in queue order."""
    b = broker_factory(config_text=SMALL_SHARE)
    destination = "/queue/runs.shared"
    produce(b, destination, COUNT, headers=_headers, body=_body)
    first = stuck_reader(b, destination, 10)
    got_first = list(range(10))
    got_second: list[int] = []
    done = threading.Event()

    def drain_first() -> None:
        while not done.is_set():
            try:
                frame = first.recv(timeout=0.5)
            except TimeoutError:
                continue
            got_first.append(int(frame.headers["n"]))

    with Client(b.url) as client:
        selector = "n IS NOT NULL" if second == "with a selector" else None
        with client.subscribe(destination, ack="auto", selector=selector) as sub:
            reader = threading.Thread(target=drain_first)
            reader.start()
            try:
                deadline = time.monotonic() + 120
                while len(got_first) + len(got_second) < COUNT:
                    assert time.monotonic() < deadline, (len(got_first), len(got_second))
                    m = sub.get(timeout=0.5)
                    if m is not None:
                        got_second.append(int(m.headers["n"]))
                        assert bytes(m.body) == _body(got_second[-1])
            finally:
                done.set()
                reader.join(10)
    assert queue_state(b, "runs.shared")["depth"] == 0
    first.close()
    assert got_first == sorted(got_first) and got_second == sorted(got_second)
    assert sorted(got_first + got_second) == list(range(COUNT)), "lost or twice"
    assert got_second, "the second consumer was given messages"


def test_redelivered_messages_keep_their_count_in_a_run(broker_factory) -> None:
    """Messages a client-ack consumer left unacknowledged reach an auto-ack consumer (served
    in runs) first, in order, marked redelivered with their count; the rest unmarked."""
    broker = broker_factory(config_text=SMALL_SHARE)
    destination = "/queue/runs.again"
    with Client(broker.url) as p:
        for n in range(300):
            p.send(destination, _body(n), headers={"n": str(n)}, receipt=n == 299)
    c, lc = connect(broker)
    subscribe_with_receipt(c, lc, destination, "first", ack="client-individual",
                           headers={"activemq.prefetchSize": "120"})
    assert [lc.next().headers["n"] for _ in range(120)] == [str(n) for n in range(120)]
    c.disconnect()  # none acked: the 120 go back to the head
    with Client(broker.url) as q, q.subscribe(destination, ack="auto") as sub:
        for n in range(300):
            m = sub.get(timeout=10)
            assert m is not None and m.headers["n"] == str(n)
            assert bytes(m.body) == _body(n)
            if n < 120:
                assert (m.headers["redelivered"], m.headers["sluice-delivery-count"]) == (
                    "true", "2")
            else:
                assert "redelivered" not in m.headers


@pytest.mark.parametrize("backlog", ["in memory", "paged out after a restart"])
def test_a_run_still_serves_higher_priorities_first(broker_factory, backlog: str) -> None:
    """A backlog of mixed JMS priorities reaches the auto-ack consumer highest first, in
    sending order within a priority."""
    b = broker_factory(config_text=SMALL_SHARE
                       + '[[policy]]\nqueue = "runs.>"\ncursor_window = 40\n')
    destination = "/queue/runs.prio"
    priorities = [(n, (0, 4, 9, 4, 7)[n % 5]) for n in range(400)]
    with Client(b.url) as p:
        for n, prio in priorities:
            p.send(destination, _body(n), headers={"n": str(n), "priority": str(prio)},
                   receipt=n == 399)
    if backlog != "in memory":
        b.stop()
        b.restart()
    c, lc = connect(b)
    c.subscribe(destination, id="s", ack="auto")
    got = [int(lc.next().headers["n"]) for _ in priorities]
    assert got == [n for n, _ in sorted(priorities, key=lambda np: (-np[1], np[0]))]
    assert nothing_delivered(c, lc)
    c.disconnect()


@pytest.fixture
def small_share(broker_factory) -> BrokerProcess:
    """A broker whose connections hold at most 32 KiB of output each."""
    made: BrokerProcess = broker_factory(config_text=SMALL_SHARE)
    return made


def raw_subscriber(broker: BrokerProcess, topic: str, version: str, ack: str) -> RawStomp:
    s = RawStomp(broker.host, broker.port, timeout=30)
    s.connect(version)
    s.send("SUBSCRIBE", {"destination": topic, "id": "s", "ack": ack, "receipt": "r"})
    answer = s.recv()
    assert answer.command == "RECEIPT" and not s.frames, answer
    return s


def raw_bytes(s: RawStomp, count: int) -> bytes:
    """What the socket carries up to the end of its ``count``th frame, as it came."""
    parser = FrameParser(version=s.version)
    data = b""
    frames = 0
    while frames < count:
        chunk = s.sock.recv(1 << 20)
        assert chunk, "connection closed"
        data += chunk
        frames += len(parser.feed(chunk))
    assert frames == count
    return data


_TEXT = st.text(st.sampled_from("ab:\\\n\r é\t"), max_size=6)
_MESSAGES = st.lists(st.tuples(
    st.dictionaries(st.sampled_from(["x-a", "x:b", "x\\c", "x-d"]), _TEXT, max_size=3),
    st.sampled_from([0, 1, 700, 4095, 4096, 5000]),
    st.sampled_from([{}, {"priority": "9"}, {"persistent": "true"},
                     {"expires": str(int(time.time() * 1000) + 3_600_000)},
                     {"timestamp": "17"}])), min_size=1, max_size=40)


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.2"])
@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(messages=_MESSAGES)
def test_a_run_writes_the_frames_the_single_path_writes(small_share, version: str,
                                                        messages) -> None:
    """The same topic messages to two subscribers alike but for their ack mode - auto (runs)
    and client (one by one) - arrive as the same bytes: escaping, dropped unrepresentable
    headers, content-length and the broker's own headers included."""
    broker = small_share
    topic = f"/topic/runs.bytes.{time.monotonic_ns()}"
    auto = raw_subscriber(broker, topic, version, "auto")
    single = raw_subscriber(broker, topic, version, "client")
    p = RawStomp(broker.host, broker.port, timeout=30)
    p.connect()
    frames = [encode_frame(Frame("SEND", {"destination": topic, **headers, **extra},
                                 bytes(range(256)) * (size // 256) + b"z" * (size % 256)))
              for headers, size, extra in messages]
    frames.append(encode_frame(Frame("SEND", {"destination": topic, "receipt": "all"}, b"")))
    p.send_bytes(b"".join(frames))
    assert p.recv().headers["receipt-id"] == "all"
    try:
        assert raw_bytes(auto, len(frames)) == raw_bytes(single, len(frames))
    finally:
        for s in (auto, single, p):
            s.close()
