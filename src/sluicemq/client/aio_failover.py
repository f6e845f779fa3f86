"""The asyncio client's I/O for (re)connecting: dial a broker up to CONNECTED, connect first
(trying each broker of a failover URL) and, after a loss, move the client to the next broker.

What to dial when, and what survives the move, is decided sans-IO (client/reconnect.py,
client/tracker.py), exactly as for the blocking client; this module only opens connections,
sleeps and writes. `AsyncFailover` is a mixin of client/aio_conn.py's `AsyncConnection`.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Coroutine
from typing import Any

from sluicemq.client.failover import FailoverCallback, FailoverEvent, range_read_lost, resolve
from sluicemq.client.machine import ClientMachine, Connected
from sluicemq.client.reconnect import Dial, GiveUp, Reconnect, connected_in, handshake_failed
from sluicemq.client.tracker import Tracker
from sluicemq.client.url import Address, BrokerList, format_address, tls_context
from sluicemq.errors import ClientError, SluiceError

log = logging.getLogger("sluicemq.client")

READ_CHUNK = 1 << 20
DIAL_TIMEOUT = 10.0  # at most this per connection attempt (a dead host answers nothing)


async def dial_async(address: Address, machine: ClientMachine, timeout: float,
                     ssl_context: ssl.SSLContext | None = None,
                     ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, Connected]:
    """Open the connection (TLS for stomps://), send CONNECT and read until CONNECTED.

    Raises ClientError naming the address on any failure, or the broker's ERROR as sent.
    """
    scheme, host, port = address
    tls = tls_context(ssl_context) if scheme == "stomps" else None
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, limit=READ_CHUNK, ssl=tls,
                                    server_hostname=host if tls else None),
            min(timeout, DIAL_TIMEOUT))
    except (OSError, TimeoutError) as exc:
        raise ClientError(f"cannot connect to {host}:{port}: {exc or 'timed out'}") from exc
    try:
        writer.write(machine.connect())
        connected = await asyncio.wait_for(_read_connected(reader, machine), timeout)
    except (OSError, SluiceError) as exc:
        writer.close()
        if isinstance(exc, ClientError):
            raise  # the broker's ERROR, as sent
        raise handshake_failed(exc, address, timeout) from exc
    return reader, writer, connected


async def _read_connected(reader: asyncio.StreamReader, machine: ClientMachine) -> Connected:
    while True:
        data = await reader.read(READ_CHUNK)
        if not data:
            raise machine.closed_by_peer()
        connected = connected_in(machine.receive_data(data))
        if connected is not None:
            return connected


async def connect_first(brokers: BrokerList, machine: ClientMachine, timeout: float,
                        host_given: bool, ssl_context: ssl.SSLContext | None,
                        ) -> tuple[ClientMachine, asyncio.StreamReader, asyncio.StreamWriter,
                                   Connected, str]:
    """Connect to the first broker that answers: a plain URL gets exactly one attempt, a
    failover URL follows its reconnect options until ``timeout``. Returns the machine that
    connected, the streams, CONNECTED and the broker's URL."""
    plan = Reconnect(brokers, timeout=timeout, startup=True)
    error = ClientError("no broker to connect to")
    while True:
        step = plan.next()
        if isinstance(step, GiveUp):
            raise error
        if not isinstance(step, Dial):
            await asyncio.sleep(step.seconds)
            continue
        if plan.attempts > 1:
            machine = machine.successor()
        if not host_given:
            machine.host = step.address[1]
        try:
            reader, writer, connected = await dial_async(step.address, machine, step.timeout,
                                                         ssl_context)
        except ClientError as exc:
            error = exc
            continue
        return machine, reader, writer, connected, format_address(step.address)


class AsyncFailover:
    """Failing over, for the asyncio connection that inherits it."""

    timeout: float
    address: str
    connected: Connected
    on_failover: FailoverCallback | None
    _brokers: BrokerList
    _ssl_context: ssl.SSLContext | None
    _host_given: bool
    _track: Tracker[asyncio.Future[dict[str, str]]]
    _reader: asyncio.StreamReader
    _writer: asyncio.StreamWriter
    _up: asyncio.Event
    _closing: bool
    _failure: ClientError | None
    _tasks: list[asyncio.Task[None]]

    def _end_range(self, sub_id: str, error: ClientError) -> None:
        raise NotImplementedError

    def _heartbeat_loop(self) -> Coroutine[Any, Any, None]:
        raise NotImplementedError

    async def _fail_over(self, error: ClientError) -> bool:
        """Connect to the next broker that answers and replay onto it: subscriptions, then
        every unconfirmed SEND in its original order. False: no failover URL, closing, or
        ``maxReconnectAttempts`` spent."""
        track = self._track
        if not track.failover or self._closing or self._failure is not None:
            return False
        loop = asyncio.get_running_loop()
        lost_at = loop.time()
        self._up.clear()
        from_url = self.address
        old = track.machine
        loss = track.lose(error, from_url)
        for sid in loss.ranges:
            self._end_range(sid, range_read_lost(from_url))
        log.warning("connection to %s lost (%s); failing over", from_url, error)
        for waiter, failure in loss.failed:
            resolve(waiter, failure)
        self._writer.close()
        current = asyncio.current_task()
        for task in self._tasks:
            if task is not current:
                task.cancel()
        self._tasks = [t for t in self._tasks if t is current]
        plan = Reconnect(self._brokers, timeout=self.timeout, startup=False)
        while not self._closing:
            step = plan.next()
            if isinstance(step, GiveUp):
                return False
            if not isinstance(step, Dial):
                await asyncio.sleep(step.seconds)
                continue
            machine = old.successor()
            if not self._host_given:
                machine.host = step.address[1]
            try:
                reader, writer, connected = await dial_async(step.address, machine,
                                                             step.timeout, self._ssl_context)
            except ClientError as exc:
                log.info("failover attempt %d to %s failed: %s", plan.attempts,
                         format_address(step.address), exc)
                continue
            if self._closing:
                writer.close()
                return False
            self._reader, self._writer = reader, writer
            replay = track.replay(machine, loss, loop.create_future)
            writer.write(replay.data)
            self.connected, self.address = connected, format_address(step.address)
            event = FailoverEvent(from_url, self.address, loop.time() - lost_at,
                                  plan.attempts, replay.resent, replay.resubscribed,
                                  loss.rolled_back)
            log.warning("failed over from %s to %s in %.3fs (%d attempts, %d sends re-sent, "
                        "%d subscriptions replayed)", from_url, self.address, event.downtime,
                        event.attempts, event.resent, event.resubscribed)
            self._tasks.append(asyncio.create_task(self._heartbeat_loop()))
            self._up.set()
            if self.on_failover is not None:
                self.on_failover(event)
            return True
        return False
