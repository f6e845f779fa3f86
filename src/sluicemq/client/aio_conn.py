"""The asyncio client's connection: the shared `ClientMachine` and `Tracker` driven by a reader
task and a heart-beat task.

Frames are built and written in one synchronous step, so their order on the wire is the
order of the calls and a receipt waiter always exists before its frame leaves; `drain()`
afterwards applies the socket's back-pressure to producers. With a ``failover:(...)`` URL a
lost connection moves to the next broker (client/aio_failover.py). `AsyncClient`
(client/aio.py) adds range reads, streams and files on top.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import uuid
from collections.abc import Callable
from typing import Self

from sluicemq.client.aio_failover import READ_CHUNK, AsyncFailover, connect_first
from sluicemq.client.aio_handles import AsyncReceipt, AsyncSubscription, AsyncTransaction
from sluicemq.client.failover import FailoverCallback, PendingSend, reader_stopped, resolve
from sluicemq.client.inbox import AsyncReceiver, Ended
from sluicemq.client.machine import (
    ClientMachine,
    Connected,
    ErrorReceived,
    Event,
    MessageReceived,
    Outgoing,
    ReceiptReceived,
)
from sluicemq.client.message import AsyncMessage, TransactionRef, _Received, transaction_id
from sluicemq.client.producer import ProducerNumbers, numbered
from sluicemq.client.tracker import FrameTags, Tracker
from sluicemq.client.url import BrokerList, parse_brokers
from sluicemq.config import DEFAULT_URL
from sluicemq.errors import ClientError, SluiceError

Waiter = asyncio.Future[dict[str, str]]


class AsyncConnection(AsyncFailover):
    """An asyncio STOMP connection; create it with `await <class>.connect(url, ...)`."""

    connected: Connected  # the broker's CONNECTED, set once the handshake is done

    def __init__(self, machine: ClientMachine, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter, timeout: float, *,
                 brokers: BrokerList | None = None, address: str = "",
                 producer: ProducerNumbers | None = None,
                 on_failover: FailoverCallback | None = None,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self.timeout = timeout
        self._brokers = brokers or BrokerList(())
        self._track: Tracker[Waiter] = Tracker(machine, self._brokers.failover is not None)
        self._reader = reader
        self._writer = writer
        self.address = address  # the broker this connection is to
        self.producer = producer
        self.on_failover = on_failover
        self._ssl_context = ssl_context
        self._subscriptions: dict[str, AsyncReceiver] = {}
        self._up = asyncio.Event()  # cleared while failing over: new frames wait
        self._up.set()
        self._failure: ClientError | None = None
        self._host_given = False  # the CONNECT host header follows the broker dialled
        self._closing = False
        self._tasks: list[asyncio.Task[None]] = []
        self._settling = 0  # tasks waiting for a receipt: the socket must then be read
        self._room = asyncio.Event()  # a range reader took messages (or someone settles)
        self._paused = False  # not reading: a range caller is behind (aio_ranges.py)

    @classmethod
    async def connect(
        cls,
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
    ) -> Self:
        """Open the socket (TLS for stomps://), exchange CONNECT/CONNECTED, return the client.

        A ``failover:(...)`` URL tries each broker (backing off, until ``timeout``) and keeps
        doing so whenever the connection is lost (see the README's High availability)."""
        brokers = parse_brokers(url)
        if brokers.failover is not None and producer_id is None:
            producer_id = f"sluice-{uuid.uuid4().hex}"  # what makes re-sending safe
        producer = ProducerNumbers(producer_id, producer_seq) if producer_id else None
        first = brokers.addresses[0]
        machine = ClientMachine(host=host or first[1], login=login, passcode=passcode,
                                client_id=client_id, heartbeat=heartbeat, version=version)
        machine, reader, writer, connected, address = await connect_first(
            brokers, machine, timeout, host is not None, ssl_context)
        client = cls(machine, reader, writer, timeout, brokers=brokers, address=address,
                     producer=producer, on_failover=on_failover, ssl_context=ssl_context)
        client._host_given = host is not None
        client.connected = connected
        client._tasks.append(asyncio.create_task(client._read_loop()))
        client._tasks.append(asyncio.create_task(client._heartbeat_loop()))
        return client

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

    async def send(self, destination: str, body: bytes | str = b"",
                   headers: dict[str, str] | None = None, *, persistent: bool = True,
                   receipt: bool = True, transaction: TransactionRef | None = None,
                   producer_seq: int | None = None) -> AsyncReceipt:
        """Send; with `receipt` (the default) returns only once the broker has stored it.

        The returned AsyncReceipt tells `producer_seq` (numbered clients) and `duplicate` (the
        broker had stored that number already and dropped this copy); a failed numbered SEND
        raises a ClientError whose `producer_seq` is the number to resend under."""
        await self._wait_up()
        handle = self.send_async(destination, body, headers, persistent=persistent,
                                 receipt=receipt, transaction=transaction,
                                 producer_seq=producer_seq)
        try:
            await self._settle(handle)
        except ClientError as exc:
            if handle.producer_seq is None:
                raise
            raise numbered(exc, handle.producer_seq) from exc
        return handle

    def send_async(self, destination: str, body: bytes | str = b"",
                   headers: dict[str, str] | None = None, *, persistent: bool = True,
                   receipt: bool = True, transaction: TransactionRef | None = None,
                   producer_seq: int | None = None) -> AsyncReceipt:
        """Write the SEND now and return a future of its receipt, to pipeline many sends.

        Nothing waits for the socket to drain here; await `drain()` now and then when
        producing large volumes so memory stays bounded. `producer_seq` resends under an
        earlier number (needs `producer_id` on the client).
        """
        tx = transaction_id(transaction)
        self._track.check_transaction(tx)
        if self.producer is None and producer_seq is not None:
            raise ValueError("producer_seq needs a client made with producer_id")
        handle = AsyncReceipt(loop=asyncio.get_running_loop())
        extra = dict(headers or {})
        if self.producer is not None:
            handle.producer_seq = self.producer.stamp(extra, producer_seq)
        pending = PendingSend[Waiter](destination, body, extra, persistent) \
            if receipt and tx is None else None
        if pending is not None and self._track.failover and not self._up.is_set():
            self._track.hold(pending, handle)  # failing over: goes out with the replay
            return handle
        self._submit(lambda m: m.send(destination, body, extra, persistent=persistent,
                                      receipt=receipt, transaction=tx),
                     FrameTags(pending), handle)
        return handle

    async def drain(self) -> None:
        """Wait until the socket buffer has room again."""
        if not self._up.is_set():
            return  # failing over: what is queued goes out on the new connection
        try:
            await self._writer.drain()
        except OSError as exc:
            if not self._track.failover:
                raise self._fail(ClientError(f"connection lost while sending: {exc}")) from exc

    async def subscribe(self, destination: str, *, ack: str = "auto",
                        prefetch: int | None = None, selector: str | None = None,
                        headers: dict[str, str] | None = None, durable_name: str | None = None,
                        exclusive: bool = False, id: str | None = None) -> AsyncSubscription:
        """Subscribe and wait for the receipt, so the subscription is live on return."""
        await self._wait_up()
        tags: FrameTags[Waiter] = FrameTags()

        def build(m: ClientMachine) -> Outgoing:
            out = m.subscribe(destination, ack=ack, prefetch=prefetch, selector=selector,
                              headers=headers, durable_name=durable_name,
                              exclusive=exclusive, id=id)
            tags.subscription = out.ident  # a failover before the receipt replays it
            return out

        out, future = self._submit(build, tags)
        assert out.ident is not None
        sub = AsyncSubscription(self, out.ident, destination)
        self._subscriptions[out.ident] = sub  # before the reader can run: no MESSAGE is lost
        try:
            await self._settle(future)
        except ClientError:
            self._forget(out.ident)
            raise
        return sub

    def transaction(self) -> AsyncTransaction:
        return AsyncTransaction(self)

    async def disconnect(self) -> None:
        """Polite close: DISCONNECT, wait for its receipt, then close the socket."""
        if self._closing:
            return
        self._closing = True
        try:
            if self._failure is None and self._up.is_set():
                await self._call(lambda m: m.disconnect())
        except ClientError:
            pass
        finally:
            self._fail(ClientError("client disconnected"))
            for task in self._tasks:
                task.cancel()
            with contextlib.suppress(OSError, asyncio.CancelledError):
                await self._writer.wait_closed()

    close = disconnect

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.disconnect()

    # ---------------------------------------------------------------- plumbing

    def _submit(self, build: Callable[[ClientMachine], Outgoing],
                tags: FrameTags[Waiter] | None = None,
                future: Waiter | None = None) -> tuple[Outgoing, Waiter]:
        """Build and write a frame; ``future`` (default: a new one) waits for its receipt."""
        if self._failure is not None:
            raise self._failure
        out = build(self._track.machine)
        if future is None:
            future = asyncio.get_running_loop().create_future()
        if not self._track.sent(out, future, tags):
            future.set_result({})
        if out.data:
            self._writer.write(out.data)
        return out, future

    async def _call(self, build: Callable[[ClientMachine], Outgoing]) -> Outgoing:
        await self._wait_up()
        out, future = self._submit(build)
        await self._settle(future)
        return out

    async def _ask(self, build: Callable[[ClientMachine], Outgoing]) -> dict[str, str]:
        """Send a frame and return its RECEIPT's headers (where answers such as a
        publication's result travel)."""
        await self._wait_up()
        _, future = self._submit(build)
        return await self._settle(future)

    async def _settle(self, future: Waiter, timeout: float | None = None) -> dict[str, str]:
        """Wait for a receipt (client timeout by default); returns the RECEIPT's headers."""
        await self.drain()
        self._settling += 1
        self._room.set()
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout or self.timeout)
        except TimeoutError:
            raise ClientError("no receipt from the broker in time") from None
        finally:
            self._settling -= 1

    async def _acknowledge(self, command: str, message: _Received, tx: str | None,
                           receipt: bool = False) -> None:
        self._track.check_transaction(tx)
        epoch = getattr(message, "epoch", self._track.epoch)
        args = (command, message.subscription, message.message_id, message.ack_mode, epoch,
                receipt)
        if self._track.stale(epoch, message.ack_mode):  # decided now: no need to wait for up
            self._track.acknowledging(*args)  # an ACK is remembered; AckInDoubt if receipt
            return
        await self._wait_up()
        if not self._track.acknowledging(*args):  # a failover happened while we waited
            return
        act = ClientMachine.ack if command == "ACK" else ClientMachine.nack
        tags: FrameTags[Waiter] = FrameTags(acked=(message.subscription, message.message_id)
                                            if command == "ACK" else None)
        _, future = self._submit(lambda m: act(m, message.ack_id, message.subscription,
                                               transaction=tx, receipt=receipt), tags)
        if receipt:
            await self._settle(future)
        else:
            await self.drain()

    def _forget(self, sub_id: str) -> None:
        self._subscriptions.pop(sub_id, None)
        self._track.unsubscribed(sub_id)

    def _end_range(self, sub_id: str, error: ClientError) -> None:
        """A range read cut by a failover ends with ``error`` (its caller reads again)."""
        sub = self._subscriptions.pop(sub_id, None)
        if sub is not None:
            sub.active = False
            sub._queue.put_nowait(Ended(error))

    async def _read_loop(self) -> None:
        try:
            await self._read_on()
        except Exception as exc:  # nobody would read a receipt again: end the client now
            self._fail(reader_stopped(exc))

    async def _read_on(self) -> None:
        while True:
            try:
                while True:
                    await self._ranges_caught_up()
                    data = await self._reader.read(READ_CHUNK)
                    if not data:
                        raise self._track.machine.closed_by_peer()
                    for event in self._track.machine.receive_data(data):
                        self._route(event)
            except (OSError, SluiceError) as exc:
                error = exc if isinstance(exc, ClientError) else ClientError(str(exc))
                if not await self._fail_over(error):
                    self._fail(error)
                    return

    async def _heartbeat_loop(self) -> None:
        while self._failure is None:
            check = self._track.machine.heartbeat()
            if check.dead and not self._paused:  # not reading: its silence proves nothing
                self._fail(ClientError("broker stopped sending heart-beats; connection is dead"))
                return
            if check.data:
                self._writer.write(check.data)
            if check.wait is None:
                return
            await asyncio.sleep(check.wait)

    async def _ranges_caught_up(self) -> None:
        """Hold the socket while a range reader's caller is behind and no receipt is awaited."""
        while self._settling == 0 and any(getattr(s, "full", False)
                                          for s in self._subscriptions.values()):
            self._paused = True
            self._room.clear()
            await self._room.wait()
        self._paused = False

    async def _wait_up(self) -> None:
        """Wait (up to the client timeout) while a failover is under way."""
        if self._up.is_set():
            return
        try:
            await asyncio.wait_for(self._up.wait(), self.timeout)
        except TimeoutError:
            raise ClientError(f"no broker reachable within {self.timeout}s after a failover") \
                from None

    def _room_for_ranges(self) -> None:
        self._room.set()

    def _route(self, event: Event) -> None:
        if isinstance(event, MessageReceived):
            sub = self._subscriptions.get(event.subscription)
            if sub is None:
                return
            deliver = self._track.message(event)
            message = AsyncMessage(event.frame, event.subscription, event.ack_id,
                                   event.ack_mode, self._acknowledge, self._track.epoch)
            if deliver:
                sub._queue.put_nowait(message)
            else:  # acknowledged by the caller before the failover
                self._tasks.append(asyncio.get_running_loop().create_task(
                    self._acknowledge("ACK", message, None)))
        elif isinstance(event, ReceiptReceived):
            resolve(self._track.receipt(event.receipt_id), event.headers)
        elif isinstance(event, ErrorReceived):
            future, sub_id = self._track.refused(event.receipt_id) \
                if event.receipt_id is not None else (None, None)
            if future is not None:
                resolve(future, event.error)
            elif sub_id in self._subscriptions:  # a replayed SUBSCRIBE was refused
                self._subscriptions[sub_id]._queue.put_nowait(event.error)
            else:
                for sub in self._subscriptions.values():
                    sub._queue.put_nowait(event.error)

    def _fail(self, error: ClientError) -> ClientError:
        """The connection is over: every waiter and every subscription learns why. Returns
        the reason that stands (the first one given)."""
        if self._failure is not None:
            return self._failure
        clean = self._closing
        failure = self._failure = ClientError("client disconnected") if clean else error
        for future in self._track.fail():  # unconfirmed SENDs kept for a failover fail too
            resolve(future, failure)
        self._up.set()  # callers waiting for a failover see the failure
        for sub in self._subscriptions.values():
            sub.active = False
            sub._queue.put_nowait(Ended(None if clean else error))
        self._subscriptions.clear()
        self._writer.close()
        current = asyncio.current_task()
        for task in self._tasks:
            if task is not current:
                task.cancel()
        return failure
