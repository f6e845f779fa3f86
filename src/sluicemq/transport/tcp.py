"""STOMP over TCP: the asyncio protocol that joins a socket to a codec and a session.

Writes are gathered per loop turn and handed to the transport with one ``writelines`` (one
syscall for many frames). When the kernel buffer backs up, the session reports itself not
writable, so dispatch stops handing it messages instead of growing memory. How much may back
up is the connection's share of ``output_buffer_bytes`` (``Admission.output_share``), checked
at each write to the socket: it shrinks as connections arrive. What the transport holds after
each write is charged to the broker's memory account (``MemoryAccount.charge``): output backed
up for slow peers counts against ``memory_limit`` as queued messages do. The kernel's send
buffer is held to the same share (``SO_SNDBUF``): left to autotune, it grew to 4 MiB for a
peer that reads nothing, so 200 stuck subscribers cost ~800 MiB of kernel memory, and the loop
the time to copy frames into it, before dispatch to them stopped.

Closing is careful: after a fatal ERROR (a frame refused for its size, say) the client may
still be sending. Closing outright would make the kernel answer its data with a reset, and
most clients would then fail in ``send`` and never read the ERROR that says why. So the
broker sends what it wrote, shuts down its writing side, and keeps reading (and discarding)
until the client closes too or ``LINGER_SECONDS`` have passed.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import socket
import struct
import sys
import termios
import time
from typing import TYPE_CHECKING, cast

from sluicemq.core.limits.admission import connect_timeout_message
from sluicemq.core.sessions.session import Session
from sluicemq.protocol.codec import encode_frame
from sluicemq.protocol.frames import Frame
from sluicemq.tls import peer_common_name
from sluicemq.transport.keepalive import Keepalive

if TYPE_CHECKING:
    from sluicemq.core.sessions.services import Services

log = logging.getLogger("sluicemq.tcp")

_INT0 = bytes(4)  # the ioctl's int argument
# struct tcp_info (linux/tcp.h): its size and where tcpi_bytes_acked is (Linux 4.2+)
_TCP_INFO_BYTES, _BYTES_ACKED_AT = 232, 120
LINGER_SECONDS = 5.0  # input discarded after a close, before the socket is dropped for good
# What an open TCP connection holds of its own, charged to the memory account while it is
# admitted (``MemoryAccount.open``), as a WebSocket's is: 10,000 of them (max_connections) are
# ~60 MiB that the connection caps alone would leave outside memory_limit. Measured by
# bench/connection_cost.py: 3,000 connections, each CONNECTed with one subscription, +6.1 KiB
# each on a fresh broker (+4.4 KiB in arenas an earlier storm left; idle sockets 2.8 KiB).
CONNECTION_BYTES = 6 << 10


class StompProtocol(asyncio.BufferedProtocol):
    """One connection. All methods run on the event-loop thread.

    It reads into buffers (``BufferedProtocol``): the rest of a large SEND body straight into
    the buffer its frame is gathered in (``SessionContext.body_room``), anything else into the
    loop's scratch buffer, copied out at once as the loop's own transports do
    (``InputBuffers``)."""

    reads_bodies = True  # SessionContext: gather large bodies in kept buffers

    # The transport keeps what it is given by reference until its socket takes it, so a
    # message body from this size goes out apart from its head (``SessionContext.deliver``):
    # peers that stop reading then hold one shared body, not a frame-sized copy each. Below
    # it, one joined write per frame is cheaper than the copy it saves.
    share_bodies_from = 4096

    def __init__(self, services: Services, connections: set[StompProtocol]) -> None:
        self.services = services
        self.broker = services.broker
        self._memory = services.broker.memory
        self.connections = connections
        self.transport: asyncio.Transport | None = None
        self.session: Session | None = None
        self._scratch = services.inputs.scratch
        self._into_body = False  # the last get_buffer handed out a body's room
        self.writable = True
        self._out: list[bytes | memoryview] = []
        self.bytes_out = 0  # every byte ever written (see bytes_acked)
        self._flush_scheduled = False
        self._closing = False
        self._loop = asyncio.get_running_loop()
        self.last_received = time.monotonic()
        self.last_sent = time.monotonic()
        self._keepalive: Keepalive | None = None
        self._reading_paused = False  # producer flow control: its destination is full
        self._slow_handle: asyncio.TimerHandle | None = None
        self._backlog_at_pause = 0
        self._address: str | None = None  # set once admitted (counted against the caps)
        self._deadline: asyncio.TimerHandle | None = None  # CONNECT timeout, then linger
        self._share = 0  # the write high-water mark last given to the transport
        self._pending = 0  # bytes in _out
        self._paused = False  # the transport's buffer is over the share (pause_writing)
        self._held = False  # not writable until the flush: _out alone reached the share
        self._tls = False  # bytes_written cannot tell (sessions/unwritten.py keeps nothing)

    # -- asyncio.Protocol --------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports have asyncio.Transport's methods without subclassing it
        self.transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        name = f"{peer[0]}:{peer[1]}" if peer else "?"
        address = str(peer[0]) if peer else "?"
        refused = self.broker.admission.admit(address)
        if refused is None:
            refused = self._memory.open(CONNECTION_BYTES, "TCP connection")
            if refused is not None:
                self.broker.admission.release(address)
        if refused is not None:  # before any session exists: a refusal costs next to nothing
            log.warning("refusing %s: %s", name, refused)
            self.write(encode_frame(Frame("ERROR", {"message": refused,
                                                    "content-type": "text/plain"},
                                          refused.encode()), "1.0"))
            self.close()
            return
        turns = self.broker.turns
        started = turns.clock()
        self.session = Session(self.services, self, name)
        turns.charge(self.session.use, started)  # a storm of connections is its address's input
        self.session.on_version = self._negotiated
        ssl_object = transport.get_extra_info("ssl_object")
        if ssl_object is not None:
            self.session.cert_user = peer_common_name(ssl_object.getpeercert())
            self._tls = True
        self._address = address
        self.connections.add(self)
        self._limit_output()
        timeout = self.broker.config.limits.connect_timeout
        if timeout > 0:
            self._deadline = self._loop.call_later(timeout, self._connect_timed_out)

    def _connect_timed_out(self) -> None:
        """No complete CONNECT in time (silent, or a byte a second): refuse and close."""
        self._deadline = None
        session = self.session
        if session is not None and not session.connected and not session.closed:
            seconds = self.broker.config.limits.connect_timeout
            log.warning("closing %s: %s", session.peer, connect_timeout_message(seconds))
            session.error(connect_timeout_message(seconds), fatal=True)

    def get_buffer(self, sizehint: int) -> memoryview:
        room = self.session.body_room() if self.session is not None else None
        self._into_body = room is not None
        return self._scratch if room is None else room

    def buffer_updated(self, nbytes: int) -> None:
        if not self._into_body:
            self.data_received(self._scratch[:nbytes].tobytes())
            return
        self.last_received = time.monotonic()
        if self.session is not None:
            self.session.body_filled(nbytes)

    def data_received(self, data: bytes) -> None:
        self.last_received = time.monotonic()
        if self.session is not None:
            self.session.feed(data)

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.connections.discard(self)
        self._memory.charge(self, 0)
        if self._address is not None:
            self.broker.admission.release(self._address)
            self._memory.close(CONNECTION_BYTES)
            self._address = None
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        if self._keepalive is not None:
            self._keepalive.cancel()
        if self._slow_handle is not None:
            self._slow_handle.cancel()
        if self.session is not None:
            turns = self.broker.turns
            started = turns.clock()
            if self.session.unwritten:
                self._give_back(self._written_at_end())
            self.session.connection_lost()
            turns.charge(self.session.use, started)
            self.session = None  # it refers back to us: freed by refcount, not the cyclic GC
        self.transport = None

    def pause_writing(self) -> None:
        self.writable = False
        self._paused = True
        seconds = self.broker.config.limits.slow_reader_seconds
        if seconds > 0 and self._slow_handle is None and self.transport is not None:
            self._backlog_at_pause = self.transport.get_write_buffer_size()
            self._slow_handle = self._loop.call_later(seconds, self._check_slow_reader)

    def _check_slow_reader(self) -> None:
        """Output has stayed above the high-water mark: drop a peer that drained nothing.

        Its unacknowledged messages go back to their queues (connection_lost releases them),
        so one stuck consumer cannot hold messages or broker memory hostage.
        """
        self._slow_handle = None
        if self.transport is None or self.writable:
            return
        backlog = self.transport.get_write_buffer_size()
        if backlog < self._backlog_at_pause:
            self.pause_writing()  # it is draining, slowly: keep watching
            return
        log.warning("slow reader %s: %d bytes unread for %.1fs, disconnecting",
                    self.session.peer if self.session else "?", backlog,
                    self.broker.config.limits.slow_reader_seconds)
        self.transport.abort()

    def resume_writing(self) -> None:
        self.writable = True
        self._paused = False
        self._memory.charge(self, self.buffered)
        if self.session is not None and self.session.unwritten:
            self.session.unwritten.written(self.bytes_written())
        if self._slow_handle is not None:
            self._slow_handle.cancel()
            self._slow_handle = None
        if self.session is not None:
            self.session.output_ready()

    # -- Outbound (used by the session) ------------------------------------------------------
    def pause_reading(self) -> None:
        """Flow control: stop reading this peer (TCP backpressure slows it) until resumed."""
        if self.transport is not None and not self._reading_paused:
            self._reading_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and self._reading_paused:
            self._reading_paused = False
            self.last_received = time.monotonic()  # its heart-beats were not being read
            self.transport.resume_reading()

    def write(self, data: bytes | memoryview) -> None:
        if self.transport is None:
            return
        self._out.append(data)
        self._added(len(data))

    def write_frames(self, frames: list[bytes], nbytes: int) -> None:
        """``write`` of several frames, ``nbytes`` together (a consumer's run of MESSAGEs,
        ``SessionContext.deliver_run``, which stops at ``room``)."""
        if self.transport is None:
            return
        self._out += frames
        self._added(nbytes)

    def room(self) -> int:
        """Bytes this connection may still be given before it stops being writable."""
        return self._share - self._pending if self.writable else 0

    def _added(self, nbytes: int) -> None:
        self.bytes_out += nbytes
        self._pending += nbytes
        if self._pending >= self._share and self.writable:
            # one loop turn may write many frames before the flush: stop dispatch here
            self.writable, self._held = False, True
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def write_now(self, data: bytes) -> None:
        """``write``, but sent at once when nothing written earlier still waits for the flush
        (order kept): a receipt answered by an in-place commit is the last thing its loop turn
        does, and the flush would otherwise cost one more loop iteration (an epoll round)
        before a lone synchronous producer has its receipt."""
        if self._out or self.transport is None or self._closing:
            self.write(data)
            return
        self.bytes_out += len(data)
        self.transport.write(data)
        self._sent()

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self.transport is None or not self._out:
            return
        out, self._out, self._pending = self._out, [], 0
        self._limit_output()
        self.transport.writelines(out)
        self._sent()
        if self._held:
            self._held = False
            if not self._paused and not self._closing and self.session is not None:
                self.writable = True  # the socket took it below the share
                self.session.output_ready()
        if self._closing:
            self._shut_down()

    def _sent(self) -> None:
        """After handing output to the transport: charge what its buffer now holds to the
        memory budget, and note the time (heart-beats count from it)."""
        transport = self.transport
        if transport is not None:  # (a write that failed may have ended it)
            size = transport.get_write_buffer_size()
            self._memory.charge(self, size)
            session = self.session
            if session is not None and session.unwritten:
                if self._tls:
                    session.unwritten.written(-1)  # it cannot tell: nothing is kept
                elif not transport.is_closing():  # (else its buffer may be dropped already)
                    session.unwritten.written(self.bytes_out - self._pending - size)
        self.last_sent = time.monotonic()

    def _limit_output(self) -> None:
        """Follow this connection's share of the output budget (it pauses writing, and so
        dispatch to it, once that much is waiting for its socket)."""
        share = self.broker.admission.output_share()
        if share != self._share and self.transport is not None:
            self._share = share
            self.transport.set_write_buffer_limits(share, share // 4)
            sock = self.transport.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):  # the kernel doubles it: ``share`` in all
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, share // 2)

    @property
    def buffered(self) -> int:
        """Bytes written to this peer that its socket has not taken yet."""
        return self._pending + (self.transport.get_write_buffer_size() if self.transport else 0)

    def close(self) -> None:
        """Close after what was already written (an ERROR or RECEIPT) has gone out."""
        if self.transport is None or self._closing:
            return
        self._closing = True
        if self._out:
            if not self._flush_scheduled:
                self._flush_scheduled = True
                self._loop.call_soon(self._flush)
        else:
            self._shut_down()

    def _shut_down(self) -> None:
        """Half-close, then discard input until the peer closes or the linger time is up."""
        transport = self.transport
        if transport is None:
            return
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        if not transport.can_write_eof():  # TLS: no half-close
            transport.close()
            return
        self.resume_reading()
        transport.write_eof()
        self._deadline = self._loop.call_later(LINGER_SECONDS, self._linger_over)

    def stop(self) -> None:
        """The broker stops: ack:auto messages whose frames are still in our buffers go back
        to their queues, and those frames are dropped (``abort``) so that none arrives after
        it was given back; else what was written goes out first (``close``)."""
        transport = self.transport
        if transport is None:
            return
        session = self.session
        if session is not None and session.unwritten and self._give_back(self.bytes_written()):
            transport.abort()
        else:
            transport.close()

    def _give_back(self, written: int) -> int:
        assert self.session is not None
        count = self.session.unwritten.give_back(written)
        if count:
            log.info("%s ended with %d ack:auto messages still in the broker's buffers: back "
                     "to their queues", self.session.peer, count)
        return count

    def _linger_over(self) -> None:
        self._deadline = None
        if self.transport is not None:
            self.transport.abort()

    # -- heart-beating -----------------------------------------------------------------------
    def _negotiated(self, version: str) -> None:
        assert self.session is not None
        send_ms, expect_ms = self.session.heartbeat
        if send_ms or expect_ms:
            self._keepalive = Keepalive(self, send_ms, expect_ms)

    def bytes_written(self) -> int:
        """How many of the bytes ever written to this connection (``bytes_out``) have left
        user space: what neither ``_out`` nor the transport's buffer still holds. The kernel
        sends those even after a kill -9 of the broker (its socket then closes after them),
        so a stored message's removal for an ack:auto consumer is journaled once they reach
        the message's end (``StoreLater.remove_when_written``). -1 when that cannot be known
        (TLS keeps buffers of its own; a closed connection)."""
        transport = self.transport
        if transport is None or transport.get_extra_info("ssl_object") is not None:
            return -1
        if transport.is_closing():  # its buffer may be dropped already (a reset, an abort)
            return self._written_at_end()
        return self.bytes_out - self._pending - transport.get_write_buffer_size()

    def _written_at_end(self) -> int:
        """``bytes_written`` as the connection ended, when the transport has already dropped
        its buffer (a reset, an abort): what the kernel took, read from its counters - what
        the peer's TCP acknowledged (``tcpi_bytes_acked``) plus what the kernel still queues
        (SIOCOUTQ). -1 when that cannot be known (TLS, no socket, an older kernel)."""
        transport = self.transport
        if transport is None or transport.get_extra_info("ssl_object") is not None:
            return -1
        sock = transport.get_extra_info("socket")
        try:
            info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_BYTES)
            queued = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, _INT0)
        except (OSError, AttributeError, ValueError):
            return -1
        if len(info) < _BYTES_ACKED_AT + 8:
            return -1
        taken = struct.unpack_from("=Q", info, _BYTES_ACKED_AT)[0]
        taken += int.from_bytes(queued, sys.byteorder)
        return min(taken, self.bytes_out - self._pending)

    def bytes_acked(self) -> int:
        """How many of the bytes ever written to this connection (``bytes_out``) its peer's
        TCP has acknowledged: what is neither in our buffers nor in the kernel's send queue
        (SIOCOUTQ). Bytes counted here survive a kill -9 or a reset of the broker, so a
        message deferred for an ack:auto consumer is settled once they reach its end. -1
        when that cannot be known (TLS keeps buffers of its own; a closed connection)."""
        written = self.bytes_written()
        if written < 0 or self.transport is None:
            return -1
        sock = self.transport.get_extra_info("socket")
        try:
            queued = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, _INT0)
        except (OSError, AttributeError, ValueError):
            return -1
        return written - int.from_bytes(queued, sys.byteorder)

    @property
    def gone(self) -> bool:
        return self.transport is None

    @property
    def reading_paused(self) -> bool:
        return self._reading_paused

    def send_heartbeat(self) -> None:
        if self._out:  # behind the frames waiting for the flush, as every byte is counted
            self.write(b"\n")
        elif self.transport is not None:
            self.bytes_out += 1  # counted: bytes_written and bytes_acked compare with it
            self.transport.write(b"\n")
