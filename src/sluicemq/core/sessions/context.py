"""What every frame handler sees of a session: its state, its frame loop and its replies.

Why apart from ``session.py``: the handlers (``connect``, ``send``, ``subscribe``, ``acks``,
``transactions``) work on this state, and ``Session`` picks the handler for each frame; with
the state here neither side has to import the other. The messages a session's consumers are
sent go out through ``delivery.Delivering``, which the context is.

Sans-IO: the transport feeds parsed frames and supplies an ``Outbound`` that buffers bytes
and can close; nothing here touches a socket or a clock of its own.
"""

from __future__ import annotations

import itertools
import logging
import os
from collections import deque
from collections.abc import Callable
from typing import Protocol

from sluicemq.config import Policy
from sluicemq.core.paging.flow import parse_size
from sluicemq.core.routing import keys
from sluicemq.core.routing.destinations import owner_of
from sluicemq.core.routing.names import destination_of
from sluicemq.core.routing.queue import Consumer
from sluicemq.core.routing.temporary import is_temporary
from sluicemq.core.security.policy import User
from sluicemq.core.sessions.delivery import Delivering
from sluicemq.core.sessions.peer import Outbound
from sluicemq.core.sessions.services import Services
from sluicemq.core.streams.chunks import STREAM_ID
from sluicemq.errors import ProtocolError
from sluicemq.protocol.codec import FrameParser, encode_frame
from sluicemq.protocol.frames import Frame
from sluicemq.protocol.headers import escape
from sluicemq.storage.txspool import TxSpool

log = logging.getLogger("sluicemq.session")

MAX_HELD_FRAMES = 100  # frames pipelined behind a CONNECT whose login is still being checked
MAX_HELD_BYTES = 16 << 20
FRAMES_PER_TURN = 128  # frames of one connection handled per loop turn; the rest wait a turn
_session_ids = itertools.count(1)
_BOOT = os.urandom(4).hex()


class Closable(Protocol):
    def close(self) -> None: ...


class SessionContext(Delivering):
    """State of one connection: version, subscriptions, open transactions, held frames."""

    def __init__(self, services: Services, out: Outbound, peer: str = "?") -> None:
        broker = self.broker = services.broker
        self.out = out
        self.peer = peer
        self.id = f"{_BOOT}-{next(_session_ids)}"
        self.version = "1.0"
        self.connected = False
        self.closed = False
        self.client_id: str | None = None
        self.login: str | None = None
        self.user: User | None = None  # None: anonymous (or security off)
        # the login as stored messages name their sender (records.encode_owner); b"": anonymous
        self.store_owner = b""
        self.cert_user: str | None = None  # CN of a verified TLS client certificate
        self.security = services.security
        self.ranges = services.ranges
        self.scheduler = services.scheduler
        self.held: list[Frame] | None = None  # set while a login is being verified
        self._waiting: deque[Frame] | None = None  # a SEND waiting for room, and what follows
        self.heartbeat = (0, 0)  # (we send every ms, we expect every ms)
        self.consumers: dict[str, Consumer] = {}
        self.by_index: dict[int, Consumer] = {}
        self.fanins: dict[str, Closable] = {}  # SUBSCRIBEs to several destinations (fanin.py)
        self.indexes = itertools.count(1)
        self.transactions: dict[str, TxSpool] = {}
        limits = broker.config.limits
        self.tx_limit = parse_size(limits.max_transaction_bytes)
        # a transport that reads into buffers gets large bodies read into their own bytes
        bodies = services.inputs.body if getattr(out, "reads_bodies", False) else None
        # a transport that can send a frame at once gets the receipts of in-place commits
        # that way (a lone synchronous producer's receipt skips a loop iteration)
        self._write_now: Callable[[bytes], None] | None = getattr(out, "write_now", None)
        self._start_delivery(out, broker.later)
        self.parser = FrameParser(max_frame_bytes=limits.max_frame_bytes,
                                  max_headers=limits.max_headers,
                                  max_header_line=limits.max_header_line,
                                  max_header_bytes=limits.max_header_bytes, version="1.0",
                                  body_buffers=bodies)
        self.on_version: Callable[[str], None] = lambda v: None
        self.received = 0
        # send.remember: plain queues (name, destination, policy)
        self.send_targets: dict[str, tuple[str, str, Policy]] = {}
        self.turns = broker.turns
        # recent loop seconds of input, shared by the connections of one client address
        self.use = self.turns.use_of(peer.rpartition(":")[0] or peer)
        self._unparsed: list[bytes] | None = None  # input waiting for a turn, not yet parsed
        self._more = False  # the parser may hold complete frames not parsed yet

    # -- replies to a consumer (``Delivering`` writes its messages) ---------------------------
    def stream_error(self, stream_id: str, text: str) -> None:
        """Tell a stream's consumer that the stream cannot complete; the connection stays."""
        self.out.write(encode_frame(Frame("ERROR", {
            "message": header_safe(text), STREAM_ID: stream_id,
            "content-type": "text/plain"}, text.encode()), self.version))

    # -- frames in ---------------------------------------------------------------------------
    def feed(self, data: bytes) -> None:
        """Bytes from any transport: parse and handle every complete frame, in order - in
        this loop turn while its input budget lasts (``core/limits/turns.py``), the rest with
        reading paused until this connection's next turn."""
        if self.closed:
            return
        if self._unparsed is not None:  # waiting for a turn: read before the pause took effect
            self._unparsed.append(data)
            return
        self._pump(data)

    def body_room(self) -> memoryview | None:
        """Where the transport may read the next input to (``FrameParser.body_room``): only
        while nothing read earlier waits unparsed, which would come first."""
        if self._unparsed is not None or self.closed:
            return None
        return self.parser.body_room()

    def body_filled(self, nbytes: int) -> None:
        self.parser.filled(nbytes)

    def _pump(self, data: bytes) -> None:
        """Parse ``data`` (and what the parser still holds) ``FRAMES_PER_TURN`` frames at a
        time and handle them while the turn's budget lasts. Why not all at once: a 256 KiB
        read holds ~5,000 small frames, ~25 ms of parsing alone."""
        turns = self.turns
        while True:
            if turns.allowance(self.use) <= 0:
                self._unparsed = [data] if data else []
                self._pause_reading()
                turns.wait(self.use, self._resume_input)
                return
            started = turns.clock()
            try:
                frames = self.parser.feed(data, max_frames=FRAMES_PER_TURN)
            except ProtocolError as exc:
                self.error(str(exc), fatal=True)
                return
            finally:
                turns.charge(self.use, started)
            data = b""
            if frames:
                self._run(deque(frames))
            if len(frames) < FRAMES_PER_TURN or self.closed:
                return  # the parser holds no complete frame
            if self._waiting is not None:  # those frames wait: parse on once they ran
                self._more = True
                return

    def _resume_input(self) -> None:
        data, self._unparsed = self._unparsed, None
        if self.closed or data is None:
            return
        if self._waiting is None:  # else frames wait for room: reading stays paused
            self._resume_reading()
        self._pump(b"".join(data))

    def _run(self, frames: deque[Frame]) -> None:
        """Handle ``frames`` in order while this turn's input budget lasts (at most
        ``FRAMES_PER_TURN``); the rest wait, reading paused, for this connection's next turn:
        one connection pipelining thousands of frames must not hold the event loop while
        other clients wait."""
        turns = self.turns
        started = turns.clock()
        deadline = started + turns.allowance(self.use)
        turns.owed = 0.0  # what these frames' fan-out will cost (Turns.fan_out)
        try:
            for _ in range(FRAMES_PER_TURN):
                if not frames or self.closed:
                    break
                if self._waiting is not None:  # a SEND waits for room: the rest waits behind
                    self._waiting.extend(frames)
                    return
                if turns.clock() + turns.owed >= deadline:
                    break
                frame = frames.popleft()
                if self.held is not None:  # a login is being checked: ``handle`` holds it
                    self.handle(frame)
                    continue
                try:  # ``handle`` and ``guarded``, written out: once per frame
                    self.dispatch(frame)
                except ProtocolError as exc:
                    self.error(str(exc), frame, fatal=exc.fatal)
                except Exception:
                    log.exception("internal error handling %s from %s", frame.command, self.peer)
                    self.error("internal broker error", frame, fatal=True)
        finally:
            turns.charge(self.use, started)
        if self.closed:
            return
        if not frames:
            if self._more and self._waiting is None:  # the parser holds more: parse on
                self._more = False
                self._pump(b"")
            return
        if self._waiting is not None:
            self._waiting.extend(frames)
            return
        self._waiting = frames
        self._pause_reading()
        turns.wait(self.use, lambda: self._next_turn(frames))

    def _pause_reading(self) -> None:
        pause = getattr(self.out, "pause_reading", None)
        if pause is not None:
            pause()

    def _resume_reading(self) -> None:
        resume = getattr(self.out, "resume_reading", None)
        if resume is not None:
            resume()

    def _next_turn(self, frames: deque[Frame]) -> None:
        if self._waiting is not frames or self.closed:
            return  # a wait for room took over these frames
        self._waiting = None
        self._resume_reading()
        self._run(frames)

    def handle(self, frame: Frame) -> None:
        """Process one frame; errors become ERROR frames, never exceptions to the transport."""
        if self.closed:
            return
        if self.held is not None:
            held_bytes = sum(len(f.body) for f in self.held) + len(frame.body)
            if len(self.held) >= MAX_HELD_FRAMES or held_bytes > MAX_HELD_BYTES:
                self.error("too many frames before the login was checked", frame, fatal=True)
                return
            self.held.append(frame)
            return
        if self._waiting is not None:  # reading is paused: only what was already parsed
            self._waiting.append(frame)
            return
        self.guarded(self.dispatch, frame)

    def dispatch(self, frame: Frame) -> None:
        """Hand ``frame`` to its handler (``Session`` knows the handlers)."""
        raise NotImplementedError

    def guarded(self, step: Callable[[Frame], None], frame: Frame) -> None:
        try:
            step(frame)
        except ProtocolError as exc:
            self.error(str(exc), frame, fatal=exc.fatal)
        except Exception:
            log.exception("internal error handling %s from %s", frame.command, self.peer)
            self.error("internal broker error", frame, fatal=True)

    # -- waiting: later frames queue behind one that cannot run yet --------------------------
    def wait_behind(self, frame: Frame) -> None:
        """Stop reading this connection: ``frame`` runs again on ``resume_waiting`` and the
        frames after it wait behind it, in order; other connections carry on."""
        self._waiting = deque([frame])
        self._pause_reading()

    def resume_waiting(self) -> None:
        """Run the waiting frame and what followed it (there is room, or it is durable)."""
        waiting, self._waiting = self._waiting, None
        if self.closed or waiting is None:
            return
        self._resume_reading()
        self._run(waiting)

    def when_durable_retry(self, frame: Frame) -> None:
        """Handle ``frame`` again once everything stored so far is durable; the frames after
        it wait behind it, in order, as behind a SEND that waits for room."""
        self.wait_behind(frame)
        self.broker.when_durable(lambda exc: self.resume_waiting())

    def tx(self, txid: str) -> TxSpool:
        """The open transaction ``txid`` (ERROR, not fatal, if there is none)."""
        spool = self.transactions.get(txid)
        if spool is None:
            raise ProtocolError(f"unknown transaction {txid!r}", fatal=False)
        return spool

    # -- replies -----------------------------------------------------------------------------
    def error(self, message: str, frame: Frame | None = None, *, fatal: bool = True,
              detail: str = "", extra: dict[str, str] | None = None) -> None:
        headers = {"message": header_safe(message), "content-type": "text/plain"}
        if extra:
            headers.update(extra)
        if frame is not None and "receipt" in frame.headers:
            headers["receipt-id"] = frame.headers["receipt"]
        body = (detail or message).encode()
        log.info("ERROR to %s: %s", self.peer, message)
        self.out.write(encode_frame(Frame("ERROR", headers, body), self.version))
        if fatal:
            self.close()

    def receipt(self, frame: Frame, extra: dict[str, str] | None = None) -> None:
        """Answer a `receipt` header once everything this frame stored is durable."""
        receipt_id = frame.headers.get("receipt")
        if receipt_id is None:
            return

        def done(exc: BaseException | None) -> None:
            if self.closed:
                return
            if exc is None and not extra:  # the usual one, written directly (as encode_frame)
                data = (b"RECEIPT\nreceipt-id:%s\n\n\x00"
                        % escape(receipt_id, self.version).encode())
                if self._write_now is not None and self.broker.store.in_place:
                    self._write_now(data)
                else:
                    self.out.write(data)
            elif exc is None:
                headers = {"receipt-id": receipt_id, **(extra or {})}
                self.out.write(encode_frame(Frame("RECEIPT", headers), self.version))
            else:  # (not the frame: its body may be a view of a kept input buffer)
                self.error(f"not stored: {exc}", fatal=False, extra={"receipt-id": receipt_id})

        self.broker.when_durable(done, self)  # (the messages this connection deferred)

    # -- rights and names --------------------------------------------------------------------
    def authorize(self, action: str, kind: str, name: str) -> None:
        if not self.security.authorize(self.user, action, f"/{kind}/{name}"):
            who = self.user.name if self.user else "anonymous"
            log.warning("refused %s on /%s/%s to %s from %s", action, kind, name, who, self.peer)
            raise ProtocolError(f"user {who!r} is not authorized to {action} /{kind}/{name}",
                                fatal=False)

    def owner(self) -> str | None:
        """Whose streams, batches and client ids these are (None: security is off)."""
        return self.security.owner(self.user)

    def admit_destination(self, kind: str, name: str) -> None:
        """A destination this frame would create must fit the destination caps."""
        destinations = self.broker.destinations
        if not destinations.exists(kind, name):  # per SEND: the owner only when it is new
            destinations.admit(kind, name,
                               owner_of(self.user.name if self.user else None, self.peer))

    def resolve_temporary(self, frame: Frame) -> None:
        """``/temp-queue/NAME`` and friends become this connection's own destinations, and a
        ``reply-to`` naming one becomes the address other connections can send to."""
        h = frame.headers
        destination = h.get("destination", "")
        if is_temporary(destination):
            kind, name, _mine = self.broker.temps.resolve(destination, self.id)
            h["destination"] = destination_of(kind, name)
        reply_to = h.get("reply-to", "")
        if reply_to.startswith(("/temp-queue/", "/temp-topic/")):
            h["reply-to"] = self.broker.temps.remote_address(reply_to, self.id)

    # -- the end -----------------------------------------------------------------------------
    def close(self) -> None:
        """Close after pending output; the session's resources are given back right away."""
        if not self.closed:
            self.closed = True
            self.out.close()
        self._release()

    def connection_lost(self) -> None:
        self.closed = True
        self._release()
        if self.connected:
            self.broker.advisories.connection("removed", self.id, self.peer,
                                              self.user.name if self.user else None)

    def _release(self) -> None:
        """Give back everything the connection held: in-flight messages, groups, transactions."""
        for fanin in list(self.fanins.values()):
            fanin.close()
        self.fanins.clear()
        for consumer in list(self.consumers.values()):
            self.drop_consumer(consumer)
        self.consumers.clear()
        self.by_index.clear()
        for spool in self.transactions.values():
            spool.close()
        self.transactions.clear()
        self.broker.consumer_waits.cancel(self)
        self.broker.advisories.connection_ended(self.id)
        for kind, name in self.broker.temps.release(self.id):
            self.broker.subscriptions.drop_temporary(kind, name)
        if self.client_id:
            lock = (self.owner(), self.client_id)
            if self.broker.client_ids.get(lock) is self:
                del self.broker.client_ids[lock]

    def drop_consumer(self, consumer: Consumer) -> None:
        queue = consumer.queue
        queue.remove_consumer(consumer)
        kind, _, name = consumer.destination[1:].partition("/")
        self.broker.advisories.consumer("removed", kind, name, self.id, consumer.sub_id)
        if keys.is_session(queue.key):
            self.broker.subscriptions.drop_topic_subscription(
                queue.destination.split("/", 2)[2], queue.key)
            queue.discard()  # else its backlog stayed counted against memory_limit for good


def header_safe(text: str) -> str:
    """One printable line with no backslash: readable in any version, even before CONNECT."""
    return "".join(ch if ch.isprintable() and ch != "\\" else "?" for ch in text)[:1000]
