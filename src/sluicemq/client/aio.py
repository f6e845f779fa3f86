"""The asyncio client: the shared `ClientMachine` driven by a reader task and a heart-beat task.

Frames are built and written in one synchronous step, so their order on the wire is the
order of the calls and a receipt waiter always exists before its frame leaves; `drain()`
afterwards applies the socket's back-pressure to producers.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType

from sluicemq.client import aio_streams
from sluicemq.client.aio_ranges import AsyncRangeRead, open_range
from sluicemq.client.aio_streams import AsyncStreamSubscription, AsyncStreamWriter
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
from sluicemq.client.message import AsyncMessage, TransactionRef, _Received, transaction_id
from sluicemq.client.ranges import RangeHead, range_headers
from sluicemq.client.streams import DEFAULT_CHUNK_SIZE, DEFAULT_WINDOW
from sluicemq.client.url import parse_url, tls_context
from sluicemq.config import DEFAULT_URL
from sluicemq.errors import ClientError, SluiceError

READ_CHUNK = 1 << 20


class AsyncSubscription:
    """Messages of one SUBSCRIBE; `async for` them or `await get()`."""

    def __init__(self, client: AsyncClient, sub_id: str, destination: str) -> None:
        self.client = client
        self.id = sub_id
        self.destination = destination
        self.active = True
        self._queue: asyncio.Queue[object] = asyncio.Queue()

    async def get(self, timeout: float | None = None) -> AsyncMessage | None:
        """The next message, or None on timeout or once the subscription has ended.

        Raises ClientError for a broker ERROR no call claimed (once) or a dead connection.
        """
        try:
            item = await asyncio.wait_for(self._queue.get(), timeout)
        except TimeoutError:
            return None
        return take(item, self._queue.put_nowait, AsyncMessage)

    def __aiter__(self) -> AsyncSubscription:
        return self

    async def __anext__(self) -> AsyncMessage:
        message = await self.get()
        if message is None:
            raise StopAsyncIteration
        return message

    async def unsubscribe(self, durable: bool = False) -> None:
        """Stop deliveries; `durable` also deletes a durable subscription on the broker."""
        if not self.active:
            return
        self.active = False
        try:
            await self.client._call(lambda m: m.unsubscribe(self.id, durable=durable))
        finally:
            self.client._subscriptions.pop(self.id, None)
            self._queue.put_nowait(Ended())

    async def __aenter__(self) -> AsyncSubscription:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.active and self.client.is_open:
            await self.unsubscribe()


class AsyncTransaction:
    """A STOMP transaction, begun by `async with` (or `begin()`); commit on a clean exit."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client
        self.id = ""
        self.finished = False

    async def begin(self) -> AsyncTransaction:
        out = await self.client._call(lambda m: m.begin())
        assert out.ident is not None
        self.id = out.ident
        return self

    async def send(self, destination: str, body: bytes | str = b"",
                   headers: dict[str, str] | None = None, *, persistent: bool = True,
                   receipt: bool = False) -> None:
        """Send inside the transaction; no receipt by default since COMMIT's receipt covers it."""
        await self.client.send(destination, body, headers, persistent=persistent,
                               receipt=receipt, transaction=self.id)

    async def ack(self, message: AsyncMessage) -> None:
        await message.ack(self.id)

    async def nack(self, message: AsyncMessage) -> None:
        await message.nack(self.id)

    async def commit(self) -> None:
        await self._finish(lambda m: m.commit(self.id))

    async def abort(self) -> None:
        await self._finish(lambda m: m.abort(self.id))

    async def _finish(self, build: Callable[[ClientMachine], Outgoing]) -> None:
        if not self.id:
            raise ClientError("transaction was never begun")
        if self.finished:
            raise ClientError(f"transaction {self.id} already finished")
        self.finished = True
        await self.client._call(build)

    async def __aenter__(self) -> AsyncTransaction:
        return await self.begin()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if self.finished:
            return
        if exc_type is None:
            await self.commit()
        else:
            with contextlib.suppress(ClientError):  # never mask the error that got us here
                await self.abort()


class AsyncClient:
    """An asyncio STOMP client; create it with `await AsyncClient.connect(url, ...)`."""

    def __init__(self, machine: ClientMachine, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter, timeout: float) -> None:
        self.timeout = timeout
        self._machine = machine
        self._reader = reader
        self._writer = writer
        self._receipts: dict[str, asyncio.Future[dict[str, str]]] = {}
        self._subscriptions: dict[str, AsyncSubscription] = {}
        self._connected: asyncio.Future[Connected] = asyncio.get_running_loop().create_future()
        self._failure: ClientError | None = None
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
    ) -> AsyncClient:
        """Open the socket (TLS for stomps://), exchange CONNECT/CONNECTED, return the client."""
        scheme, address, port = parse_url(url)
        tls = tls_context(ssl_context) if scheme == "stomps" else None
        machine = ClientMachine(host=host or address, login=login, passcode=passcode,
                                client_id=client_id, heartbeat=heartbeat, version=version)
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(address, port, limit=READ_CHUNK, ssl=tls,
                                        server_hostname=address if tls else None), timeout)
        except (OSError, TimeoutError) as exc:
            raise ClientError(f"cannot connect to {address}:{port}: {exc or 'timed out'}") from exc
        client = cls(machine, reader, writer, timeout)
        writer.write(machine.connect())
        client._tasks.append(asyncio.create_task(client._read_loop()))
        try:
            client.connected = await asyncio.wait_for(asyncio.shield(client._connected), timeout)
        except TimeoutError:
            client._fail(ClientError(f"no CONNECTED from {address}:{port} within {timeout}s"))
            raise client._failure from None  # type: ignore[misc]
        except ClientError:
            client._writer.close()
            raise
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

    async def send(self, destination: str, body: bytes | str = b"",
                   headers: dict[str, str] | None = None, *, persistent: bool = True,
                   receipt: bool = True, transaction: TransactionRef | None = None) -> None:
        """Send; with `receipt` (the default) returns only once the broker has stored it."""
        tx = transaction_id(transaction)
        await self._call(lambda m: m.send(destination, body, headers, persistent=persistent,
                                          receipt=receipt, transaction=tx))

    def send_async(self, destination: str, body: bytes | str = b"",
                   headers: dict[str, str] | None = None, *, persistent: bool = True,
                   receipt: bool = True, transaction: TransactionRef | None = None,
                   ) -> asyncio.Future[dict[str, str]]:
        """Write the SEND now and return a future of its receipt, to pipeline many sends.

        Nothing waits for the socket to drain here; await `drain()` now and then when
        producing large volumes so memory stays bounded.
        """
        tx = transaction_id(transaction)
        _, future = self._submit(lambda m: m.send(destination, body, headers,
                                                  persistent=persistent, receipt=receipt,
                                                  transaction=tx))
        return future

    async def drain(self) -> None:
        """Wait until the socket buffer has room again."""
        try:
            await self._writer.drain()
        except OSError as exc:
            self._fail(ClientError(f"connection lost while sending: {exc}"))
            raise self._failure from exc  # type: ignore[misc]

    async def subscribe(self, destination: str, *, ack: str = "auto",
                        prefetch: int | None = None, selector: str | None = None,
                        headers: dict[str, str] | None = None, durable_name: str | None = None,
                        exclusive: bool = False, id: str | None = None) -> AsyncSubscription:
        """Subscribe and wait for the receipt, so the subscription is live on return."""
        out, future = self._submit(lambda m: m.subscribe(
            destination, ack=ack, prefetch=prefetch, selector=selector, headers=headers,
            durable_name=durable_name, exclusive=exclusive, id=id))
        assert out.ident is not None
        sub = AsyncSubscription(self, out.ident, destination)
        self._subscriptions[out.ident] = sub  # before the reader can run: no MESSAGE is lost
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
                         max_messages: int | None = None,
                         streams: bool = False) -> AsyncRangeRead:
        headers = range_headers(start=start, end=end, max_messages=max_messages,
                                ledger=ledger, subscription=subscription, client_id=client_id,
                                streams=streams)
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
            if self._failure is None:
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
        act = ClientMachine.ack if command == "ACK" else ClientMachine.nack
        _, future = self._submit(lambda m: act(m, message.ack_id, message.subscription,
                                               transaction=tx, receipt=receipt))
        if receipt:
            await self._settle(future)
        else:
            await self.drain()

    async def _read_loop(self) -> None:
        try:
            while True:
                await self._ranges_caught_up()
                data = await self._reader.read(READ_CHUNK)
                if not data:
                    raise self._machine.closed_by_peer()
                for event in self._machine.receive_data(data):
                    self._route(event)
        except (OSError, SluiceError) as exc:
            self._fail(exc if isinstance(exc, ClientError) else ClientError(str(exc)))

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

    def _room_for_ranges(self) -> None:
        self._room.set()

    def _route(self, event: Event) -> None:
        if isinstance(event, MessageReceived):
            sub = self._subscriptions.get(event.subscription)
            if sub is not None:
                sub._queue.put_nowait(AsyncMessage(event.frame, event.subscription,
                                                   event.ack_id, event.ack_mode,
                                                   self._acknowledge))
        elif isinstance(event, ReceiptReceived):
            _resolve(self._receipts.pop(event.receipt_id, None), event.headers)
        elif isinstance(event, ErrorReceived):
            if event.receipt_id is not None and event.receipt_id in self._receipts:
                _resolve(self._receipts.pop(event.receipt_id), event.error)
            elif not self._connected.done():
                self._fail(event.error)  # refused at CONNECT
            else:
                for sub in self._subscriptions.values():
                    sub._queue.put_nowait(event.error)
        else:
            _resolve(self._connected, event)

    def _fail(self, error: ClientError) -> None:
        """The connection is over: every waiter and every subscription learns why."""
        if self._failure is not None:
            return
        clean = self._closing
        self._failure = ClientError("client disconnected") if clean else error
        self._machine.connection_lost()
        for future in [*self._receipts.values(), self._connected]:
            _resolve(future, self._failure)
        self._receipts.clear()
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
