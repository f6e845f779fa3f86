"""The blocking client's connection: a socket, a reader thread, the shared `ClientMachine` and
the shared `Tracker`.

Two locks keep it thread-safe without deadlocks under back-pressure: `_state` guards the
machine and the tracker and is only ever held briefly; `_write` serialises whole frames onto
the socket. The reader thread never waits for `_write` (heart-beats are skipped while another
thread is writing, which already proves liveness), so a producer blocked on a full socket can
never stop us from reading what the broker sends.

With a `failover:(...)` URL a lost connection is not the end: the reader thread connects to
the next broker and replays onto it (client/sync_failover.py) while new calls wait for it.
`Client` (client/sync.py) adds streams, files, range reads and staging on top.
"""

from __future__ import annotations

import contextlib
import select
import socket
import ssl
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import Future

from sluicemq.buffers import BufferPool
from sluicemq.client.failover import FailoverCallback, PendingSend, reader_stopped, resolve
from sluicemq.client.inbox import Ended, Receiver
from sluicemq.client.machine import (
    ClientMachine,
    ErrorReceived,
    Event,
    MessageReceived,
    Outgoing,
    ReceiptReceived,
)
from sluicemq.client.message import Message, TransactionRef, _Received, transaction_id
from sluicemq.client.producer import ProducerNumbers, numbered
from sluicemq.client.sync_failover import SyncFailover
from sluicemq.client.sync_handles import (
    Receipt,
    ReceiptWaiters,
    Subscription,
    Transaction,
    _nothing,
)
from sluicemq.client.tracker import FrameTags, Tracker
from sluicemq.client.url import parse_brokers
from sluicemq.config import DEFAULT_URL
from sluicemq.errors import ClientError, SluiceError

READ_CHUNK = 1 << 20
# Kept body buffers of a reuse_buffers connection: a range read's queue (ranges.MAX_BYTES,
# four 4 MiB batches), the batch in the caller's hands and the one arriving, with room.
BODIES_KEPT = 8
Waiter = Future[dict[str, str]]


class Connection(SyncFailover):
    """A blocking STOMP connection that connects on construction; safe to share between
    threads. A daemon reader thread routes MESSAGE/RECEIPT/ERROR frames and keeps heart-beats
    going."""

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
        reuse_buffers: bool | BufferPool = False,
    ) -> None:
        self._brokers = parse_brokers(url)
        failover = self._brokers.failover is not None
        if failover and producer_id is None:
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
        # reuse_buffers: the socket is read into one kept buffer and large bodies (>= 64 KiB)
        # arrive as memoryviews of a few kept buffers, each written again only once nothing
        # views it (sluicemq/buffers.py) - no page faults per multi-MiB frame. For readers of
        # column batches (sluicemq.spark); other callers get bytes bodies. A BufferPool given
        # here is shared with the caller's other connections (a Spark worker's tasks).
        self._inbuf = memoryview(bytearray(READ_CHUNK)) if reuse_buffers else None
        pool = (reuse_buffers if isinstance(reuse_buffers, BufferPool)
                else BufferPool(keep=BODIES_KEPT, largest=64 << 20) if reuse_buffers else None)
        machine = ClientMachine(host=host or first[1], login=login, passcode=passcode,
                                client_id=client_id, heartbeat=heartbeat, version=version,
                                body_buffers=pool.take if pool else None)
        self._track: Tracker[Waiter] = Tracker(machine, failover)
        self._host_given = host is not None
        self._state = threading.Lock()
        self._write = threading.Lock()
        self._receipt_waiters = ReceiptWaiters(self._wake_ranges)
        self._subscriptions: dict[str, Receiver] = {}
        self._failure: ClientError | None = None
        self._closing = False
        self._up = threading.Event()  # cleared while failing over: new frames wait
        self._closed = threading.Event()  # cuts a failover's back-off short on disconnect
        self._sock, self.connected, self.address = self._connect_first()
        self._up.set()
        self._reader = threading.Thread(target=self._read_loop, name="sluice-client-reader",
                                        daemon=True)
        self._reader.start()

    # ---------------------------------------------------------------- public API

    @property
    def version(self) -> str:
        """The negotiated STOMP version."""
        return self.connected.version

    @property
    def is_open(self) -> bool:
        return self._failure is None and not self._closing

    @property
    def _machine(self) -> ClientMachine:
        return self._track.machine

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
            raise numbered(exc, handle.producer_seq) from exc
        return handle

    def send_async(self, destination: str, body: bytes | str = b"",
                   headers: dict[str, str] | None = None, *, persistent: bool = True,
                   receipt: bool = True, transaction: TransactionRef | None = None,
                   producer_seq: int | None = None) -> Receipt:
        """Write the SEND now and return a future of its receipt, to pipeline many sends.

        `producer_seq` resends under an earlier number (needs `producer_id` on the client)."""
        tx = transaction_id(transaction)
        self._track.check_transaction(tx)
        numbers = self.producer
        if numbers is None and producer_seq is not None:
            raise ValueError("producer_seq needs a client made with producer_id")
        seq: list[int] = []
        tags: FrameTags[Waiter] = FrameTags()

        def build(m: ClientMachine) -> Outgoing:
            extra = dict(headers or {})
            if numbers is not None:  # numbered under the state lock: wire order = number order
                seq.append(numbers.stamp(extra, producer_seq))
            if receipt and tx is None:  # what a failover re-sends if no receipt came
                tags.pending = PendingSend(destination, body, extra, persistent)
            return m.send(destination, body, extra, persistent=persistent, receipt=receipt,
                          transaction=tx)

        try:
            _, receipt_handle = self._submit(build, tags)
        except ClientError as exc:
            if not seq:
                raise
            raise numbered(exc, seq[0]) from exc
        receipt_handle.producer_seq = seq[0] if seq else None
        return receipt_handle

    def subscribe(self, destination: str, *, ack: str = "auto", prefetch: int | None = None,
                  selector: str | None = None, headers: dict[str, str] | None = None,
                  durable_name: str | None = None, exclusive: bool = False,
                  id: str | None = None) -> Subscription:
        """Subscribe and wait for the receipt, so the subscription is live on return."""
        holder: list[Subscription] = []
        tags: FrameTags[Waiter] = FrameTags()

        def build(m: ClientMachine) -> Outgoing:
            out = m.subscribe(destination, ack=ack, prefetch=prefetch, selector=selector,
                              headers=headers, durable_name=durable_name, exclusive=exclusive,
                              id=id)
            assert out.ident is not None
            sub = Subscription(self, out.ident, destination)
            self._subscriptions[out.ident] = sub  # registered before any MESSAGE can arrive
            tags.subscription = out.ident  # a failover before the receipt replays it
            holder.append(sub)
            return out

        try:
            self._call(build, tags)
        except ClientError:
            if holder:
                self._forget(holder[0].id)
            raise
        return holder[0]

    def transaction(self) -> Transaction:
        return Transaction(self)

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

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.disconnect()

    # ---------------------------------------------------------------- plumbing

    def _call(self, build: Callable[[ClientMachine], Outgoing],
              tags: FrameTags[Waiter] | None = None) -> Outgoing:
        """Send a frame and wait for its receipt (if it asked for one)."""
        out, receipt = self._submit(build, tags)
        receipt.result()
        return out

    def _submit(self, build: Callable[[ClientMachine], Outgoing],
                tags: FrameTags[Waiter] | None = None) -> tuple[Outgoing, Receipt]:
        """Build a frame under the state lock, register its receipt waiter, then write it.

        Registration precedes the write so the reader can never see a receipt nobody awaits.
        While a failover is under way the call waits for the new connection; ``tags`` (filled
        by ``build``) say what the tracker keeps of the frame for a failover.
        """
        future: Waiter = Future()
        while True:
            self._wait_up()
            with self._write:
                with self._state:
                    if self._failure is not None:
                        raise self._failure
                    if not self._up.is_set():
                        continue  # the connection was lost meanwhile: wait for the next one
                    out = build(self._track.machine)
                    if not self._track.sent(out, future, tags):
                        future.set_result({})
                    sock = self._sock
                if out.data:
                    try:
                        sock.sendall(out.data)
                    except OSError as exc:
                        if not self._track.failover:
                            raise self._fail(ClientError(
                                f"connection lost while sending: {exc}")) from exc
                        # The reader fails over; a tracked SEND is re-sent, others fail there.
            return out, Receipt(future, self.timeout, self._receipt_waiters)

    def _wait_up(self) -> None:
        """Wait (up to the client timeout) while a failover is under way."""
        if self._up.is_set() or self._failure is not None:
            return
        if not self._up.wait(self.timeout) and self._failure is None:
            raise ClientError(f"no broker reachable within {self.timeout}s after a failover")

    def _acknowledge(self, command: str, message: _Received, tx: str | None,
                     receipt: bool = False, *, wait: bool = True) -> Receipt:
        self._track.check_transaction(tx)
        epoch = getattr(message, "epoch", self._track.epoch)
        act = ClientMachine.ack if command == "ACK" else ClientMachine.nack
        tags: FrameTags[Waiter] = FrameTags(acked=(message.subscription, message.message_id)
                                            if command == "ACK" else None)

        def build(m: ClientMachine) -> Outgoing:
            # Decided when the frame is built (under the state lock): a failover may have
            # happened while this call waited, and the new broker would take the old
            # connection's ack id for one of its own deliveries.
            if not self._track.acknowledging(command, message.subscription,
                                             message.message_id, message.ack_mode, epoch,
                                             receipt):
                return Outgoing(b"")
            return act(m, message.ack_id, message.subscription, transaction=tx,
                       receipt=receipt)

        if self._track.stale(epoch, message.ack_mode):  # decided now: no need to wait for up
            with self._state:  # an ACK is remembered; AckInDoubt if a receipt was asked for
                self._track.acknowledging(command, message.subscription, message.message_id,
                                          message.ack_mode, epoch, receipt)
            done: Waiter = Future()
            done.set_result({})
            return Receipt(done, self.timeout)
        _, waiter = self._submit(build, tags)
        if receipt and wait:
            waiter.result()
        return waiter

    def _ack_again(self, message: Message) -> None:
        """A redelivery of a message the caller acknowledged before the failover. Written at
        once if the write lock is free (so it precedes what the caller does next), else on a
        helper thread: the reader thread must never wait for the write lock."""
        if not self._write.acquire(blocking=False):
            threading.Thread(target=self._acknowledge, args=("ACK", message, None),
                             name="sluice-client-ack", daemon=True).start()
            return
        try:
            with self._state:
                if not self._track.acknowledging("ACK", message.subscription,
                                                 message.message_id, message.ack_mode,
                                                 message.epoch, False):
                    return
                out = self._track.machine.ack(message.ack_id, message.subscription)
                sock = self._sock
            with contextlib.suppress(OSError):  # a lost connection: the reader sees it
                sock.sendall(out.data)
        finally:
            self._write.release()

    def _forget(self, sub_id: str) -> None:
        with self._state:
            self._subscriptions.pop(sub_id, None)
            self._track.unsubscribed(sub_id)

    def _end_range(self, sub_id: str, error: ClientError) -> None:
        """A range read cut by a failover ends with ``error`` (its caller reads again)."""
        with self._state:
            sub = self._subscriptions.pop(sub_id, None)
        if sub is not None:
            sub.active = False
            sub._deliver(Ended(error))

    def _read_loop(self) -> None:
        """Read until the connection ends; with a failover URL, move on to the next broker.
        The socket is closed here, as the thread ends (see ``_close_socket``)."""
        try:
            while True:
                try:
                    self._pump(self._sock)
                except (OSError, SluiceError) as exc:
                    error = exc if isinstance(exc, ClientError) else ClientError(str(exc))
                    if not self._fail_over(error):
                        self._fail(error)
                        return
        except Exception as exc:  # nobody would read a receipt again: end the client now
            self._fail(reader_stopped(exc))
        finally:
            with contextlib.suppress(OSError):
                self._sock.close()

    def _pump(self, sock: socket.socket) -> None:
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        while True:
            wait = self._beat()
            timeout_ms = None if wait is None else max(1, int(wait * 1000) + 1)
            buffered = isinstance(sock, ssl.SSLSocket) and sock.pending()
            if not buffered and not poller.poll(timeout_ms):  # TLS may hold decrypted bytes
                continue
            inbuf = self._inbuf
            if inbuf is None:
                data: bytes | memoryview = sock.recv(READ_CHUNK)
            else:  # fed to the parser, which copies what it keeps before the next read
                data = inbuf[:sock.recv_into(inbuf)]
            if not data:
                raise self._track.machine.closed_by_peer()
            with self._state:
                events = self._track.machine.receive_data(data)
                actions = [self._route(event) for event in events]
            for action in actions:
                action()

    def _beat(self, *, check_dead: bool = True) -> float | None:
        """Send a heart-beat if one is due (skipped while another thread writes, which proves
        liveness anyway); returns seconds until the next check. ``check_dead=False`` while the
        reader thread waits for a slow range reader and so cannot judge the broker's silence."""
        with self._state:
            check = self._track.machine.heartbeat()
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
            found = self._subscriptions.get(event.subscription)
            if found is None:
                return _nothing
            deliver = self._track.message(event)
            message = Message(event.frame, event.subscription, event.ack_id, event.ack_mode,
                              self._acknowledge, self._track.epoch)
            if not deliver:  # acknowledged by the caller before the failover
                return lambda: self._ack_again(message)
            return lambda: found._deliver(message)
        if isinstance(event, ReceiptReceived):
            future = self._track.receipt(event.receipt_id)
            headers = event.headers
            return _nothing if future is None else lambda: resolve(future, headers)
        if isinstance(event, ErrorReceived):
            error = event.error
            if event.receipt_id is not None:
                future, sub_id = self._track.refused(event.receipt_id)
                if future is not None:
                    return lambda: resolve(future, error)
                if sub_id in self._subscriptions:  # a replayed SUBSCRIBE was refused
                    sub = self._subscriptions[sub_id]
                    return lambda: sub._deliver(error)
            subs = list(self._subscriptions.values())

            def tell_subscribers() -> None:
                for sub in subs:
                    sub._deliver(error)

            return tell_subscribers
        return _nothing  # CONNECTED is read by dial() before this thread starts

    def _fail(self, error: ClientError) -> ClientError:
        """The connection is over: every waiter and every subscription learns why. Returns
        the reason that stands (the first one given)."""
        with self._state:
            if self._failure is not None:
                return self._failure
            clean = self._closing
            failure = self._failure = error if not clean else ClientError("client disconnected")
            waiters = self._track.fail()  # unconfirmed SENDs kept for a failover fail too
            self._up.set()  # wake callers waiting for a failover: they see the failure
        for future in waiters:
            resolve(future, failure)
        self._end_subscriptions(Ended(None if clean else error))
        self._close_socket()
        return failure

    def _end_subscriptions(self, item: Ended) -> None:
        with self._state:
            subs = list(self._subscriptions.values())
            self._subscriptions.clear()
        for sub in subs:
            sub.active = False
            sub._deliver(item)

    def _close_socket(self) -> None:
        """End the connection now (the broker sees it go); close the descriptor only where
        the reader thread cannot be about to poll it - on that thread, or once it ended.

        Why: the reader polls a descriptor *number*. Closed under it from another thread,
        the number goes to the next socket the process opens, and a poll that starts late
        holds that socket open in the kernel after its owner closed it - the broker never
        learns that the other connection ended. The shutdown wakes the reader, which
        closes the socket as it ends."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        reader = getattr(self, "_reader", None)
        if reader is None or reader is threading.current_thread() or not reader.is_alive():
            with contextlib.suppress(OSError):
                self._sock.close()
