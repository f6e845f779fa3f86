"""STOMP over TCP, in process: the real ``StompProtocol`` and keepalive on a real asyncio loop,
in front of the real broker core (``app.build_core``), with an in-memory transport where the
socket would be. What the protocol does with the socket - one write per loop turn, dispatch
held at the connection's share of the output budget, slow readers dropped, a fatal ERROR
written before the half-close, refusals before any session, heart-beats - is read off that
transport. (The same over real sockets: tests/e2e/test_protocol.py, test_hostile.py.)

Waits are for loop turns or for what a timer of the protocol does (bounded, never a sleep).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from inprocess import config_for
from sluicemq.app import Core, Loop, build_core
from sluicemq.config import Limits
from sluicemq.protocol.codec import FrameParser, encode_frame
from sluicemq.protocol.frames import Frame
from sluicemq.transport.tcp import CONNECTION_BYTES, StompProtocol

WAIT_SECONDS = 10.0  # a failing spec's bound on a timer of the protocol


class MemoryTransport(asyncio.Transport):
    """The socket side: each write or writelines is one entry of ``events``; how much the
    kernel still holds (``backlog``) is what the spec says."""

    def __init__(self, peer: str = "10.0.0.7") -> None:
        super().__init__()
        self.peer = (peer, 40_000)
        self.events: list[Any] = []  # bytes of one write call, or "eof" / "close" / "abort"
        self.given: list[Any] = []  # every buffer handed to writelines, as it was given
        self.backlog = 0
        self.backlog_asked = 0
        self.limits: tuple[int | None, int | None] | None = None
        self.reading = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.peer if name == "peername" else default

    def write(self, data: Any) -> None:
        self.events.append(bytes(data))

    def writelines(self, list_of_data: Any) -> None:
        self.given.extend(list_of_data)
        self.events.append(b"".join(bytes(d) for d in list_of_data))

    def get_write_buffer_size(self) -> int:
        self.backlog_asked += 1
        return self.backlog

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self.limits = (high, low)

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.events.append("eof")

    def close(self) -> None:
        self.events.append("close")

    def abort(self) -> None:
        self.events.append("abort")

    def is_closing(self) -> bool:
        return any(e in ("close", "abort") for e in self.events)

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def writes(self) -> list[bytes]:
        return [e for e in self.events if isinstance(e, bytes)]

    def frames(self) -> list[Frame]:
        return FrameParser(version="1.2").feed(b"".join(self.writes()))


class Peer:
    """A StompProtocol joined to a MemoryTransport, as the loop's accept would do."""

    def __init__(self, core: Core, connections: set[StompProtocol], address: str) -> None:
        self.protocol = StompProtocol(core.services, connections)
        self.transport = MemoryTransport(address)
        self.protocol.connection_made(self.transport)

    def send(self, command: str, headers: dict[str, str] | None = None,
             body: bytes = b"") -> None:
        self.protocol.data_received(encode_frame(Frame(command, headers or {}, body), "1.2"))

    def commands(self) -> list[str]:
        return [f.command for f in self.transport.frames()]


async def turns(done: Callable[[], bool], limit: int = 1000) -> None:
    """Let the loop run until ``done()`` - loop turns only, no time passes on purpose."""
    for _ in range(limit):
        if done():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"not done within {limit} loop turns")


async def timer(done: Callable[[], bool]) -> None:
    """Wait for what a timer of the protocol does, checked on every loop wake-up."""
    async with asyncio.timeout(WAIT_SECONDS):
        while not done():
            await asyncio.sleep(0.005)  # paces the re-check; the protocol's timer decides


class Harness:
    def __init__(self, core: Core) -> None:
        self.core = core
        self.connections: set[StompProtocol] = set()

    def peer(self, address: str = "10.0.0.7") -> Peer:
        return Peer(self.core, self.connections, address)

    async def connected(self, heart_beat: str = "0,0", address: str = "10.0.0.7") -> Peer:
        p = self.peer(address)
        p.send("CONNECT", {"accept-version": "1.2", "host": "/", "heart-beat": heart_beat})
        await turns(lambda: "CONNECTED" in p.commands())
        return p


@asynccontextmanager
async def broker(tmp_path: Path, **limits: Any) -> AsyncIterator[Harness]:
    """The broker core on this loop (journal, store, broker, recovery), closed at the end."""
    loop = asyncio.get_running_loop()
    config = config_for(tmp_path / "data", limits=replace(Limits(), **limits))
    core = build_core(config, Loop(loop.call_soon, loop.call_later, loop.call_soon_threadsafe))
    try:
        yield Harness(core)
    finally:
        core.store.close()


def test_what_one_loop_turn_writes_leaves_in_one_write(tmp_path: Path) -> None:
    async def spec() -> None:
        async with broker(tmp_path) as b:
            p = b.peer()
            p.protocol.data_received(b"".join(
                encode_frame(f, "1.2") for f in [
                    Frame("CONNECT", {"accept-version": "1.2", "host": "/"}),
                    *(Frame("SUBSCRIBE", {"destination": f"/queue/{i}", "id": str(i),
                                          "receipt": f"r{i}"}) for i in range(3))]))
            await turns(lambda: len(p.transport.frames()) == 4)
            assert p.commands() == ["CONNECTED", "RECEIPT", "RECEIPT", "RECEIPT"]
            assert len(p.transport.writes()) == 1

    asyncio.run(spec())


def test_dispatch_stops_at_the_connections_share_of_the_output_budget(tmp_path: Path) -> None:
    async def spec() -> None:
        async with broker(tmp_path, output_buffer_bytes=1 << 20) as b:
            p = await b.connected()
            share = b.core.broker.admission.output_share()
            assert p.transport.limits == (share, share // 4), "the socket's buffer follows it"
            p.protocol.write(b"x" * share)  # one turn's frames reach the share
            assert not p.protocol.writable, "no more dispatch to it this turn"
            assert p.protocol.buffered == share
            await turns(lambda: p.protocol.writable)  # flushed: the socket took it
            p.protocol.pause_writing()  # the kernel's buffer is over the share
            assert not p.protocol.writable
            p.protocol.resume_writing()
            assert p.protocol.writable

    asyncio.run(spec())


def test_output_the_socket_has_not_taken_counts_against_the_memory_limit(
        tmp_path: Path) -> None:
    """What a transport still holds after a write is charged to the memory account (re-read
    once a tick, since a socket drains without a word), and the output budget is what queued
    messages leave of memory_limit: a 64 MiB budget under a 1 MiB limit gives no 4 MiB shares."""
    async def spec() -> None:
        async with broker(tmp_path, memory_limit="1 MiB", output_buffer_bytes="64 MiB") as b:
            memory, admission = b.core.broker.memory, b.core.broker.admission
            p = await b.connected()
            fixed = memory.connections + memory.objects  # own state: the connection's, ...
            assert memory.connections == CONNECTION_BYTES
            # the room, not 64 MiB or the 4 MiB cap
            assert admission.output_share() == (1 << 20) - fixed
            memory.used = 768 << 10  # queued messages take most of the limit
            assert admission.output_share() == (256 << 10) - fixed
            memory.used = 0
            p.transport.backlog = 300_000  # the kernel did not take it all
            p.protocol.write(b"x" * 10)
            await turns(lambda: memory.output == 300_000)
            assert memory.held == memory.used + 300_000 + fixed
            p.transport.backlog = 0  # drained, no callback
            b.core.broker.flow.tick()
            assert memory.output == 0
            p.transport.backlog = 50_000
            p.protocol.write(b"y")
            await turns(lambda: memory.output == 50_000)
            p.protocol.connection_lost(None)
            assert memory.output == 0, "a connection gone holds nothing"
            assert memory.connections == 0, "and its own state is no longer charged"

    asyncio.run(spec())


def test_a_topic_message_is_handed_to_every_subscribers_transport_as_one_shared_body(
        tmp_path: Path) -> None:
    """A transport keeps what it is given until its socket takes it, so a body written apart
    from its head is held once however many stuck subscribers wait for it: 200 that stopped
    reading held ~64 MiB of per-subscriber copies of 16 KiB messages. Small bodies still go
    out in one joined write per frame (the copy is cheaper than the extra writes)."""
    async def spec() -> None:
        async with broker(tmp_path) as b:
            subscribers = [await b.connected(address=f"10.0.0.{i}") for i in (7, 8)]
            for p in subscribers:
                p.send("SUBSCRIBE", {"destination": "/topic/t", "id": "s", "receipt": "r"})
                await turns(lambda p=p: "RECEIPT" in p.commands())
            publisher = await b.connected(address="10.0.0.9")
            for body in (b"L" * (16 << 10), b"s" * 100):
                publisher.send("SEND", {"destination": "/topic/t"}, body)
            await turns(lambda: all(p.commands().count("MESSAGE") == 2 for p in subscribers))
            large = [[g for g in p.transport.given if len(g) == 16 << 10] for p in subscribers]
            assert len(large[0]) == len(large[1]) == 1
            assert large[0][0] is large[1][0], "one body, referred to by both transports"
            for p in subscribers:
                small = [f for f in p.transport.given if f.startswith(b"MESSAGE")][-1]
                assert small.endswith(b"s" * 100 + b"\0"), "a small frame is one buffer"
                assert [f.body for f in p.transport.frames()[-2:]] == [b"L" * (16 << 10),
                                                                      b"s" * 100]

    asyncio.run(spec())


def test_a_peer_that_drains_nothing_is_dropped_one_that_drains_slowly_is_kept(
        tmp_path: Path) -> None:
    async def spec() -> None:
        async with broker(tmp_path, slow_reader_seconds=0.05) as b:
            slow, stuck = await b.connected(), await b.connected()
            for p in (slow, stuck):
                p.transport.backlog = 100_000
                p.protocol.pause_writing()
            asked = slow.transport.backlog_asked
            slow.transport.backlog = 90_000  # it took something
            await timer(lambda: "abort" in stuck.transport.events)
            await timer(lambda: slow.transport.backlog_asked > asked)
            assert "abort" not in slow.transport.events

    asyncio.run(spec())


def test_a_fatal_error_is_written_before_the_half_close_and_input_is_still_read(
        tmp_path: Path) -> None:
    async def spec() -> None:
        async with broker(tmp_path) as b:
            p = b.peer()
            p.send("SEND", {"destination": "/queue/a"}, b"before CONNECT")
            await turns(lambda: "eof" in p.transport.events)
            (error,) = p.transport.frames()
            assert error.command == "ERROR"
            assert p.transport.events[-1] == "eof", "the ERROR went out first"
            assert p.transport.reading, "the rest of its input is read (and dropped)"
            assert not p.transport.is_closing(), "no reset that would lose the ERROR"

    asyncio.run(spec())


def test_a_connection_over_the_address_cap_is_refused_before_any_session(
        tmp_path: Path) -> None:
    async def spec() -> None:
        async with broker(tmp_path, max_connections_per_address=1) as b:
            first = await b.connected()
            refused = b.peer()
            assert refused.protocol.session is None
            await turns(lambda: "eof" in refused.transport.events)
            (error,) = refused.transport.frames()
            assert error.command == "ERROR" and "10.0.0.7" in error.headers["message"]
            other_address = await b.connected(address="10.0.0.8")
            assert b.connections == {first.protocol, other_address.protocol}
            first.protocol.connection_lost(None)  # its place is given back
            again = await b.connected()
            assert again.protocol.session is not None

    asyncio.run(spec())


def test_a_silent_connection_is_closed_at_the_connect_timeout(tmp_path: Path) -> None:
    async def spec() -> None:
        async with broker(tmp_path, connect_timeout=0.05) as b:
            p = b.peer()
            await timer(lambda: "eof" in p.transport.events)
            (error,) = p.transport.frames()
            assert error.command == "ERROR" and "CONNECT" in error.headers["message"]

    asyncio.run(spec())


def test_heart_beats_are_sent_when_quiet_and_a_silent_peer_is_closed(tmp_path: Path) -> None:
    async def spec() -> None:
        async with broker(tmp_path, heartbeat_ms=20) as b:
            wants = await b.connected(heart_beat="0,20")  # asks for a beat every 20 ms
            await timer(lambda: b"\n" in wants.transport.writes())
            promised = await b.connected(heart_beat="20,0")  # promises one, sends none
            await timer(lambda: "eof" in promised.transport.events)
            assert "heart-beat" in promised.transport.frames()[-1].headers["message"]
            assert "eof" not in wants.transport.events

    asyncio.run(spec())


def test_acked_bytes_are_unknown_without_a_socket(tmp_path: Path) -> None:
    async def spec() -> None:
        async with broker(tmp_path) as b:
            p = await b.connected()
            assert p.protocol.bytes_out == sum(map(len, p.transport.writes()))
            assert p.protocol.bytes_acked() == -1

    asyncio.run(spec())


def read_in(protocol: StompProtocol, data: bytes, piece: int = 100_000) -> list[object]:
    """What the loop does with a buffered protocol: ask for a buffer, read into it, report
    the count - ``piece`` bytes at most per read, as a socket hands them over. Returns what
    each buffer was a view of (the view itself is let go, as the loop does)."""
    handed = []
    while data:
        buf = protocol.get_buffer(-1)
        n = min(len(buf), len(data), piece)
        buf[:n] = data[:n]
        handed.append(buf.obj)
        del buf
        protocol.buffer_updated(n)
        data = data[n:]
    return handed


def test_a_large_send_body_is_read_into_its_own_buffer_and_arrives_whole(
        tmp_path: Path) -> None:
    """The rest of a large SEND body is read from the socket straight into the bytes its
    message keeps (two copies fewer for every byte); heads, small frames and the NUL after the
    body go through the loop's scratch buffer. Bodies of successive frames never mix: each is
    read into bytes of its own, never written again once its frame is whole."""
    async def spec() -> None:
        async with broker(tmp_path) as b:
            consumer = await b.connected(address="10.0.0.8")
            consumer.send("SUBSCRIBE", {"destination": "/queue/big", "id": "s", "receipt": "r"})
            await turns(lambda: "RECEIPT" in consumer.commands())
            producer = b.peer()
            bodies = [bytes([n]) * 700_000 + bytes(range(256)) for n in (1, 2, 3)]
            stream = b"".join(encode_frame(f, "1.2") for f in [
                Frame("CONNECT", {"accept-version": "1.2", "host": "/"}),
                *(Frame("SEND", {"destination": "/queue/big", "receipt": f"s{i}"}, body)
                  for i, body in enumerate(bodies)),
                Frame("SEND", {"destination": "/queue/big", "receipt": "small"}, b"hi")])
            handed = read_in(producer.protocol, stream)
            await turns(lambda: producer.commands().count("RECEIPT") == 4)
            await turns(lambda: consumer.commands().count("MESSAGE") == 4)
            got = [f.body for f in consumer.transport.frames() if f.command == "MESSAGE"]
            assert got == [*bodies, b"hi"]
            scratch = b.core.services.inputs.scratch.obj
            into_bodies = {id(h) for h in handed if h is not scratch}
            assert len(into_bodies) == 3, "three bodies read into bytes of their own"

    asyncio.run(spec())


def test_a_send_waiting_for_its_receipt_lets_go_of_its_kept_body_buffer(
        tmp_path: Path) -> None:
    """A receipt may come long after its SEND was handled (a persistent chunk waits for its
    consumer's ACK or its write); meanwhile the SEND's kept input buffer must be free for the
    next bodies, or each later body is gathered in fresh memory (a 1 GiB stream of 1 MiB
    chunks, 8 in flight: 712 fresh 1 MiB buffers and 3,051 pieces of 256 KiB; 0 and 959 once
    a waiting receipt let go of its frame)."""
    async def spec() -> None:
        async with broker(tmp_path) as b:
            consumer = await b.connected(address="10.0.0.8")
            consumer.send("SUBSCRIBE", {"destination": "/queue/big", "id": "s", "receipt": "r",
                                        "ack": "client-individual"})
            await turns(lambda: "RECEIPT" in consumer.commands())
            producer = await b.connected()
            scratch = b.core.services.inputs.scratch.obj
            for i in range(4):
                frame = Frame("SEND", {"destination": "/queue/big", "persistent": "true",
                                       "receipt": f"s{i}"}, bytes([i]) * 700_000)
                handed = read_in(producer.protocol, encode_frame(frame, "1.2"))
                assert any(h is not scratch for h in handed), f"body {i} gathered afresh"
            await turns(lambda: consumer.commands().count("MESSAGE") == 4)
            assert producer.commands().count("RECEIPT") < 4  # unacked: some still waiting

    asyncio.run(spec())


def test_write_now_sends_at_once_behind_what_already_waits(tmp_path: Path) -> None:
    """``write_now`` (a receipt answered by an in-place commit) goes out in the same loop
    turn when nothing waits for the flush, and queues behind what does: order is kept."""
    async def spec() -> None:
        async with broker(tmp_path) as b:
            p = await b.connected()
            await turns(lambda: not p.protocol._out)
            sent = len(p.transport.writes())
            p.protocol.write_now(b"A")
            assert p.transport.writes()[sent:] == [b"A"]
            p.protocol.write(b"B")
            p.protocol.write_now(b"C")
            assert p.transport.writes()[sent:] == [b"A"]  # C waits behind B
            await turns(lambda: len(p.transport.writes()) > sent + 1)
            assert b"".join(p.transport.writes()[sent:]) == b"ABC"
            assert p.protocol.bytes_out == sum(map(len, p.transport.writes()))

    asyncio.run(spec())
