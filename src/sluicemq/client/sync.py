"""The blocking client: a socket, a reader thread and the shared `ClientMachine`.

Two locks keep it thread-safe without deadlocks under back-pressure: `_state` guards the
machine and the waiter tables and is only ever held briefly; `_write` serialises whole
frames onto the socket. The reader thread never waits for `_write` (heart-beats are skipped
while another thread is writing, which already proves liveness), so a producer blocked on a
full socket can never stop us from reading what the broker sends.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import select
import socket
import ssl
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path

from sluicemq.client import files
from sluicemq.client.failover import (
    FailoverCallback,
    FailoverEvent,
    PendingSend,
    TransactionRolledBack,
    dial,
)
from sluicemq.client.files import Progress
from sluicemq.client.inbox import Ended, take
from sluicemq.client.machine import (
    ClientMachine,
    Connected,
    ErrorReceived,
    Event,
    MessageReceived,
    Outgoing,
    ReceiptReceived,
)
from sluicemq.client.message import Message, TransactionRef, _Received, transaction_id
from sluicemq.client.producer import ProducerNumbers
from sluicemq.client.ranges import RangeHead, RangeRead, open_range, range_headers
from sluicemq.client.scope import CommitScope
from sluicemq.client.staging import StagedPart, abort_stage, publish_stage
from sluicemq.client.streams import (
    DEFAULT_CHUNK_SIZE,
    DEFAULT_WINDOW,
    StreamSubscription,
    StreamWriter,
)
from sluicemq.client.url import Address, format_address, parse_brokers
from sluicemq.config import DEFAULT_URL
from sluicemq.errors import ClientError, SluiceError

READ_CHUNK = 1 << 20
log = logging.getLogger("sluicemq.client")


class Subscription:
    """Messages of one SUBSCRIBE, queued by the reader thread; iterate or `get()` them."""

    def __init__(self, client: Client, sub_id: str, destination: str) -> None:
        self.client = client
        self.id = sub_id
        self.destination = destination
        self.active = True
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()

    def get(self, timeout: float | None = None) -> Message | None:
        """The next message, or None on timeout or once the subscription has ended.

        Raises ClientError for a broker ERROR no call claimed (once) or a dead connection.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = None if deadline is None else max(deadline - time.monotonic(), 0)
            try:
                item = self._queue.get(timeout=remaining)
            except queue.Empty:
                return None
            message = take(item, self._queue.put, Message)
            if message is None or not self.client._stale(message):
                return message

    def __iter__(self) -> Iterator[Message]:
        while (message := self.get()) is not None:
            yield message

    def unsubscribe(self, durable: bool = False) -> None:
        """Stop deliveries; `durable` also deletes a durable subscription on the broker."""
        if not self.active:
            return
        self.active = False
        try:
            self.client._call(lambda m: m.unsubscribe(self.id, durable=durable))
        finally:
            self.client._forget(self.id)
            self._queue.put(Ended())

    def _deliver(self, item: object) -> None:
        self._queue.put(item)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.active and self.client.is_open:
            self.unsubscribe()


class Transaction(CommitScope):
    """A STOMP transaction: begun on creation, committed on a clean `with` exit, else aborted."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.finished = False

        def begin(m: ClientMachine) -> Outgoing:
            out = m.begin()
            assert out.ident is not None
            client._open_tx.add(out.ident)  # under the state lock, like the failover's view
            return out

        out = client._call(begin)
        assert out.ident is not None
        self.id = out.ident

    def send(self, destination: str, body: bytes | str = b"",
             headers: dict[str, str] | None = None, *, persistent: bool = True,
             receipt: bool = False) -> None:
        """Send inside the transaction; no receipt by default since COMMIT's receipt covers it."""
        self.client.send(destination, body, headers, persistent=persistent, receipt=receipt,
                         transaction=self.id)

    def ack(self, message: Message) -> None:
        message.ack(self.id)

    def nack(self, message: Message) -> None:
        message.nack(self.id)

    def commit(self) -> None:
        """COMMIT; raises TransactionRolledBack if a failover lost the transaction (retry)."""
        self._finish(lambda m: m.commit(self.id), committing=True)

    def abort(self) -> None:
        """ABORT; after a failover there is nothing left to abort, so it just ends."""
        self._finish(lambda m: m.abort(self.id), committing=False)

    def _finish(self, build: Callable[[ClientMachine], Outgoing], *, committing: bool) -> None:
        if self.finished:
            raise ClientError(f"transaction {self.id} already finished")
        self.finished = True
        client = self.client
        if self.id in client._lost_tx:
            client._lost_tx.discard(self.id)
            if committing:
                raise TransactionRolledBack(self.id)
            return

        def finish(m: ClientMachine) -> Outgoing:
            client._open_tx.discard(self.id)
            return build(m)

        try:
            client._call(finish)
        except ClientError as exc:
            if committing and client._brokers.failover is not None and client.is_open \
                    and not exc.headers:
                raise TransactionRolledBack(self.id, " (its COMMIT was in flight: it may "
                                                     "have committed; numbered sends are "
                                                     "dropped if stored)") from exc
            raise


class Client:
    """A blocking STOMP client that connects on construction; safe to share between threads.

    A daemon reader thread routes MESSAGE/RECEIPT/ERROR frames and keeps heart-beats going.
    """

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        login: str | None = None,
        passcode: str | None = None,
        client_id: str | None = None,
        heartbeat: tuple[int, int] = (10_000, 10_000),
        version: str = "1.2",
        timeout: float = 30.0,
        host: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        producer_id: str | None = None,
        producer_seq: int | None = None,
        on_failover: FailoverCallback | None = None,
    ) -> None:
        self._brokers = parse_brokers(url)
        failover = self._brokers.failover
        if failover is not None and producer_id is None:
            # Numbered sends are what make a resend after a failover safe (duplicates dropped).
            producer_id = f"sluice-{uuid.uuid4().hex}"
        self.url = url
        self.timeout = timeout
        # With a producer id every SEND is numbered for the broker's duplicate detection
        # (client/producer.py); producer_seq is the first number (default: clock in µs).
        self.producer = ProducerNumbers(producer_id, producer_seq) if producer_id else None
        self.on_failover = on_failover
        self._ssl_context = ssl_context
        first = self._brokers.addresses[0]
        self._machine = ClientMachine(host=host or first[1], login=login, passcode=passcode,
                                      client_id=client_id, heartbeat=heartbeat, version=version)
        self._host_given = host is not None
        self._state = threading.Lock()
        self._write = threading.Lock()
        self._receipts: dict[str, Future[dict[str, str]]] = {}
        self._receipt_waiters = ReceiptWaiters(self._wake_ranges)
        self._subscriptions: dict[str, Subscription] = {}
        self._failure: ClientError | None = None
        self._closing = False
        self._up = threading.Event()  # cleared while failing over: new frames wait
        self._epoch = 0  # bumped by every failover; messages of older epochs cannot be acked
        self._inflight: dict[str, PendingSend] = {}  # receipt id -> unconfirmed SEND
        self._sub_receipts: dict[str, str] = {}  # receipt id -> subscription id, in flight
        self._open_tx: set[str] = set()
        self._lost_tx: set[str] = set()
        self._closed = threading.Event()  # cuts a failover's back-off short on disconnect
        self._sock, self.connected, self.address = self._connect_first()
        self._up.set()
        self._reader = threading.Thread(target=self._read_loop, name="sluice-client-reader",
                                        daemon=True)
        self._reader.start()

    def _connect_first(self) -> tuple[socket.socket, Connected, str]:
        """Connect to the first broker that answers; a plain URL gets exactly one attempt,
        a failover URL tries every address, backing off, until ``timeout``."""
        options = self._brokers.failover
        deadline = time.monotonic() + self.timeout
        attempt = 0
        while True:
            for address in self._brokers.ordered():
                remaining = deadline - time.monotonic()
                machine = self._machine if attempt == 0 else self._machine.successor()
                try:
                    sock, connected = dial(address, self._with_host(machine, address),
                                           max(remaining, 0.001), self._ssl_context)
                except ClientError as exc:
                    error = exc
                    if options is None:
                        raise
                    attempt += 1
                    self._machine = machine
                    continue
                self._machine = machine
                return sock, connected, format_address(address)
            limit = options.startupMaxReconnectAttempts if options is not None else 0
            if 0 <= limit < attempt or time.monotonic() >= deadline:
                raise error
            time.sleep(min(options.backoff(attempt), max(deadline - time.monotonic(), 0)))

    def _with_host(self, machine: ClientMachine, address: Address) -> ClientMachine:
        """The CONNECT's host header names the broker dialled, unless the caller chose one."""
        if not self._host_given:
            machine.host = address[1]
        return machine

    # ---------------------------------------------------------------- public API

    @property
    def version(self) -> str:
        """The negotiated STOMP version."""
        return self.connected.version

    @property
    def is_open(self) -> bool:
        return self._failure is None and not self._closing

    def send(self, destination: str, body: bytes | str = b"",
             headers: dict[str, str] | None = None, *, persistent: bool = True,
             receipt: bool = True, transaction: TransactionRef | None = None,
             producer_seq: int | None = None) -> Receipt:
        """Send; with `receipt` (the default) returns only once the broker has stored it.

        The returned Receipt tells `producer_seq` (numbered clients) and `duplicate` (the
        broker had stored that number already and dropped this copy)."""
        handle = self.send_async(destination, body, headers, persistent=persistent,
                                 receipt=receipt, transaction=transaction,
                                 producer_seq=producer_seq)
        try:
            handle.result()
        except ClientError as exc:
            if handle.producer_seq is None:
                raise
            raise _numbered(exc, handle.producer_seq) from exc
        return handle

    def send_async(self, destination: str, body: bytes | str = b"",
                   headers: dict[str, str] | None = None, *, persistent: bool = True,
                   receipt: bool = True, transaction: TransactionRef | None = None,
                   producer_seq: int | None = None) -> Receipt:
        """Write the SEND now and return a future of its receipt, to pipeline many sends.

        `producer_seq` resends under an earlier number (needs `producer_id` on the client)."""
        tx = transaction_id(transaction)
        self._check_transaction(tx)
        numbers = self.producer
        if numbers is None and producer_seq is not None:
            raise ValueError("producer_seq needs a client made with producer_id")
        seq: list[int] = []
        track: list[PendingSend] = []

        def build(m: ClientMachine) -> Outgoing:
            extra = dict(headers or {})
            if numbers is not None:  # numbered under the state lock: wire order = number order
                seq.append(numbers.stamp(extra, producer_seq))
            if receipt and tx is None:  # what a failover re-sends if no receipt came
                track.append(PendingSend(destination, body, extra, persistent))
            return m.send(destination, body, extra, persistent=persistent, receipt=receipt,
                          transaction=tx)

        try:
            _, receipt_handle = self._submit(build, track)
        except ClientError as exc:
            if not seq:
                raise
            raise _numbered(exc, seq[0]) from exc
        receipt_handle.producer_seq = seq[0] if seq else None
        return receipt_handle

    def subscribe(self, destination: str, *, ack: str = "auto", prefetch: int | None = None,
                  selector: str | None = None, headers: dict[str, str] | None = None,
                  durable_name: str | None = None, exclusive: bool = False,
                  id: str | None = None) -> Subscription:
        """Subscribe and wait for the receipt, so the subscription is live on return."""
        holder: list[Subscription] = []

        def build(m: ClientMachine) -> Outgoing:
            out = m.subscribe(destination, ack=ack, prefetch=prefetch, selector=selector,
                              headers=headers, durable_name=durable_name, exclusive=exclusive,
                              id=id)
            assert out.ident is not None
            sub = Subscription(self, out.ident, destination)
            self._subscriptions[out.ident] = sub  # registered before any MESSAGE can arrive
            if out.receipt is not None:  # a failover before the receipt replays it
                self._sub_receipts[out.receipt] = out.ident
            holder.append(sub)
            return out

        try:
            self._call(build)
        except ClientError:
            if holder:
                self._forget(holder[0].id)
            raise
        return holder[0]

    def transaction(self) -> Transaction:
        return Transaction(self)

    def stage(self, sink: str, batch: str | int, part: str | int) -> StagedPart:
        """Park a part of a batch (docs/replay-protocol.md, section 3): `with` it and `send`;
        a clean exit commits it, durable and invisible, until `publish_stage`."""
        return StagedPart(self, sink, batch, part)

    def publish_stage(self, sink: str, batch: str | int,
                      parts: list[str] | tuple[str, ...]) -> tuple[str, int]:
        """Make exactly these parts of the batch visible, atomically and once; returns
        ("published" | "duplicate", messages). A part the broker lacks raises ClientError
        and nothing is published."""
        return publish_stage(self, sink, batch, parts)

    def abort_stage(self, sink: str, batch: str | int) -> int:
        """Discard the batch's parked parts; returns how many there were."""
        return abort_stage(self, sink, batch)

    # Range reads, head queries and ledgers: docs/replay-protocol.md, sections 1, 2 and 5.
    # `subscription` (+ `client_id`, default this connection's) names a durable subscription.
    def head(self, destination: str, start: int | None = None, end: int | None = None,
             max_messages: int | None = None, splits: int = 0, ledger: str | None = None,
             subscription: str | None = None, client_id: str | None = None,
             streams: bool = False) -> RangeHead:
        """Where ``destination`` stands: lowest retained seq, head, and the count (and
        ``splits`` cut points) of ``[start, end or head)``; reads no message."""
        headers = range_headers(start=start, end=end, max_messages=max_messages,
                                head_only=True, splits=splits, ledger=ledger,
                                subscription=subscription, client_id=client_id,
                                streams=streams)
        with open_range(self, destination, headers) as reader:
            return reader.result()

    def read_range(self, destination: str, start: int | None = None, end: int | None = None,
                   ledger: str | None = None, subscription: str | None = None,
                   client_id: str | None = None, max_messages: int | None = None,
                   streams: bool = False) -> RangeRead:
        """Iterate the retained messages with seq in ``[start, end)`` in seq order, without
        consuming them; ``.head`` holds the end frame's facts after the last one. An ERROR
        (such as a range a ledger already committed) raises ClientError here."""
        headers = range_headers(start=start, end=end, max_messages=max_messages,
                                ledger=ledger, subscription=subscription, client_id=client_id,
                                streams=streams)
        return open_range(self, destination, headers)

    def commit_upto(self, destination: str, upto: int, ledger: str,
                    subscription: str | None = None, client_id: str | None = None,
                    start: int | None = None, streams: bool = False) -> RangeHead:
        """Remove every retained message below ``upto`` (only ``[start, upto)`` with
        ``start``, and then the ledger stays) as if consumed, and move the ledger to
        ``upto``; returns once both are durable."""
        headers = range_headers(start=start, ledger=ledger, commit_upto=upto,
                                subscription=subscription, client_id=client_id,
                                streams=streams)
        with open_range(self, destination, headers) as reader:
            return reader.result()

    def stream_writer(self, destination: str, name: str = "", *,
                      chunk_size: int = DEFAULT_CHUNK_SIZE, window: int = DEFAULT_WINDOW,
                      headers: Mapping[str, str] | None = None, stream_id: str | None = None,
                      resume: bool = False, wait_for_consumer: float | None = None,
                      ) -> StreamWriter:
        """A writable file whose bytes become one stream; see `StreamWriter`."""
        return StreamWriter(self, destination, name=name, chunk_size=chunk_size, window=window,
                            headers=headers, stream_id=stream_id, resume=resume,
                            wait_for_consumer=wait_for_consumer)

    def streams(self, destination: str, *, window: int = DEFAULT_WINDOW,
                timeout: float | None = None) -> StreamSubscription:
        """Subscribe for streams; iterate the result for one `StreamReader` per stream."""
        return StreamSubscription(self, destination, window=window, timeout=timeout)

    def send_file(self, destination: str, path: str | os.PathLike[str], *,
                  chunk_size: int = DEFAULT_CHUNK_SIZE, window: int = DEFAULT_WINDOW,
                  resume: bool = True, progress: Progress | None = None,
                  headers: Mapping[str, str] | None = None,
                  wait_for_consumer: float | None = None) -> StreamWriter:
        """Send a file as a stream, resuming an interrupted earlier send of the same file."""
        return files.send_file(self, destination, path, chunk_size=chunk_size, window=window,
                               resume=resume, progress=progress, headers=headers,
                               wait_for_consumer=wait_for_consumer)

    def receive_file(self, destination: str, directory: str | os.PathLike[str], *,
                     window: int = DEFAULT_WINDOW, timeout: float | None = None,
                     progress: Progress | None = None) -> Path:
        """Receive the next stream into `directory` (verified, then renamed); its path."""
        return files.receive_file(self, destination, directory, window=window,
                                  timeout=timeout, progress=progress)

    def disconnect(self) -> None:
        """Polite close: DISCONNECT, wait for its receipt, then close the socket."""
        if self._closing:
            return
        self._closed.set()
        try:
            if self._failure is None and self._up.is_set():
                self._closing = True
                self._call(lambda m: m.disconnect())
        except ClientError:
            pass
        finally:
            self._closing = True
            self._close_socket()
            self._end_subscriptions(Ended())

    close = disconnect

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.disconnect()

    # ---------------------------------------------------------------- plumbing

    def _call(self, build: Callable[[ClientMachine], Outgoing]) -> Outgoing:
        """Send a frame and wait for its receipt (if it asked for one)."""
        out, receipt = self._submit(build)
        receipt.result()
        return out

    def _submit(self, build: Callable[[ClientMachine], Outgoing],
                track: list[PendingSend] | None = None) -> tuple[Outgoing, Receipt]:
        """Build a frame under the state lock, register its receipt waiter, then write it.

        Registration precedes the write so the reader can never see a receipt nobody awaits.
        While a failover is under way the call waits for the new connection; a receipted SEND
        that ``track`` describes is kept until confirmed, to be re-sent after a failover.
        """
        future: Future[dict[str, str]] = Future()
        while True:
            self._wait_up()
            with self._write:
                with self._state:
                    if self._failure is not None:
                        raise self._failure
                    if not self._up.is_set():
                        continue  # the connection was lost meanwhile: wait for the next one
                    out = build(self._machine)
                    if out.receipt is not None:
                        self._receipts[out.receipt] = future
                        if track and self._brokers.failover is not None:
                            track[0].future = future
                            self._inflight[out.receipt] = track[0]
                    else:
                        future.set_result({})
                    sock = self._sock
                if out.data:
                    try:
                        sock.sendall(out.data)
                    except OSError as exc:
                        if self._brokers.failover is None:
                            self._fail(ClientError(f"connection lost while sending: {exc}"))
                            raise self._failure from exc  # type: ignore[misc]
                        # The reader fails over; a tracked SEND is re-sent, others fail there.
            return out, Receipt(future, self.timeout, self._receipt_waiters)

    def _wait_up(self) -> None:
        """Wait (up to the client timeout) while a failover is under way."""
        if self._up.is_set() or self._failure is not None:
            return
        if not self._up.wait(self.timeout) and self._failure is None:
            raise ClientError(f"no broker reachable within {self.timeout}s after a failover")

    def _stale(self, message: Message) -> bool:
        """Delivered before a failover on a subscription the broker redelivers after it."""
        return message.epoch != self._epoch and message.ack_mode != "auto"

    def _check_transaction(self, tx: str | None) -> None:
        """A transaction lost to a failover refuses every further use."""
        if tx is not None and tx in self._lost_tx:
            raise TransactionRolledBack(tx)

    def _acknowledge(self, command: str, message: _Received, tx: str | None,
                     receipt: bool = False, *, wait: bool = True) -> Receipt:
        self._check_transaction(tx)
        epoch = getattr(message, "epoch", self._epoch)
        if epoch != self._epoch and message.ack_mode != "auto":
            if receipt:
                raise ClientError(f"message {message.message_id} came before a failover; the "
                                  "broker redelivers it, so this acknowledgement is void")
            done: Future[dict[str, str]] = Future()
            done.set_result({})
            return Receipt(done, self.timeout)
        act = ClientMachine.ack if command == "ACK" else ClientMachine.nack
        _, waiter = self._submit(lambda m: act(m, message.ack_id, message.subscription,
                                               transaction=tx, receipt=receipt))
        if receipt and wait:
            waiter.result()
        return waiter

    def _forget(self, sub_id: str) -> None:
        with self._state:
            self._subscriptions.pop(sub_id, None)

    def _read_loop(self) -> None:
        """Read until the connection ends; with a failover URL, move on to the next broker."""
        while True:
            try:
                self._pump(self._sock)
            except (OSError, SluiceError) as exc:
                error = exc if isinstance(exc, ClientError) else ClientError(str(exc))
                if not self._fail_over(error):
                    self._fail(error)
                    return

    def _fail_over(self, error: ClientError) -> bool:
        """Connect to the next broker that answers and replay onto it: subscriptions, then
        every unconfirmed SEND in its original order. False: no failover URL, closing, or
        ``maxReconnectAttempts`` spent."""
        options = self._brokers.failover
        lost_at = time.monotonic()
        with self._state:
            if options is None or self._closing or self._failure is not None:
                return False
            self._up.clear()
            old = self._machine
            old.connection_lost()
            receipts, self._receipts = self._receipts, {}
            sub_waiters = {self._sub_receipts.pop(r): f for r, f in list(receipts.items())
                           if r in self._sub_receipts}
            lost = [f for r, f in receipts.items()
                    if r not in self._inflight and f not in sub_waiters.values()]
            rolled_back = tuple(sorted(self._open_tx))
            self._lost_tx |= self._open_tx
            self._open_tx.clear()
            old_sock, from_url = self._sock, self.address
        log.warning("connection to %s lost (%s); failing over", from_url, error)
        for future in lost:
            _resolve(future, ClientError(f"connection to {from_url} lost before the broker "
                                         f"confirmed this frame: {error}"))
        with contextlib.suppress(OSError):
            old_sock.close()
        attempts = 0
        while not self._closing:
            for address in self._brokers.ordered():
                machine = self._with_host(old.successor(), address)
                attempts += 1
                try:
                    sock, connected = dial(address, machine, self.timeout, self._ssl_context)
                except ClientError as exc:
                    log.info("failover attempt %d to %s failed: %s", attempts,
                             format_address(address), exc)
                    if 0 <= options.maxReconnectAttempts <= attempts:
                        return False
                    continue
                resent, resubscribed = self._replay(sock, machine, old, sub_waiters)
                self.connected, self.address = connected, format_address(address)
                event = FailoverEvent(from_url, self.address, time.monotonic() - lost_at,
                                      attempts, resent, resubscribed, rolled_back)
                log.warning("failed over from %s to %s in %.3fs (%d attempts, %d sends "
                            "re-sent, %d subscriptions replayed)", from_url, self.address,
                            event.downtime, attempts, resent, resubscribed)
                self._up.set()
                if self.on_failover is not None:
                    self.on_failover(event)
                return True
            self._closed.wait(options.backoff(attempts))
        return False

    def _replay(self, sock: socket.socket, machine: ClientMachine, old: ClientMachine,
                sub_waiters: dict[str, Future[dict[str, str]]]) -> tuple[int, int]:
        """Install the new connection and write the replayed frames before anything new."""
        with self._write:
            with self._state:
                self._sock, self._machine = sock, machine
                self._epoch += 1
                data: list[bytes] = []
                for sub in old.subscriptions.values():
                    out = machine.resubscribe(sub)
                    assert out.receipt is not None
                    self._receipts[out.receipt] = sub_waiters.get(sub.id) or Future()
                    self._sub_receipts[out.receipt] = sub.id
                    data.append(out.data)
                inflight, self._inflight = self._inflight, {}
                for pending in inflight.values():
                    out = machine.send(pending.destination, pending.body, pending.headers,
                                       persistent=pending.persistent)
                    assert out.receipt is not None
                    self._receipts[out.receipt] = pending.future  # type: ignore[assignment]
                    self._inflight[out.receipt] = pending
                    data.append(out.data)
            with contextlib.suppress(OSError):  # if this broker died too, the reader sees it
                sock.sendall(b"".join(data))
        return len(inflight), len(old.subscriptions)

    def _pump(self, sock: socket.socket) -> None:
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        while True:
            wait = self._beat()
            timeout_ms = None if wait is None else max(1, int(wait * 1000) + 1)
            buffered = isinstance(sock, ssl.SSLSocket) and sock.pending()
            if not buffered and not poller.poll(timeout_ms):  # TLS may hold decrypted bytes
                continue
            data = sock.recv(READ_CHUNK)
            if not data:
                raise self._machine.closed_by_peer()
            with self._state:
                events = self._machine.receive_data(data)
                actions = [self._route(event) for event in events]
            for action in actions:
                action()

    def _beat(self, *, check_dead: bool = True) -> float | None:
        """Send a heart-beat if one is due (skipped while another thread writes, which proves
        liveness anyway); returns seconds until the next check. ``check_dead=False`` while the
        reader thread waits for a slow range reader and so cannot judge the broker's silence."""
        with self._state:
            check = self._machine.heartbeat()
        if check.dead and check_dead and not self._unread():
            raise ClientError("broker stopped sending heart-beats; connection is dead")
        if check.data and self._write.acquire(blocking=False):
            try:
                self._sock.sendall(check.data)
            finally:
                self._write.release()
        return check.wait

    def _wake_ranges(self) -> None:
        """A thread waits for a receipt: range readers stop holding up the reader thread."""
        for sub in list(self._subscriptions.values()):
            wake = getattr(sub, "wake", None)
            if wake is not None:
                wake()

    def _unread(self) -> bool:
        """Bytes wait in the socket: the broker was not silent, we were busy (a range read
        that made the reader wait for its caller)."""
        if isinstance(self._sock, ssl.SSLSocket) and self._sock.pending():
            return True
        try:
            return bool(select.select([self._sock], [], [], 0)[0])
        except (OSError, ValueError):
            return False

    def _route(self, event: Event) -> Callable[[], None]:
        """Decide under the state lock what an event means; the returned action runs outside
        it, because resolving a future may run user callbacks that call back into us."""
        if isinstance(event, MessageReceived):
            sub = self._subscriptions.get(event.subscription)
            if sub is None:
                return _nothing
            message = Message(event.frame, event.subscription, event.ack_id, event.ack_mode,
                              self._acknowledge, self._epoch)
            return lambda: sub._deliver(message)
        if isinstance(event, ReceiptReceived):
            self._inflight.pop(event.receipt_id, None)
            self._sub_receipts.pop(event.receipt_id, None)
            future = self._receipts.pop(event.receipt_id, None)
            headers = event.headers
            return _nothing if future is None else lambda: _resolve(future, headers)
        if isinstance(event, ErrorReceived):
            error = event.error
            if event.receipt_id is not None:
                self._inflight.pop(event.receipt_id, None)
                sub_id = self._sub_receipts.pop(event.receipt_id, None)
                future = self._receipts.pop(event.receipt_id, None)
                if future is None and sub_id in self._subscriptions:  # a replayed SUBSCRIBE
                    sub = self._subscriptions[sub_id]
                    return lambda: sub._deliver(error)
                if future is not None:
                    return lambda: _resolve(future, error)
            subs = list(self._subscriptions.values())

            def tell_subscribers() -> None:
                for sub in subs:
                    sub._deliver(error)

            return tell_subscribers
        return _nothing  # CONNECTED is read by dial() before this thread starts

    def _fail(self, error: ClientError) -> None:
        """The connection is over: every waiter and every subscription learns why."""
        with self._state:
            if self._failure is not None:
                return
            clean = self._closing
            self._failure = error if not clean else ClientError("client disconnected")
            self._machine.connection_lost()
            waiters = list(self._receipts.values())
            self._receipts.clear()
            self._inflight.clear()
            self._up.set()  # wake callers waiting for a failover: they see the failure
        for future in waiters:
            _resolve(future, self._failure)
        self._end_subscriptions(Ended(None if clean else error))
        self._close_socket()

    def _end_subscriptions(self, item: Ended) -> None:
        with self._state:
            subs = list(self._subscriptions.values())
            self._subscriptions.clear()
        for sub in subs:
            sub.active = False
            sub._deliver(item)

    def _close_socket(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._sock.close()


class Receipt:
    """Handle of a frame in flight; `result()` waits for its receipt (client timeout by default)
    and raises ClientError if the broker refused it or the connection died first."""

    def __init__(self, future: Future[dict[str, str]], timeout: float,
                 waiters: ReceiptWaiters | None = None) -> None:
        self._future = future
        self._timeout = timeout
        self._waiters = waiters
        self.producer_seq: int | None = None  # the number a numbered SEND went out with

    @property
    def duplicate(self) -> bool:
        """The broker had this producer number stored already and dropped this copy."""
        return self.result().get("sluice-duplicate") == "true"

    def done(self) -> bool:
        return self._future.done()

    def when_confirmed(self, callback: Callable[[], None]) -> None:
        """Call back (on the reader thread, or now) once the broker confirmed; never on error."""
        def check(future: Future[dict[str, str]]) -> None:
            if not future.cancelled() and future.exception() is None:
                callback()

        self._future.add_done_callback(check)

    def result(self, timeout: float | None = None) -> dict[str, str]:
        """The RECEIPT's headers (empty when the frame asked for no receipt)."""
        waiters = self._waiters if not self._future.done() else None
        if waiters is not None:
            waiters.enter()
        try:
            return self._future.result(self._timeout if timeout is None else timeout)
        except FutureTimeout:
            raise ClientError("no receipt from the broker in time") from None
        finally:
            if waiters is not None:
                waiters.leave()

    wait = result


class ReceiptWaiters:
    """How many threads wait for a receipt. While any does, the reader thread must keep
    reading (its receipt may sit behind range-read messages), so range readers do not make
    it wait for their callers."""

    def __init__(self, on_enter: Callable[[], None]) -> None:
        self._lock = threading.Lock()
        self._on_enter = on_enter
        self.count = 0

    def enter(self) -> None:
        with self._lock:
            self.count += 1
        self._on_enter()

    def leave(self) -> None:
        with self._lock:
            self.count -= 1


def _nothing() -> None:
    return None


def _numbered(exc: ClientError, producer_seq: int) -> ClientError:
    """A copy of ``exc`` that tells which number the failed SEND had (to resend under it)."""
    failed = ClientError(str(exc), exc.headers, exc.body)
    failed.producer_seq = producer_seq  # type: ignore[attr-defined]
    return failed


def _resolve(future: Future, outcome: object) -> None:
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
