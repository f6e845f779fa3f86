"""The asyncio client: the shared `ClientMachine` driven by a reader task and a heart-beat task.

Frames are built and written in one synchronous step, so their order on the wire is the
order of the calls and a receipt waiter always exists before its frame leaves; `drain()`
afterwards applies the socket's back-pressure to producers.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import ssl
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path

from sluicemq.client import aio_failover, aio_streams
from sluicemq.client.aio_failover import dial_async
from sluicemq.client.aio_handles import AsyncSubscription, AsyncTransaction
from sluicemq.client.aio_ranges import AsyncRangeRead, open_range
from sluicemq.client.aio_streams import AsyncStreamSubscription, AsyncStreamWriter
from sluicemq.client.failover import (
    EarlyAcks,
    FailoverCallback,
    PendingSend,
    TransactionRolledBack,
)
from sluicemq.client.files import Progress
from sluicemq.client.inbox import Ended
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
from sluicemq.client.producer import ProducerNumbers
from sluicemq.client.ranges import RangeHead, range_headers
from sluicemq.client.streams import DEFAULT_CHUNK_SIZE, DEFAULT_WINDOW
from sluicemq.client.url import BrokerList, format_address, parse_brokers
from sluicemq.config import DEFAULT_URL
from sluicemq.errors import ClientError, SluiceError

READ_CHUNK = 1 << 20


class AsyncClient:
    """An asyncio STOMP client; create it with `await AsyncClient.connect(url, ...)`."""

    connected: Connected  # the broker's CONNECTED, set once the handshake is done

    def __init__(self, machine: ClientMachine, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter, timeout: float, *,
                 brokers: BrokerList | None = None, address: str = "",
                 producer: ProducerNumbers | None = None,
                 on_failover: FailoverCallback | None = None,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self.timeout = timeout
        self._machine = machine
        self._reader = reader
        self._writer = writer
        self._brokers = brokers or BrokerList(())
        self.address = address  # the broker this connection is to
        self.producer = producer
        self.on_failover = on_failover
        self._ssl_context = ssl_context
        self._receipts: dict[str, asyncio.Future[dict[str, str]]] = {}
        self._subscriptions: dict[str, AsyncSubscription] = {}
        self._up = asyncio.Event()  # cleared while failing over: new frames wait
        self._up.set()
        self._epoch = 0
        self._early_acks = EarlyAcks()  # acked after their connection was lost
        self._inflight: dict[str, PendingSend] = {}  # receipt id -> unconfirmed SEND
        self._queued = itertools.count(1)  # keys of sends made while failing over
        self._sub_receipts: dict[str, str] = {}
        self._open_tx: set[str] = set()
        self._lost_tx: set[str] = set()
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
    ) -> AsyncClient:
        """Open the socket (TLS for stomps://), exchange CONNECT/CONNECTED, return the client.

        A ``failover:(...)`` URL tries each broker (backing off, until ``timeout``) and keeps
        doing so whenever the connection is lost (see the README's High availability)."""
        brokers = parse_brokers(url)
        options = brokers.failover
        if options is not None and producer_id is None:
            producer_id = f"sluice-{uuid.uuid4().hex}"  # what makes re-sending safe
        producer = ProducerNumbers(producer_id, producer_seq) if producer_id else None
        first = brokers.addresses[0]
        machine = ClientMachine(host=host or first[1], login=login, passcode=passcode,
                                client_id=client_id, heartbeat=heartbeat, version=version)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        attempt = 0
        while True:
            for address in brokers.ordered():
                if attempt:
                    machine = machine.successor()
                if host is None:
                    machine.host = address[1]
                attempt += 1
                try:
                    reader, writer, connected = await dial_async(
                        address, machine, max(deadline - loop.time(), 0.001), ssl_context)
                except ClientError as exc:
                    error = exc
                    if options is None:
                        raise
                    continue
                client = cls(machine, reader, writer, timeout, brokers=brokers,
                             address=format_address(address), producer=producer,
                             on_failover=on_failover, ssl_context=ssl_context)
                client._host_given = host is not None
                client.connected = connected
                client._tasks.append(asyncio.create_task(client._read_loop()))
                client._tasks.append(asyncio.create_task(client._heartbeat_loop()))
                return client
            limit = options.startupMaxReconnectAttempts if options is not None else 0
            if options is None or 0 <= limit < attempt or loop.time() >= deadline:
                raise error
            await asyncio.sleep(min(options.backoff(attempt), max(deadline - loop.time(), 0)))

    # ---------------------------------------------------------------- public API

    @property
    def version(self) -> str:
        """The negotiated STOMP version."""
        return self.connected.version

    @property
    def is_open(self) -> bool:
        return self._failure is None and not self._closing

    async def send(self, destination: str, body: bytes | str = b"",
                   headers: dict[str, str] | None = None, *, persistent: bool = True,
                   receipt: bool = True, transaction: TransactionRef | None = None) -> None:
        """Send; with `receipt` (the default) returns only once the broker has stored it."""
        await self._wait_up()
        future = self.send_async(destination, body, headers, persistent=persistent,
                                 receipt=receipt, transaction=transaction)
        await self._settle(future)

    def send_async(self, destination: str, body: bytes | str = b"",
                   headers: dict[str, str] | None = None, *, persistent: bool = True,
                   receipt: bool = True, transaction: TransactionRef | None = None,
                   ) -> asyncio.Future[dict[str, str]]:
        """Write the SEND now and return a future of its receipt, to pipeline many sends.

        Nothing waits for the socket to drain here; await `drain()` now and then when
        producing large volumes so memory stays bounded.
        """
        tx = transaction_id(transaction)
        self._check_transaction(tx)
        extra = dict(headers or {})
        if self.producer is not None:
            self.producer.stamp(extra)
        pending = PendingSend(destination, body, extra, persistent) \
            if receipt and tx is None and self._brokers.failover is not None else None
        if pending is not None and not self._up.is_set():  # failing over: goes out on replay
            future = asyncio.get_running_loop().create_future()
            pending.future = future
            self._inflight[f"queued-{next(self._queued)}"] = pending
            return future
        out, future = self._submit(lambda m: m.send(destination, body, extra,
                                                    persistent=persistent, receipt=receipt,
                                                    transaction=tx))
        if pending is not None and out.receipt is not None:
            pending.future = future
            self._inflight[out.receipt] = pending
        return future

    async def drain(self) -> None:
        """Wait until the socket buffer has room again."""
        if not self._up.is_set():
            return  # failing over: what is queued goes out on the new connection
        try:
            await self._writer.drain()
        except OSError as exc:
            if self._brokers.failover is None:
                self._fail(ClientError(f"connection lost while sending: {exc}"))
                raise self._failure from exc  # type: ignore[misc]

    async def subscribe(self, destination: str, *, ack: str = "auto",
                        prefetch: int | None = None, selector: str | None = None,
                        headers: dict[str, str] | None = None, durable_name: str | None = None,
                        exclusive: bool = False, id: str | None = None) -> AsyncSubscription:
        """Subscribe and wait for the receipt, so the subscription is live on return."""
        await self._wait_up()
        out, future = self._submit(lambda m: m.subscribe(
            destination, ack=ack, prefetch=prefetch, selector=selector, headers=headers,
            durable_name=durable_name, exclusive=exclusive, id=id))
        assert out.ident is not None
        sub = AsyncSubscription(self, out.ident, destination)
        self._subscriptions[out.ident] = sub  # before the reader can run: no MESSAGE is lost
        if out.receipt is not None:  # a failover before the receipt replays it
            self._sub_receipts[out.receipt] = out.ident
        try:
            await self._settle(future)
        except ClientError:
            self._subscriptions.pop(out.ident, None)
            raise
        return sub

    def transaction(self) -> AsyncTransaction:
        return AsyncTransaction(self)

    # Range reads, head queries and ledgers (docs/replay-protocol.md, sections 1, 2 and 5):
    # the blocking client's API, awaited.
    async def head(self, destination: str, start: int | None = None, end: int | None = None,
                   max_messages: int | None = None, splits: int = 0,
                   ledger: str | None = None, subscription: str | None = None,
                   client_id: str | None = None, streams: bool = False) -> RangeHead:
        headers = range_headers(start=start, end=end, max_messages=max_messages,
                                head_only=True, splits=splits, ledger=ledger,
                                subscription=subscription, client_id=client_id,
                                streams=streams)
        async with await open_range(self, destination, headers) as reader:
            return await reader.result()

    async def read_range(self, destination: str, start: int | None = None,
                         end: int | None = None, ledger: str | None = None,
                         subscription: str | None = None, client_id: str | None = None,
                         max_messages: int | None = None, streams: bool = False,
                         batch_bytes: int | None = None) -> AsyncRangeRead:
        """The retained messages of ``[start, end)`` in seq order (``async for``); with
        ``batch_bytes``, column batches of about that size (iterate ``.batches()``)."""
        headers = range_headers(start=start, end=end, max_messages=max_messages,
                                ledger=ledger, subscription=subscription, client_id=client_id,
                                streams=streams, batch_bytes=batch_bytes)
        return await open_range(self, destination, headers)

    async def commit_upto(self, destination: str, upto: int, ledger: str,
                          subscription: str | None = None, client_id: str | None = None,
                          start: int | None = None, streams: bool = False) -> RangeHead:
        headers = range_headers(start=start, ledger=ledger, commit_upto=upto,
                                subscription=subscription, client_id=client_id,
                                streams=streams)
        async with await open_range(self, destination, headers) as reader:
            return await reader.result()

    def stream_writer(self, destination: str, name: str = "", *,
                      chunk_size: int = DEFAULT_CHUNK_SIZE, window: int = DEFAULT_WINDOW,
                      headers: Mapping[str, str] | None = None, stream_id: str | None = None,
                      resume: bool = False, wait_for_consumer: float | None = None,
                      ) -> AsyncStreamWriter:
        """A stream writer; use `async with` (it asks the broker to resume on entry)."""
        return AsyncStreamWriter(self, destination, name=name, chunk_size=chunk_size,
                                 window=window, headers=headers, stream_id=stream_id,
                                 resume=resume, wait_for_consumer=wait_for_consumer)

    def streams(self, destination: str, *, window: int = DEFAULT_WINDOW,
                timeout: float | None = None) -> AsyncStreamSubscription:
        """Streams on `destination`: `async for` them, one `AsyncStreamReader` each."""
        return AsyncStreamSubscription(self, destination, window=window, timeout=timeout)

    async def send_file(self, destination: str, path: str | os.PathLike[str], *,
                        chunk_size: int = DEFAULT_CHUNK_SIZE, window: int = DEFAULT_WINDOW,
                        resume: bool = True, again: bool = False,
                        progress: Progress | None = None,
                        headers: Mapping[str, str] | None = None,
                        wait_for_consumer: float | None = None) -> AsyncStreamWriter:
        """Send a file as a stream, resuming an interrupted earlier send of the same file;
        one already sent to `destination` is sent again only with `again`."""
        return await aio_streams.send_file(
            self, destination, path, chunk_size=chunk_size, window=window, resume=resume,
            again=again, progress=progress, headers=headers,
            wait_for_consumer=wait_for_consumer)

    async def receive_file(self, destination: str, directory: str | os.PathLike[str], *,
                           window: int = DEFAULT_WINDOW, timeout: float | None = None,
                           progress: Progress | None = None) -> Path:
        """Receive the next stream into `directory` (verified, then renamed); its path."""
        return await aio_streams.receive_file(self, destination, directory, window=window,
                                              timeout=timeout, progress=progress)

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

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.disconnect()

    # ---------------------------------------------------------------- plumbing

    def _submit(self, build: Callable[[ClientMachine], Outgoing],
                ) -> tuple[Outgoing, asyncio.Future[dict[str, str]]]:
        if self._failure is not None:
            raise self._failure
        out = build(self._machine)
        future: asyncio.Future[dict[str, str]] = asyncio.get_running_loop().create_future()
        if out.receipt is not None:
            self._receipts[out.receipt] = future
        else:
            future.set_result({})
        if out.data:
            self._writer.write(out.data)
        return out, future

    async def _call(self, build: Callable[[ClientMachine], Outgoing]) -> Outgoing:
        await self._wait_up()
        out, future = self._submit(build)
        await self._settle(future)
        return out

    async def _settle(self, future: asyncio.Future[dict[str, str]],
                      timeout: float | None = None) -> dict[str, str]:
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
        self._check_transaction(tx)
        epoch = getattr(message, "epoch", self._epoch)
        if epoch != self._epoch and message.ack_mode != "auto":
            if command == "ACK":
                self._early_acks.note(message.subscription, message.message_id)
            if receipt:
                raise ClientError(f"message {message.message_id} came before a failover; the "
                                  "broker redelivers it, so this acknowledgement is void")
            return
        await self._wait_up()
        if epoch != self._epoch and message.ack_mode != "auto":
            if command == "ACK":  # a failover happened while we waited
                self._early_acks.note(message.subscription, message.message_id)
            return
        act = ClientMachine.ack if command == "ACK" else ClientMachine.nack
        _, future = self._submit(lambda m: act(m, message.ack_id, message.subscription,
                                               transaction=tx, receipt=receipt))
        if receipt:
            await self._settle(future)
        else:
            await self.drain()

    async def _read_loop(self) -> None:
        while True:
            try:
                while True:
                    await self._ranges_caught_up()
                    data = await self._reader.read(READ_CHUNK)
                    if not data:
                        raise self._machine.closed_by_peer()
                    for event in self._machine.receive_data(data):
                        self._route(event)
            except (OSError, SluiceError) as exc:
                error = exc if isinstance(exc, ClientError) else ClientError(str(exc))
                if not await aio_failover.fail_over(self, error):
                    self._fail(error)
                    return

    async def _heartbeat_loop(self) -> None:
        while self._failure is None:
            check = self._machine.heartbeat()
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
        while self._settling == 0 and any(
                isinstance(s, AsyncRangeRead) and s.full for s in self._subscriptions.values()):
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

    def _stale(self, message: AsyncMessage) -> bool:
        """Delivered before a failover on a subscription the broker redelivers after it."""
        return message.epoch != self._epoch and message.ack_mode != "auto"

    def _check_transaction(self, tx: str | None) -> None:
        if tx is not None and tx in self._lost_tx:
            raise TransactionRolledBack(tx)

    def _room_for_ranges(self) -> None:
        self._room.set()

    def _route(self, event: Event) -> None:
        if isinstance(event, MessageReceived):
            sub = self._subscriptions.get(event.subscription)
            if sub is not None:
                message = AsyncMessage(event.frame, event.subscription, event.ack_id,
                                       event.ack_mode, self._acknowledge, self._epoch)
                if self._early_acks.take(event.subscription, message.message_id):
                    task = asyncio.get_running_loop().create_task(
                        self._acknowledge("ACK", message, None))  # acknowledged before
                    self._tasks.append(task)
                else:
                    sub._queue.put_nowait(message)
        elif isinstance(event, ReceiptReceived):
            self._inflight.pop(event.receipt_id, None)
            self._sub_receipts.pop(event.receipt_id, None)
            _resolve(self._receipts.pop(event.receipt_id, None), event.headers)
        elif isinstance(event, ErrorReceived):
            rid = event.receipt_id
            self._inflight.pop(rid or "", None)
            sub_id = self._sub_receipts.pop(rid or "", None)
            if rid is not None and rid in self._receipts:
                _resolve(self._receipts.pop(rid), event.error)
            elif sub_id in self._subscriptions:  # a replayed SUBSCRIBE was refused
                self._subscriptions[sub_id]._queue.put_nowait(event.error)
            else:
                for sub in self._subscriptions.values():
                    sub._queue.put_nowait(event.error)

    def _fail(self, error: ClientError) -> None:
        """The connection is over: every waiter and every subscription learns why."""
        if self._failure is not None:
            return
        clean = self._closing
        self._failure = ClientError("client disconnected") if clean else error
        self._machine.connection_lost()
        for future in [*self._receipts.values(),
                       *(p.future for p in self._inflight.values() if p.future is not None)]:
            _resolve(future, self._failure)  # type: ignore[arg-type]
        self._receipts.clear()
        self._inflight.clear()
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


def _resolve(future: asyncio.Future | None, outcome: object) -> None:
    if future is None or future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
