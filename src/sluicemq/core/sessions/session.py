"""One client connection's STOMP conversation: frames in, broker calls and frames out.

Sans-IO: the transport feeds parsed frames to ``handle`` and supplies an ``Outbound`` that
buffers bytes and can close; nothing here touches a socket or a clock of its own.

Errors: framing and protocol violations (frames before CONNECT, unknown commands, missing
required headers) are fatal — ERROR, then close, as the STOMP spec says. Semantic errors that
concern one operation (an unknown ack id, an invalid destination, a bad selector, an unknown
transaction) get an ERROR but keep the connection, as ActiveMQ does, so one bad request does
not tear down a producer's other work.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
from collections import deque
from collections.abc import Callable
from pathlib import Path

from sluicemq import __version__
from sluicemq.core.dedup import producers as dedup
from sluicemq.core.limits import txlimits
from sluicemq.core.paging.flow import Pacing, parse_size
from sluicemq.core.routing.destinations import owner_of
from sluicemq.core.routing.message import (
    TRANSPORT_HEADERS,
    Message,
    parse_expires,
    parse_priority,
)
from sluicemq.core.routing.names import (
    QUEUE,
    TOPIC,
    destination_of,
    parse_composite,
    parse_destination,
    parse_subscription,
)
from sluicemq.core.routing.queue import ACK_MODES, AUTO, CLIENT, Consumer, Queue
from sluicemq.core.routing.temporary import PREFIX as TEMP_PREFIX
from sluicemq.core.routing.temporary import is_temporary
from sluicemq.core.scheduling import scheduler as scheduled
from sluicemq.core.security.policy import READ, WRITE, User
from sluicemq.core.selectors import SelectorError, compile_selector
from sluicemq.core.sessions.peer import Outbound
from sluicemq.core.sessions.services import Services
from sluicemq.core.sessions.spool import TxSpool
from sluicemq.core.staging import frames as stage_frames
from sluicemq.core.staging.book import STAGE_ABORT, STAGE_COMMIT
from sluicemq.core.streams.chunks import (
    DUPLICATE,
    GROUP,
    MAX_STREAMS,
    NEXT_SEQ,
    QUERY,
    RESUMED,
    STREAM_ID,
    WAIT_CONSUMER,
    ChunkError,
    parse_chunk,
)
from sluicemq.errors import ProtocolError
from sluicemq.protocol.codec import FrameParser, encode_frame, encode_head
from sluicemq.protocol.frames import CLIENT_COMMANDS, Frame
from sluicemq.protocol.heartbeat import negotiate, parse_heart_beat
from sluicemq.storage import records

log = logging.getLogger("sluicemq.session")

SUPPORTED_VERSIONS = ("1.0", "1.1", "1.2")
OP_SEND, OP_ACK = 1, 2
MAX_HELD_FRAMES = 100  # frames pipelined behind a CONNECT whose login is still being checked
MAX_HELD_BYTES = 16 << 20
FRAMES_PER_TURN = 128  # frames of one connection handled per loop turn; the rest wait a turn
_session_ids = itertools.count(1)
_composite_ids = itertools.count(1)
_BOOT = os.urandom(4).hex()


class Session:
    """State of one connection: version, subscriptions, open transactions."""

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
        self.cert_user: str | None = None  # CN of a verified TLS client certificate
        self.security = services.security
        self.ranges = services.ranges
        self.scheduler = services.scheduler
        self._held: list[Frame] | None = None  # set while a login is being verified
        self._waiting: deque[Frame] | None = None  # a SEND waiting for room, and what follows
        self.heartbeat = (0, 0)  # (we send every ms, we expect every ms)
        self.consumers: dict[str, Consumer] = {}
        self.by_index: dict[int, Consumer] = {}
        self._indexes = itertools.count(1)
        self.transactions: dict[str, TxSpool] = {}
        limits = broker.config.limits
        self._tx_limit = parse_size(limits.max_transaction_bytes)
        self.parser = FrameParser(max_frame_bytes=limits.max_frame_bytes,
                                  max_headers=limits.max_headers,
                                  max_header_line=limits.max_header_line, version="1.0")
        self.on_version: Callable[[str], None] = lambda v: None
        self.received = 0
        self.delivered = 0
        self._output_waiters: list[Callable[[], None]] = []

    # -- Delivery (called by dispatch) -------------------------------------------------------
    @property
    def writable(self) -> bool:
        return self.out.writable and not self.closed

    def deliver(self, consumer: Consumer, msg: Message) -> None:
        # What ActiveMQ puts on every MESSAGE (clients read priority, expiry and persistence
        # from here); the producer's own headers, stored with the message, come last.
        h = {"destination": msg.destination, "message-id": msg.message_id,
             "subscription": consumer.sub_id, "sluice-seq": str(msg.mid),
             "priority": str(msg.priority), "expires": str(msg.expires),
             "timestamp": str(msg.timestamp),
             "persistent": "true" if msg.persistent else "false"}
        if self.version == "1.2":
            h["ack"] = f"{consumer.index}-{msg.mid}"
        if msg.deliveries > 1:
            h["redelivered"] = "true"
            h["sluice-delivery-count"] = str(msg.deliveries)
        if consumer.resumed and msg.group in consumer.resumed:
            consumer.resumed.discard(msg.group)
            h[RESUMED] = "true"
        h.update(msg.headers)  # stored headers never use the keys above (filtered at SEND)
        self.delivered += 1
        body = msg.body if msg.body is not None else self.broker.body_of(msg)
        frame = Frame("MESSAGE", h, body)
        try:
            head = encode_head(frame, self.version)
        except ValueError:  # a header this (older) protocol version cannot carry
            frame.headers = {k: v for k, v in h.items() if _representable(k, v, self.version)}
            head = encode_head(frame, self.version)
        if msg.group is not None and STREAM_ID in msg.headers:
            self.broker.stream_delivered(msg)
        if len(body) < 65536:
            self.out.write(b"".join((head, body, b"\x00")))
        else:  # large bodies go out without another copy
            self.out.write(head)
            self.out.write(body)
            self.out.write(b"\x00")

    def when_writable(self, resume: Callable[[], None]) -> None:
        """Call ``resume`` once the transport has drained (paced writers: range reads)."""
        self._output_waiters.append(resume)

    def output_ready(self) -> None:
        """The transport drained below its low-water mark: feed consumers and writers again."""
        for consumer in self.consumers.values():
            self.broker.schedule_dispatch(consumer.queue)
        waiting, self._output_waiters = self._output_waiters, []
        for resume in waiting:
            resume()

    def stream_error(self, stream_id: str, text: str) -> None:
        """Tell a stream's consumer that the stream cannot complete; the connection stays."""
        self.out.write(encode_frame(Frame("ERROR", {
            "message": _header_safe(text), STREAM_ID: stream_id,
            "content-type": "text/plain"}, text.encode()), self.version))

    # -- frames in ---------------------------------------------------------------------------
    def feed(self, data: bytes) -> None:
        """Bytes from any transport: parse and handle every complete frame, in order."""
        if self.closed:
            return
        try:
            frames = self.parser.feed(data)
        except ProtocolError as exc:
            self.error(str(exc), fatal=True)
            return
        if frames:
            self._run(deque(frames))

    def _run(self, frames: deque[Frame]) -> None:
        """Handle ``frames`` in order, ``FRAMES_PER_TURN`` now and the rest on a later loop
        turn with reading paused: one connection pipelining thousands of frames must not hold
        the event loop while other clients wait."""
        for _ in range(FRAMES_PER_TURN):
            if not frames or self.closed:
                return
            if self._waiting is not None:  # a SEND waits for room: the rest waits behind it
                self._waiting.extend(frames)
                return
            self.handle(frames.popleft())
        if not frames or self.closed:
            return
        if self._waiting is not None:
            self._waiting.extend(frames)
            return
        self._waiting = frames
        pause = getattr(self.out, "pause_reading", None)
        if pause is not None:
            pause()
        self.broker.call_soon(lambda: self._next_turn(frames))

    def _next_turn(self, frames: deque[Frame]) -> None:
        if self._waiting is not frames or self.closed:
            return  # a wait for room took over these frames
        self._waiting = None
        resume = getattr(self.out, "resume_reading", None)
        if resume is not None:
            resume()
        self._run(frames)

    def handle(self, frame: Frame) -> None:
        """Process one frame; errors become ERROR frames, never exceptions to the transport."""
        if self.closed:
            return
        if self._held is not None:
            held_bytes = sum(len(f.body) for f in self._held) + len(frame.body)
            if len(self._held) >= MAX_HELD_FRAMES or held_bytes > MAX_HELD_BYTES:
                self.error("too many frames before the login was checked", frame, fatal=True)
                return
            self._held.append(frame)
            return
        if self._waiting is not None:  # reading is paused: only what was already parsed
            self._waiting.append(frame)
            return
        self._guarded(self._dispatch, frame)

    def _guarded(self, step: Callable[[Frame], None], frame: Frame) -> None:
        try:
            step(frame)
        except ProtocolError as exc:
            self.error(str(exc), frame, fatal=exc.fatal)
        except Exception:
            log.exception("internal error handling %s from %s", frame.command, self.peer)
            self.error("internal broker error", frame, fatal=True)

    def _dispatch(self, frame: Frame) -> None:
        command = frame.command
        if not self.connected:
            if command in ("CONNECT", "STOMP"):
                self._connect(frame)
                return
            raise ProtocolError(f"expected CONNECT or STOMP, got {command!r}")
        handler = _HANDLERS.get(command)
        if handler is None:
            if command in ("CONNECT", "STOMP"):
                raise ProtocolError("already connected")
            what = "a server frame" if command not in CLIENT_COMMANDS else "unsupported"
            raise ProtocolError(f"unknown command {command!r} ({what})")
        handler(self, frame)

    def error(self, message: str, frame: Frame | None = None, *, fatal: bool = True,
              detail: str = "", extra: dict[str, str] | None = None) -> None:
        headers = {"message": _header_safe(message), "content-type": "text/plain"}
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
            if exc is None:
                headers = {"receipt-id": receipt_id}
                if extra:
                    headers.update(extra)
                self.out.write(encode_frame(Frame("RECEIPT", headers), self.version))
            else:
                self.error(f"not stored: {exc}", frame, fatal=False)

        self.broker.when_durable(done)

    # -- connection --------------------------------------------------------------------------
    def _connect(self, frame: Frame) -> None:
        h = frame.headers
        accepted = h.get("accept-version")
        offered = [v.strip() for v in accepted.split(",")] if accepted else ["1.0"]
        common = [v for v in SUPPORTED_VERSIONS if v in offered]
        if not common:
            self.out.write(encode_frame(Frame(
                "ERROR", {"version": ",".join(SUPPORTED_VERSIONS), "content-type": "text/plain",
                          "message": "unsupported protocol version"},
                f"supported versions are {','.join(SUPPORTED_VERSIONS)}".encode()), "1.0"))
            self.close()
            return
        self.version = common[-1]
        client_hb = parse_heart_beat(h.get("heart-beat"))
        server_ms = self.broker.config.limits.heartbeat_ms
        self.heartbeat = negotiate(client_hb, (server_ms, server_ms))
        if self.security.enabled:
            self._held = []
            self.security.begin_login(h.get("login"), h.get("passcode"), self.peer,
                                      self.cert_user, lambda user, reason:
                                      self._logged_in(frame, user, reason))
            return
        self._accept(frame)

    def _logged_in(self, frame: Frame, user: User | None, reason: str) -> None:
        """The login check finished: accept or refuse, then run what was pipelined behind it."""
        held, self._held = self._held or [], None
        if self.closed:
            return
        if reason:
            self.error(reason, frame, fatal=True)
            return
        self.user = user
        self._guarded(self._accept, frame)
        for later in held:
            self.handle(later)

    def _accept(self, frame: Frame) -> None:
        h = frame.headers
        client_id = h.get("client-id")
        if client_id:
            # With security on a client id is the user's own: another user's connection of
            # the same id neither blocks nor is blocked (their durable subscriptions are
            # guarded by owner, see _claim_durable).
            lock = (self.security.owner(self.user), client_id)
            holder = self.broker.client_ids.get(lock)
            if holder is not None and holder is not self:
                raise ProtocolError(f"client-id {client_id!r} is already connected")
            self.broker.client_ids[lock] = self
            self.client_id = client_id
        self.login = h.get("login")
        self.connected = True
        self.broker.advisories.connection("added", self.id, self.peer,
                                          self.user.name if self.user else None)
        self.parser.version = self.version
        self.on_version(self.version)
        reply = {"version": self.version, "session": self.id,
                 "server": f"SluiceMQ/{__version__}",
                 "heart-beat": f"{self.heartbeat[0]},{self.heartbeat[1]}"}
        self.out.write(encode_frame(Frame("CONNECTED", reply), self.version))

    def _disconnect(self, frame: Frame) -> None:
        receipt_id = frame.headers.get("receipt")
        if receipt_id is None:
            self.close()
            return

        def done(exc: BaseException | None) -> None:
            if not self.closed:
                self.out.write(encode_frame(Frame("RECEIPT", {"receipt-id": receipt_id}),
                                            self.version))
                self.close()

        self.broker.when_durable(done)

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
        for consumer in list(self.consumers.values()):
            self._drop_consumer(consumer)
        self.consumers.clear()
        self.by_index.clear()
        for spool in self.transactions.values():
            spool.close()
        self.transactions.clear()
        self.broker.consumer_waits.cancel(self)
        for kind, name in self.broker.temps.release(self.id):
            self.broker.drop_temporary(kind, name)
        if self.client_id:
            lock = (self.security.owner(self.user), self.client_id)
            if self.broker.client_ids.get(lock) is self:
                del self.broker.client_ids[lock]

    # -- SEND --------------------------------------------------------------------------------
    def _temporary(self, frame: Frame) -> None:
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

    def _send(self, frame: Frame) -> None:
        h = frame.headers
        if h.get("destination", "").startswith(("/temp-", "/remote-temp-")) or "reply-to" in h:
            self._temporary(frame)
        if "," in h.get("destination", ""):
            self._send_composite(frame, parse_composite(h["destination"]))
            return
        kind, name = parse_destination(h.get("destination"))
        scheduled.refuse_direct(kind, name)
        if name.startswith(TEMP_PREFIX):  # kept in memory only, as ActiveMQ's temporaries
            self.broker.temps.check(kind, name, self.id, consuming=False)
            h.pop("persistent", None)
        if kind == TOPIC and (groups := self.broker.virtual_queues(name)):
            # a virtual topic: its consumer groups' queues get a copy each, atomically
            self._send_composite(frame, [(kind, name), *((QUEUE, g) for g in groups)],
                                 authorize_all=False)
            return
        self.authorize(WRITE, kind, name)
        self._admit_destination(kind, name)
        if QUERY not in h and self._no_room(frame, kind, name):
            return
        self.received += 1
        if QUERY in h:
            self._stream_query(frame, kind, name)
            return
        txid = h.get("transaction")
        producer = None
        if dedup.PRODUCER_ID in h or dedup.PRODUCER_SEQ in h:
            producer = dedup.producer_of(h)
            if (producer is not None and txid is None
                    and self.broker.producers.is_duplicate(*producer, self.broker.now_ms())):
                self.receipt(frame, {dedup.DUPLICATE: "true"})
                return
        if STREAM_ID in h and GROUP in h:
            try:
                self.broker.check_group(kind, name, h[GROUP], self.security.owner(self.user))
            except ChunkError as exc:
                raise ProtocolError(str(exc), fatal=False) from None
        if STREAM_ID in h and txid is None:
            try:
                chunk = parse_chunk(h, len(frame.body))
                if not self.broker.accept_chunk(kind, name, chunk, len(frame.body), self.peer,
                                                self.security.owner(self.user)):
                    self.receipt(frame, {DUPLICATE: "true"})
                    return
            except ChunkError as exc:
                extra = {NEXT_SEQ: str(exc.next_seq)} if exc.next_seq is not None else None
                self.error(str(exc), frame, fatal=False, extra=extra)
                return
        if txid is not None:
            if self.scheduler.wants(h):
                raise ProtocolError("a scheduled SEND inside a transaction is not supported",
                                    fatal=False)
            spool = self._tx(txid)
            spools = self.transactions.values()
            txlimits.admit(spools, len(frame.body), self._tx_limit)
            txlimits.bound_memory(spools)
            if stage_frames.add_send(spool, frame, kind, name, self.broker.now_ms()):
                self.receipt(frame)
                return
            headers = {k: v for k, v in h.items() if k not in TRANSPORT_HEADERS}
            headers["destination"] = h["destination"]
            spool.add(OP_SEND, records.encode_message(
                f"{kind}:{name}", 0, self.broker.now_ms(), parse_expires(h.get("expires")),
                parse_priority(h.get("priority")), headers, bytes(frame.body)))
            self.receipt(frame)
            return
        stage_frames.refuse_batch(h)
        msg = self._message(kind, name, h, frame.body)
        if not (self.scheduler.wants(h) and self.scheduler.schedule(kind, name, msg)):
            self.broker.publish(kind, name, msg)
        if producer is not None:
            self.broker.producers.accepted(*producer, msg.timestamp, msg.ticket)
        self.receipt(frame)

    def _send_composite(self, frame: Frame, targets: list[tuple[str, str]], *,
                        authorize_all: bool = True) -> None:
        """SEND to ``/queue/a,/topic/b`` (or a virtual topic and its group queues): a copy
        to each destination, stored as one journal transaction when persistent (all copies
        or none survive a crash), each flow-controlled as if sent there alone and, unless
        the broker adds them itself (virtual topics), authorized."""
        h = frame.headers
        for kind, name in targets if authorize_all else targets[:1]:
            self.authorize(WRITE, kind, name)
            self._admit_destination(kind, name)
        for special in (QUERY, STREAM_ID, stage_frames.FORMAT):
            if special in h:
                raise ProtocolError(f"{special} is not supported on a composite destination",
                                    fatal=False)
        if self.scheduler.wants(h):
            raise ProtocolError("a scheduled SEND to several destinations is not supported",
                                fatal=False)
        for kind, name in targets:
            if self._no_room(frame, kind, name):
                return  # the whole SEND runs again once there is room
        self.received += 1
        txid = h.get("transaction")
        producer = dedup.producer_of(h) if dedup.PRODUCER_ID in h or dedup.PRODUCER_SEQ in h \
            else None
        if (producer is not None and txid is None
                and self.broker.producers.is_duplicate(*producer, self.broker.now_ms())):
            self.receipt(frame, {dedup.DUPLICATE: "true"})
            return
        if txid is not None:
            spool = self._tx(txid)
            spools = self.transactions.values()
            txlimits.admit(spools, len(frame.body) * len(targets), self._tx_limit)
            txlimits.bound_memory(spools)
            for kind, name in targets:
                headers = {k: v for k, v in h.items() if k not in TRANSPORT_HEADERS}
                headers["destination"] = destination_of(kind, name)
                spool.add(OP_SEND, records.encode_message(
                    f"{kind}:{name}", 0, self.broker.now_ms(), parse_expires(h.get("expires")),
                    parse_priority(h.get("priority")), headers, bytes(frame.body)))
            self.receipt(frame)
            return
        copies = [(kind, name, self._message(kind, name, h, frame.body))
                  for kind, name in targets]
        if copies[0][2].persistent:
            self.broker.commit(f"{self.id}:composite:{next(_composite_ids)}", copies, [], [])
        else:
            for kind, name, msg in copies:
                self.broker.publish(kind, name, msg)
        if producer is not None:
            self.broker.producers.accepted(*producer, copies[-1][2].timestamp,
                                           copies[-1][2].ticket)
        self.receipt(frame)

    def when_durable_retry(self, frame: Frame) -> None:
        """Handle ``frame`` again once everything stored so far is durable; the frames after
        it wait behind it, in order, as behind a SEND that waits for room."""
        self._waiting = deque([frame])
        pause = getattr(self.out, "pause_reading", None)
        if pause is not None:
            pause()
        self.broker.when_durable(lambda exc: self._room_again())

    def _no_room(self, frame: Frame, kind: str, name: str) -> bool:
        """Producer flow control: True when this SEND was refused or must wait for room.

        Waiting pauses reading this connection (its later frames wait behind the SEND, in
        order) until the destination has room; other connections carry on. A transactional
        SEND only goes to the spool, so only its size is checked.
        """
        flow = self.broker.flow
        policy = self.broker.policy(kind, name)
        too_large = flow.too_large(policy, len(frame.body))
        if too_large is not None:
            raise ProtocolError(too_large, fatal=False)
        if "transaction" in frame.headers:
            return False
        persistent = frame.headers.get("persistent") == "true"
        reason = self.broker.room_for(kind, name, persistent, policy)
        if reason is None:
            return False
        if policy.fail_if_no_space:
            flow.failed_total += 1
            raise ProtocolError(f"/{kind}/{name} cannot take the message: {reason}",
                                fatal=False)
        log.log(logging.DEBUG if isinstance(reason, Pacing) else logging.INFO,
                "flow control: %s waits for /%s/%s (%s)", self.peer, kind, name, reason)
        self._waiting = deque([frame])
        pause = getattr(self.out, "pause_reading", None)
        if pause is not None:
            pause()

        def recheck() -> str | None:
            return None if self.closed else self.broker.room_for(kind, name, persistent)

        flow.wait(recheck, self._room_again, reason)
        return True

    def _room_again(self) -> None:
        """The destination has room: run the waiting SEND and what followed it."""
        waiting, self._waiting = self._waiting, None
        if self.closed or waiting is None:
            return
        resume = getattr(self.out, "resume_reading", None)
        if resume is not None:
            resume()
        self._run(waiting)

    def _admit_destination(self, kind: str, name: str) -> None:
        """A destination this frame would create must fit the destination caps."""
        self.broker.destinations.admit(kind, name,
                                       owner_of(self.user.name if self.user else None, self.peer))

    def _may_read_topic(self, name: str) -> bool:
        """A wildcard subscription reaches a topic only if this user may read it."""
        return self.security.authorize(self.user, READ, f"/topic/{name}")

    def authorize(self, action: str, kind: str, name: str) -> None:
        if not self.security.authorize(self.user, action, f"/{kind}/{name}"):
            who = self.user.name if self.user else "anonymous"
            log.warning("refused %s on /%s/%s to %s from %s", action, kind, name, who, self.peer)
            raise ProtocolError(f"user {who!r} is not authorized to {action} /{kind}/{name}",
                                fatal=False)

    def _stream_query(self, frame: Frame, kind: str, name: str) -> None:
        """Where should a reconnecting producer resume?  Optionally wait for a consumer."""
        try:
            answer = self.broker.stream_query(kind, name, frame.headers[QUERY],
                                              self.security.owner(self.user))
        except ChunkError as exc:
            raise ProtocolError(str(exc), fatal=False) from None
        wait = frame.headers.get(WAIT_CONSUMER)
        if wait is None:
            self.receipt(frame, answer)
            return
        try:
            timeout = float(wait)
        except ValueError:
            raise ProtocolError(f"invalid {WAIT_CONSUMER} {wait!r}", fatal=False) from None

        def ready(count: int) -> None:
            self.receipt(frame, dict(answer, **{"sluice-stream-consumers": str(count)}))

        self.broker.wait_for_consumer(kind, name, timeout, ready, owner=self)

    def _message(self, kind: str, name: str, h: dict[str, str],
                 body: bytes | memoryview) -> Message:
        headers = {k: v for k, v in h.items() if k not in TRANSPORT_HEADERS}
        now = self.broker.now_ms()
        if "timestamp" not in headers:
            headers["timestamp"] = str(now)  # as ActiveMQ: when the broker got it
        return Message(self.broker.allocate_mid(), f"/{kind}/{name}", headers, bytes(body),
                       persistent=h.get("persistent") == "true",
                       priority=parse_priority(h.get("priority")),
                       expires=parse_expires(h.get("expires")),
                       timestamp=now)

    # -- SUBSCRIBE / UNSUBSCRIBE -------------------------------------------------------------
    def _subscribe(self, frame: Frame) -> None:
        h = frame.headers
        if h.get("destination", "").startswith(("/temp-", "/remote-temp-")):
            self._temporary(frame)
        destination = h.get("destination")
        kind, name, pattern = parse_subscription(destination)
        scheduled.refuse_direct(kind, name)
        if name.startswith(TEMP_PREFIX):
            self.broker.temps.check(kind, name, self.id, consuming=True)
        if pattern:  # read rights are checked per topic the pattern reaches, per message
            if h.get("browser") == "true":
                raise ProtocolError("a range read needs one destination, not a wildcard",
                                    fatal=False)
        else:
            self.authorize(READ, kind, name)
            if h.get("browser") == "true":  # range read, head query or ledger commit
                self.ranges.subscribe(self, frame, kind, name)
                return
            self._admit_destination(kind, name)
        limits = self.broker.config.limits
        if len(self.consumers) >= limits.max_subscriptions:
            raise ProtocolError(f"too many subscriptions on this connection (limit "
                                f"{limits.max_subscriptions}, max_subscriptions)", fatal=False)
        sub_id = h.get("id")
        if sub_id is None:
            if self.version != "1.0":
                raise ProtocolError("SUBSCRIBE requires an 'id' header", fatal=False)
            sub_id = destination or ""
        if sub_id in self.consumers:
            raise ProtocolError(f"subscription id {sub_id!r} already in use", fatal=False)
        ack_mode = h.get("ack", AUTO)
        if ack_mode not in ACK_MODES:
            raise ProtocolError(f"invalid ack mode {ack_mode!r}; use one of {ACK_MODES}",
                                fatal=False)
        prefetch = self.broker.policy(kind, name).default_prefetch
        raw_prefetch = h.get("activemq.prefetchSize")
        if raw_prefetch is not None:
            try:
                prefetch = int(raw_prefetch)
            except ValueError:
                raise ProtocolError(f"invalid activemq.prefetchSize {raw_prefetch!r}",
                                    fatal=False) from None
            if prefetch < 1:
                raise ProtocolError("activemq.prefetchSize must be at least 1", fatal=False)
        prefetch = min(prefetch, limits.max_unacked)
        selector_text = h.get("selector") or None
        try:
            selector = compile_selector(selector_text) if selector_text else None
        except SelectorError as exc:
            raise ProtocolError(f"invalid selector: {exc}", fatal=False) from None
        durable_name = h.get("activemq.subscriptionName") or h.get("durable-subscription-name")
        try:
            max_streams = int(h.get(MAX_STREAMS, "0"))
        except ValueError:
            raise ProtocolError(f"invalid {MAX_STREAMS} {h.get(MAX_STREAMS)!r}",
                                fatal=False) from None
        priority = _consumer_priority(h)  # checked before anything is created for it
        index = next(self._indexes)
        queue: Queue
        consumer_selector = selector
        if kind == QUEUE and durable_name:  # as ActiveMQ: only topics have durable subscribers
            raise ProtocolError(f"activemq.subscriptionName {durable_name!r} on a queue: durable "
                                "subscriptions are for topics (/topic/...)", fatal=False)
        if kind == QUEUE:
            queue = self.broker.subscribe_queue(name)
        elif pattern:
            if durable_name:
                raise ProtocolError("durable subscriptions to a wildcard pattern are not "
                                    "supported yet", fatal=False)
            queue = self.broker.subscribe_topic_pattern(name, f"s:{self.id}:{index}", selector,
                                                        self._may_read_topic)
            consumer_selector = None
        elif durable_name:
            if not self.client_id:
                raise ProtocolError("a durable subscription needs a client-id on CONNECT",
                                    fatal=False)
            self._claim_durable(durable_name)
            queue = self.broker.durable_subscription(self.client_id, durable_name, name,
                                                     selector_text)
            if queue.consumers:
                raise ProtocolError(f"durable subscription {durable_name!r} is already active",
                                    fatal=False)
            consumer_selector = None
        else:
            queue = self.broker.subscribe_topic(name, f"s:{self.id}:{index}", selector)
            consumer_selector = None
        consumer = Consumer(self, sub_id, index, destination or "", queue, ack_mode=ack_mode,
                            prefetch=prefetch, selector=consumer_selector,
                            exclusive=h.get("activemq.exclusive") == "true",
                            max_streams=max_streams, priority=priority)
        self.consumers[sub_id] = consumer
        self.by_index[index] = consumer
        self.broker.attach(consumer)
        self.broker.advisories.consumer("added", kind, name, self.id, sub_id)
        self.receipt(frame)

    def _unsubscribe(self, frame: Frame) -> None:
        h = frame.headers
        sub_id = h.get("id") or (h.get("destination") if self.version == "1.0" else None)
        durable_name = h.get("activemq.subscriptionName") or h.get("durable-subscription-name")
        consumer = self.consumers.pop(sub_id, None) if sub_id is not None else None
        if (consumer is None and not durable_name and sub_id is not None
                and self.ranges.unsubscribe(self, sub_id)):
            self.receipt(frame)
            return
        if consumer is None and not durable_name:
            raise ProtocolError(f"no subscription with id {sub_id!r}", fatal=False)
        if consumer is not None:
            self.by_index.pop(consumer.index, None)
            self._drop_consumer(consumer)
        if durable_name:
            if not self.client_id:
                raise ProtocolError("removing a durable subscription needs a client-id",
                                    fatal=False)
            self._claim_durable(durable_name)
            self.broker.remove_durable(f"d:{self.client_id}:{durable_name}")
            if self.security.durables is not None:
                self.security.durables.release(f"d:{self.client_id}:{durable_name}")
        self.receipt(frame)

    def _claim_durable(self, durable_name: str) -> None:
        """A durable subscription belongs to the user who made it; refuse anyone else."""
        owners = self.security.durables
        if owners is not None and not owners.claim(f"d:{self.client_id}:{durable_name}",
                                                   self.user):
            raise ProtocolError(f"durable subscription {durable_name!r} belongs to another user",
                                fatal=False)

    def _drop_consumer(self, consumer: Consumer) -> None:
        queue = consumer.queue
        queue.remove_consumer(consumer)
        kind, _, name = consumer.destination[1:].partition("/")
        self.broker.advisories.consumer("removed", kind, name, self.id, consumer.sub_id)
        if queue.key.startswith("s:"):
            self.broker.drop_topic_subscription(queue.destination.split("/", 2)[2], queue.key)

    # -- ACK / NACK --------------------------------------------------------------------------
    def _resolve_ack(self, h: dict[str, str], nack: bool) -> tuple[Consumer, list[Message]]:
        """Find what an ACK/NACK refers to, by 1.2 `id` or 1.0/1.1 `message-id`."""
        ack_id = h.get("id")
        if ack_id is not None and "-" in ack_id and not ack_id.startswith("ID:"):
            idx, _, mid_text = ack_id.partition("-")
            try:
                consumer = self.by_index.get(int(idx))
                mid = int(mid_text)
            except ValueError:
                consumer = None
            if consumer is not None:
                return consumer, self._take(consumer, mid, nack)
            raise ProtocolError(f"unknown ack id {ack_id!r}", fatal=False)
        message_id = h.get("message-id") or ack_id
        if not message_id:
            raise ProtocolError(f"{'NACK' if nack else 'ACK'} requires an 'id' "
                                "(or 'message-id') header", fatal=False)
        if not message_id.startswith("ID:sluice-"):
            raise ProtocolError(f"unknown message-id {message_id!r}", fatal=False)
        try:
            mid = int(message_id[len("ID:sluice-"):])
        except ValueError:
            raise ProtocolError(f"unknown message-id {message_id!r}", fatal=False) from None
        sub = h.get("subscription")
        candidates = [self.consumers[sub]] if sub in self.consumers else self.consumers.values()
        for consumer in candidates:
            if mid in consumer.inflight:
                return consumer, self._take(consumer, mid, nack)
        committed = self.ranges.ignorable_ack
        for consumer in candidates:
            if committed(consumer.queue, mid):  # a ledger commit took it away
                return consumer, self._take(consumer, mid, nack)
        raise ProtocolError(f"no unacknowledged message {message_id!r} on this connection",
                            fatal=False)

    def _take(self, consumer: Consumer, mid: int, nack: bool) -> list[Message]:
        if mid not in consumer.inflight:
            if self.ranges.ignorable_ack(consumer.queue, mid):
                # A ledger commit took it away; a cumulative ACK still covers older ones.
                return consumer.take_inflight_below(mid) if consumer.ack_mode == CLIENT else []
            raise ProtocolError(f"message {mid} is not awaiting acknowledgement on subscription "
                                f"{consumer.sub_id!r}", fatal=False)
        if consumer.ack_mode == CLIENT:
            return consumer.take_inflight_upto(mid)
        return [consumer.inflight.pop(mid)]

    def _ack(self, frame: Frame, nack: bool = False) -> None:
        h = frame.headers
        txid = h.get("transaction")
        if txid is not None:
            spool = self._tx(txid)
            stage_frames.check_op(spool, frame)
            spool.add(OP_ACK, json.dumps({"h": {k: h[k] for k in ("id", "message-id",
                                                                   "subscription") if k in h},
                                          "nack": nack}).encode())
            self.receipt(frame)
            return
        consumer, msgs = self._resolve_ack(h, nack)
        if nack:
            returned = list(msgs)
            for group in {m.group for m in msgs if m.group in consumer.open_streams}:
                returned += consumer.queue.release_stream(consumer, group)
            returned.sort(key=lambda m: m.mid)  # a stream's chunks go back in sequence order
            consumer.queue.return_messages(returned)
        else:
            consumer.queue.acknowledge(msgs, consumer=consumer)
        self.receipt(frame)

    def _nack(self, frame: Frame) -> None:
        self._ack(frame, nack=True)

    # -- transactions ------------------------------------------------------------------------
    def _tx(self, txid: str) -> TxSpool:
        spool = self.transactions.get(txid)
        if spool is None:
            raise ProtocolError(f"unknown transaction {txid!r}", fatal=False)
        return spool

    def _tx_id(self, frame: Frame) -> str:
        txid = frame.headers.get("transaction")
        if not txid:
            raise ProtocolError(f"{frame.command} requires a 'transaction' header", fatal=False)
        return txid

    def _begin(self, frame: Frame) -> None:
        txid = self._tx_id(frame)
        if txid in self.transactions:
            raise ProtocolError(f"transaction {txid!r} already open", fatal=False)
        limit = self.broker.config.limits.max_transactions
        if len(self.transactions) >= limit:
            raise ProtocolError(f"too many open transactions on this connection (limit {limit}, "
                                "max_transactions)", fatal=False)
        directory = Path(self.broker.config.data_dir) / "tmp"
        directory.mkdir(parents=True, exist_ok=True)
        self.transactions[txid] = stage_frames.open_spool(directory, txid, frame.headers)
        self.receipt(frame)

    def _abort(self, frame: Frame) -> None:
        if STAGE_ABORT in frame.headers:
            stage_frames.abort(self, frame)
            return
        txid = self._tx_id(frame)
        self._tx(txid).close()
        del self.transactions[txid]
        self.receipt(frame)

    def _commit(self, frame: Frame) -> None:
        if STAGE_COMMIT in frame.headers:
            stage_frames.publish(self, frame)
            return
        txid = self._tx_id(frame)
        spool = self._tx(txid)
        del self.transactions[txid]
        try:
            extra = self._apply(txid, spool)
        finally:
            spool.close()
        self.receipt(frame, extra)

    def _apply(self, txid: str, spool: TxSpool) -> dict[str, str] | None:
        """Commit the spool; returns headers for the RECEIPT, if any."""
        if isinstance(spool, stage_frames.StageSpool):
            return stage_frames.commit_part(self, spool)
        producers = self.broker.producers
        now = self.broker.now_ms()
        numbered: list[tuple[str, int, Message]] = []
        highest: dict[str, int] = {}  # producer id -> highest number earlier in this transaction
        dropped = 0
        messages: list[tuple[str, str, Message]] = []
        acks: dict[int, tuple[Queue, list[Message]]] = {}
        nacks: dict[int, tuple[Queue, list[Message]]] = {}
        taken: list[tuple[Consumer, Message]] = []
        try:
            for op, payload in spool:
                if op == OP_SEND:
                    sm = records.decode_message(payload)
                    kind, _, name = sm.key.partition(":")
                    headers = dict(sm.headers)
                    producer = dedup.producer_of(headers) if dedup.PRODUCER_ID in headers else None
                    if producer is not None:
                        pid, seq = producer
                        if seq <= highest.get(pid, -1) or producers.is_duplicate(pid, seq, now):
                            dropped += 1
                            continue
                        highest[pid] = seq
                    msg = Message(self.broker.allocate_mid(), headers.pop("destination"),
                                  headers, sm.body,
                                  persistent=headers.get("persistent") == "true",
                                  priority=sm.priority, expires=sm.expires,
                                  timestamp=sm.timestamp)
                    messages.append((kind, name, msg))
                    if producer is not None:
                        numbered.append((*producer, msg))
                else:
                    entry = json.loads(payload)
                    consumer, msgs = self._resolve_ack(entry["h"], entry["nack"])
                    taken += [(consumer, m) for m in msgs]
                    target = nacks if entry["nack"] else acks
                    target.setdefault(id(consumer.queue), (consumer.queue, []))[1].extend(msgs)
        except ProtocolError:
            for consumer, m in taken:  # nothing applied: put back what resolution took
                consumer.inflight[m.mid] = m
            raise
        self.broker.commit(f"{self.id}:{txid}", messages, list(acks.values()),
                           list(nacks.values()))
        for pid, seq, msg in numbered:
            producers.accepted(pid, seq, msg.timestamp, msg.ticket)
        return {dedup.DUPLICATES: str(dropped)} if dropped else None


def _representable(key: str, value: str, version: str) -> bool:
    try:
        encode_head(Frame("MESSAGE", {key: value}), version)
    except ValueError:
        return False
    return True


def _header_safe(text: str) -> str:
    """One printable line with no backslash: readable in any version, even before CONNECT."""
    return "".join(ch if ch.isprintable() and ch != "\\" else "?" for ch in text)[:1000]


_HANDLERS: dict[str, Callable[[Session, Frame], None]] = {
    "SEND": Session._send,
    "SUBSCRIBE": Session._subscribe,
    "UNSUBSCRIBE": Session._unsubscribe,
    "ACK": Session._ack,
    "NACK": Session._nack,
    "BEGIN": Session._begin,
    "COMMIT": Session._commit,
    "ABORT": Session._abort,
    "DISCONNECT": Session._disconnect,
}


def _consumer_priority(h: dict[str, str]) -> int:
    """``activemq.priority`` of a SUBSCRIBE: 0 (the default) to 127, as ActiveMQ takes it."""
    value = h.get("activemq.priority", "0")
    if not (value.isascii() and value.isdigit()) or int(value) > 127:
        raise ProtocolError(f"invalid activemq.priority {value[:20]!r}: expected 0-127",
                            fatal=False)
    return int(value)
