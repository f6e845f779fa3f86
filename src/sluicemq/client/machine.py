"""The client side of STOMP as a sans-IO state machine: bytes in, events out, frames built.

Both front ends (blocking `Client`, asyncio `AsyncClient`) drive one `ClientMachine`; all
protocol decisions live here so they are tested without sockets and never diverge: version
negotiation, receipts, the ACK header dialect of each version, heart-beat timing and how
ERROR frames map onto the calls that caused them.
"""

from __future__ import annotations

import functools
import itertools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from sluicemq.client.credit import StreamCredit
from sluicemq.config import Limits
from sluicemq.errors import ClientError
from sluicemq.protocol.codec import FrameParser, encode_frame
from sluicemq.protocol.frames import Frame
from sluicemq.protocol.heartbeat import HeartbeatMonitor, negotiate, parse_heart_beat
from sluicemq.streaming import manifest as wire

VERSIONS = ("1.0", "1.1", "1.2")
ACK_MODES = frozenset({"auto", "client", "client-individual"})
TEXT_CONTENT_TYPE = "text/plain;charset=utf-8"

# An EOL goes out once this fraction of the promised interval has passed idle, so that
# scheduling jitter on a busy machine never makes us miss the broker's deadline.
SEND_EARLY = 0.8


@dataclass(frozen=True, slots=True)
class Connected:
    """CONNECTED arrived; intervals are in seconds (0.0 means that direction is off)."""

    version: str
    server: str | None
    session: str | None
    send_interval: float
    receive_interval: float


@dataclass(frozen=True, slots=True)
class MessageReceived:
    """A MESSAGE for one of our live subscriptions, with the id the broker wants acked."""

    frame: Frame
    subscription: str
    ack_id: str
    ack_mode: str


@dataclass(frozen=True, slots=True)
class ReceiptReceived:
    """The broker processed the frame that carried `receipt_id`; some receipts carry answers
    in extra headers (the stream resume query), so all headers are kept."""

    receipt_id: str
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ErrorReceived:
    """An ERROR frame. `receipt_id` names the call it answers; None means the whole connection."""

    error: ClientError
    receipt_id: str | None


Event = Connected | MessageReceived | ReceiptReceived | ErrorReceived


@dataclass(frozen=True, slots=True)
class Outgoing:
    """Bytes to write, the receipt id to wait for (if any) and the id the call created."""

    data: bytes
    receipt: str | None = None
    ident: str | None = None


@dataclass(frozen=True, slots=True)
class HeartbeatCheck:
    """What a front end must do now: write `data` (an EOL or nothing), give up if `dead`,
    and call again within `wait` seconds (None: heart-beating is off, no timer needed)."""

    data: bytes
    dead: bool
    wait: float | None


@dataclass(slots=True)
class SubscriptionState:
    """What the machine must remember to route MESSAGE frames and build ACK/UNSUBSCRIBE."""

    id: str
    destination: str
    ack_mode: str
    durable_name: str | None
    headers: dict[str, str] = field(default_factory=dict)  # the SUBSCRIBE, to replay it
    credit: StreamCredit | None = None  # streams asked for and read (sluice-stream-credit)
    parked: bool = False  # not replayed after a failover: it had every stream it asked for


class ClientMachine:
    """Protocol state of one client connection; never touches a socket or a timer.

    `clock` is injectable so heart-beat behaviour is testable with a fake time source.
    `body_buffers` (see ``FrameParser``): where large MESSAGE bodies are gathered, for a
    connection whose bodies are read as views (column batches) and may reuse kept buffers.
    """

    def __init__(
        self,
        *,
        host: str,
        login: str | None = None,
        passcode: str | None = None,
        client_id: str | None = None,
        heartbeat: tuple[int, int] = (10_000, 10_000),
        version: str = "1.2",
        limits: Limits | None = None,
        clock: Callable[[], float] = time.monotonic,
        body_buffers: Callable[[int], memoryview | None] | None = None,
    ) -> None:
        if version not in VERSIONS:
            raise ValueError(f"unsupported STOMP version {version!r} (choose from {VERSIONS})")
        if min(heartbeat) < 0:
            raise ValueError("heart-beat intervals must be >= 0")
        limits = limits or Limits()
        self._successor = functools.partial(
            ClientMachine, host=host, login=login, passcode=passcode, client_id=client_id,
            heartbeat=heartbeat, version=version, limits=limits, clock=clock,
            body_buffers=body_buffers)
        self.host = host
        self.login = login
        self.passcode = passcode
        self.client_id = client_id
        self.heartbeat_offer = heartbeat
        self.accepted = VERSIONS[: VERSIONS.index(version) + 1]
        self.state = "new"  # new -> connecting -> connected -> disconnecting -> closed
        self.version: str | None = None
        self.server: str | None = None
        self.session: str | None = None
        self.send_interval = 0.0
        self.receive_interval = 0.0
        self.subscriptions: dict[str, SubscriptionState] = {}
        self.pending_receipts: set[str] = set()
        self._parser = FrameParser(
            version=version,
            max_frame_bytes=limits.max_frame_bytes,
            max_headers=limits.max_headers,
            max_header_line=limits.max_header_line,
            body_buffers=body_buffers,
        )
        self._clock = clock
        self._ids = itertools.count(1)
        self._disconnect_receipt: str | None = None
        self._beats: HeartbeatMonitor | None = None  # set once CONNECTED fixes the intervals
        self.last_error: ClientError | None = None  # latest ERROR that no receipt claimed
        # Final chunks of subscriptions with a stream credit: ack id -> (subscription,
        # destination), then, once ACKed with a receipt, receipt id -> the same (client/credit.py)
        self._finals: dict[str, tuple[str, str]] = {}
        self._final_acks: dict[str, tuple[str, str]] = {}

    # ---------------------------------------------------------------- outgoing frames

    def connect(self) -> bytes:
        """The CONNECT frame; call once, first."""
        if self.state != "new":
            raise ClientError("connect() called twice")
        self.state = "connecting"
        headers = {"accept-version": ",".join(self.accepted), "host": self.host}
        if self.accepted[-1] != "1.0":
            headers["heart-beat"] = f"{self.heartbeat_offer[0]},{self.heartbeat_offer[1]}"
        if self.login is not None:
            headers["login"] = self.login
        if self.passcode is not None:
            headers["passcode"] = self.passcode
        if self.client_id is not None:
            headers["client-id"] = self.client_id
        return self._encode(Frame("CONNECT", headers))

    def send(
        self,
        destination: str,
        body: bytes | str = b"",
        headers: Mapping[str, str] | None = None,
        *,
        persistent: bool = True,
        receipt: bool = True,
        transaction: str | None = None,
    ) -> Outgoing:
        """A SEND; `persistent` maps to ActiveMQ's `persistent` header, which defaults to off."""
        out = dict(headers or {})
        if isinstance(body, str):
            body = body.encode("utf-8")
            out.setdefault("content-type", TEXT_CONTENT_TYPE)
        out["destination"] = destination
        out.setdefault("persistent", "true" if persistent else "false")
        if transaction is not None:
            out["transaction"] = transaction
        return self._outgoing(Frame("SEND", out, body), receipt)

    def subscribe(
        self,
        destination: str,
        *,
        ack: str = "auto",
        prefetch: int | None = None,
        selector: str | None = None,
        headers: Mapping[str, str] | None = None,
        durable_name: str | None = None,
        exclusive: bool = False,
        id: str | None = None,
        receipt: bool = True,
    ) -> Outgoing:
        """A SUBSCRIBE with ActiveMQ's extension headers; `ident` is the subscription id."""
        self._require_connected()
        if ack not in ACK_MODES:
            raise ValueError(f"ack mode must be one of {sorted(ACK_MODES)}, not {ack!r}")
        if durable_name is not None and self.client_id is None:
            raise ValueError("a durable subscription needs the client to connect with client_id")
        sub_id = id if id is not None else f"sub-{next(self._ids)}"
        if sub_id in self.subscriptions:
            raise ValueError(f"subscription id {sub_id!r} is already in use")
        out = dict(headers or {})
        out.update({"destination": destination, "id": sub_id, "ack": ack})
        if prefetch is not None:
            out["activemq.prefetchSize"] = str(prefetch)
        if selector is not None:
            out["selector"] = selector
        if durable_name is not None:
            out["activemq.subscriptionName"] = durable_name
        if exclusive:
            out["activemq.exclusive"] = "true"
        self.subscriptions[sub_id] = SubscriptionState(
            sub_id, destination, ack, durable_name, dict(out),
            StreamCredit.asked(out, destination))
        result = self._outgoing(Frame("SUBSCRIBE", out), receipt)
        return Outgoing(result.data, result.receipt, sub_id)

    def successor(self) -> ClientMachine:
        """A fresh machine for a new connection after a failover: same settings, and receipt
        ids that continue ours so an id is never reused within one client."""
        machine = self._successor()
        machine._ids = self._ids
        return machine

    def resubscribe(self, sub: SubscriptionState) -> Outgoing:
        """Replay a subscription of a previous connection: same id, ack mode, selector and
        durable name, with a receipt; a stream credit asks for the streams not yet read, and
        a subscription that read all it asked for is kept here but not replayed (no bytes,
        no receipt: the broker would refuse a credit of 0)."""
        self._require_connected()
        self.subscriptions[sub.id] = sub
        headers = dict(sub.headers)
        if sub.credit is not None:
            left = sub.credit.remaining()
            sub.parked = left == 0
            if sub.parked:
                return Outgoing(b"", None, sub.id)
            headers[wire.STREAM_CREDIT] = str(left)
        result = self._outgoing(Frame("SUBSCRIBE", headers), True)
        return Outgoing(result.data, result.receipt, sub.id)

    def unsubscribe(self, sub_id: str, *, durable: bool = False, receipt: bool = True) -> Outgoing:
        """An UNSUBSCRIBE; `durable` also asks the broker to forget a durable subscription."""
        sub = self.subscriptions.pop(sub_id, None)
        if sub is None:
            raise ValueError(f"no subscription with id {sub_id!r}")
        if sub.parked:
            return Outgoing(b"")  # this broker never had it
        headers = {"id": sub_id, "destination": sub.destination}
        if durable:
            if sub.durable_name is None:
                raise ValueError(f"subscription {sub_id!r} is not durable")
            headers["activemq.subscriptionName"] = sub.durable_name
        return self._outgoing(Frame("UNSUBSCRIBE", headers), receipt)

    def ack(
        self, ack_id: str, subscription: str, *, transaction: str | None = None,
        receipt: bool = False,
    ) -> Outgoing:
        """An ACK in the dialect of the negotiated version; empty for `auto` subscriptions."""
        return self._acknowledge("ACK", ack_id, subscription, transaction, receipt)

    def nack(
        self, ack_id: str, subscription: str, *, transaction: str | None = None,
        receipt: bool = False,
    ) -> Outgoing:
        """A NACK (STOMP 1.1+); empty for `auto` subscriptions, where there is nothing to refuse."""
        if self.version == "1.0":
            raise ClientError("NACK does not exist in STOMP 1.0")
        return self._acknowledge("NACK", ack_id, subscription, transaction, receipt)

    def begin(self, transaction: str | None = None, *, receipt: bool = True,
              headers: Mapping[str, str] | None = None) -> Outgoing:
        """A BEGIN; `ident` is the transaction id (generated unless given)."""
        tx = transaction if transaction is not None else f"tx-{next(self._ids)}"
        result = self._outgoing(Frame("BEGIN", {**(headers or {}), "transaction": tx}), receipt)
        return Outgoing(result.data, result.receipt, tx)

    def commit(self, transaction: str, *, receipt: bool = True,
               headers: Mapping[str, str] | None = None) -> Outgoing:
        """A COMMIT; extra `headers` carry extensions (a stage publication)."""
        return self._outgoing(Frame("COMMIT", {**(headers or {}), "transaction": transaction}),
                              receipt)

    def abort(self, transaction: str, *, receipt: bool = True,
              headers: Mapping[str, str] | None = None) -> Outgoing:
        return self._outgoing(Frame("ABORT", {**(headers or {}), "transaction": transaction}),
                              receipt)

    def disconnect(self) -> Outgoing:
        """A DISCONNECT with a receipt: once it arrives, everything sent before was processed."""
        result = self._outgoing(Frame("DISCONNECT"), True)
        self.state = "disconnecting"
        self._disconnect_receipt = result.receipt
        return result

    # ---------------------------------------------------------------- incoming bytes

    def receive_data(self, data: bytes | memoryview) -> list[Event]:
        """Feed bytes read from the socket; returns what they meant, in order.

        Raises ProtocolError on malformed input (or a bad heart-beat header) and ClientError
        on an impossible CONNECTED.
        """
        if data and self._beats is not None:
            self._beats.received(self._clock())
        events: list[Event] = []
        for frame in self._parser.feed(data):
            event = self._handle(frame)
            if event is not None:
                events.append(event)
        return events

    def connection_lost(self) -> None:
        """The transport closed; nothing more can be sent or awaited."""
        self.state = "closed"
        self.pending_receipts.clear()

    def closed_by_peer(self) -> ClientError:
        """The error for an EOF from the broker, naming the ERROR that probably explains it."""
        last = self.last_error
        if last is None:
            return ClientError("connection closed by the broker")
        return ClientError(f"connection closed by the broker after ERROR: {last}",
                           last.headers, last.body)

    def heartbeat(self) -> HeartbeatCheck:
        """Decide whether an EOL is due, whether the broker went silent, and when to ask again."""
        beats = self._beats
        if beats is None or self.state not in ("connected", "disconnecting"):
            return HeartbeatCheck(b"", False, None)
        now = self._clock()
        data = b""
        if beats.should_send(now):
            data = b"\n"
            beats.sent(now)
        deadline = beats.next_deadline()
        wait = None if deadline is None else max(deadline - now, 0.0)
        return HeartbeatCheck(data, beats.peer_dead(now), wait)

    # ---------------------------------------------------------------- internals

    def _handle(self, frame: Frame) -> Event | None:
        command = frame.command
        if command == "MESSAGE":
            return self._message(frame)
        if command == "RECEIPT":
            receipt_id = frame.headers.get("receipt-id", "")
            if receipt_id not in self.pending_receipts:
                return None
            self.pending_receipts.discard(receipt_id)
            if receipt_id == self._disconnect_receipt:
                self.state = "closed"
            if self._final_acks:
                self._final_read(receipt_id)
            return ReceiptReceived(receipt_id, dict(frame.headers))
        if command == "ERROR":
            return self._error(frame)
        if command == "CONNECTED":
            return self._connected(frame)
        raise ClientError(f"unexpected {command} frame from the broker")

    def _connected(self, frame: Frame) -> Connected:
        if self.state != "connecting":
            raise ClientError("unexpected CONNECTED frame")
        version = frame.headers.get("version", "1.0")
        if version not in self.accepted:
            raise ClientError(f"broker chose STOMP {version}, we accept {','.join(self.accepted)}")
        self.state = "connected"
        self.version = version
        self._parser.version = version
        self.server = frame.headers.get("server")
        self.session = frame.headers.get("session")
        server_beats = (0, 0)
        if version != "1.0":
            server_beats = parse_heart_beat(frame.headers.get("heart-beat"))
        # negotiate() answers from the broker's side: what it sends is what we expect.
        broker_sends, broker_expects = negotiate(self.heartbeat_offer, server_beats)
        self.send_interval = broker_expects / 1000
        self.receive_interval = broker_sends / 1000
        self._beats = HeartbeatMonitor(int(broker_expects * SEND_EARLY), broker_sends,
                                       self._clock())
        return Connected(version, self.server, self.session,
                         self.send_interval, self.receive_interval)

    def _message(self, frame: Frame) -> MessageReceived | None:
        headers = frame.headers
        sub_id = headers.get("subscription")
        if sub_id is None:
            # STOMP 1.0 brokers may omit it: route by destination instead.
            destination = headers.get("destination")
            sub_id = next((s.id for s in self.subscriptions.values()
                           if s.destination == destination), None)
        sub = self.subscriptions.get(sub_id) if sub_id is not None else None
        if sub is None:
            return None  # in flight when we unsubscribed; the broker redelivers if unacked
        message_id = headers.get("message-id", "")
        ack_id = headers.get("ack", message_id) if self.version == "1.2" else message_id
        if headers.get("browser") == "end":  # a browse or range read is over on the broker
            del self.subscriptions[sub.id]
        if (sub.credit is not None and sub.ack_mode != "auto"
                and headers.get(wire.FINAL) == "true"):
            self._finals[ack_id] = (sub.id, headers.get("destination", sub.destination))
        return MessageReceived(frame, sub.id, ack_id, sub.ack_mode)

    def _final_read(self, receipt_id: str) -> None:
        """A RECEIPT confirmed the ACK of a final chunk: one stream read on its credit."""
        final = self._final_acks.pop(receipt_id, None)
        sub = self.subscriptions.get(final[0]) if final is not None else None
        if final is not None and sub is not None and sub.credit is not None:
            sub.credit.read(final[1])

    def _error(self, frame: Frame) -> ErrorReceived:
        body = bytes(frame.body)
        message = frame.headers.get("message") or body.decode("utf-8", "replace").strip()
        error = ClientError(message or "broker sent ERROR", dict(frame.headers), body)
        receipt_id = frame.headers.get("receipt-id")
        if receipt_id is not None and receipt_id in self.pending_receipts:
            self.pending_receipts.discard(receipt_id)
            return ErrorReceived(error, receipt_id)
        self.last_error = error
        return ErrorReceived(error, None)

    def _acknowledge(
        self, command: str, ack_id: str, subscription: str, transaction: str | None,
        receipt: bool,
    ) -> Outgoing:
        self._require_connected()
        sub = self.subscriptions.get(subscription)
        if sub is not None and sub.ack_mode == "auto":
            return Outgoing(b"")
        if self.version == "1.2":
            headers = {"id": ack_id}
        elif self.version == "1.1":
            headers = {"message-id": ack_id, "subscription": subscription}
        else:
            headers = {"message-id": ack_id}
        if transaction is not None:
            headers["transaction"] = transaction
        out = self._outgoing(Frame(command, headers), receipt)
        final = self._finals.pop(ack_id, None) if self._finals else None
        if final is not None and command == "ACK" and transaction is None and out.receipt:
            self._final_acks[out.receipt] = final
        return out

    def _outgoing(self, frame: Frame, receipt: bool) -> Outgoing:
        self._require_connected()
        receipt_id = None
        if receipt:
            receipt_id = f"r-{next(self._ids)}"
            frame.headers["receipt"] = receipt_id
            self.pending_receipts.add(receipt_id)
        return Outgoing(self._encode(frame), receipt_id)

    def _encode(self, frame: Frame) -> bytes:
        if self._beats is not None:
            self._beats.sent(self._clock())
        return encode_frame(frame, self.version or self.accepted[-1])

    def _require_connected(self) -> None:
        if self.state != "connected":
            raise ClientError(f"not connected (connection is {self.state})")
