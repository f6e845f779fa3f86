"""The asyncio client's half of failover: dialling up to CONNECTED, and moving a connected
`AsyncClient` to the next broker (replaying subscriptions and unconfirmed SENDs).

What survives a failover (pending sends, lost transactions, the event told to callbacks) is
shared with the blocking client in client/failover.py.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from typing import TYPE_CHECKING

from sluicemq.client.failover import FailoverEvent, drop_range_reads, range_read_lost
from sluicemq.client.inbox import Ended
from sluicemq.client.machine import ClientMachine, Connected, ErrorReceived
from sluicemq.client.url import Address, format_address, tls_context
from sluicemq.errors import ClientError, SluiceError

if TYPE_CHECKING:
    from sluicemq.client.aio import AsyncClient

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
    except TimeoutError:
        writer.close()
        raise ClientError(f"no CONNECTED from {host}:{port} within {timeout}s") from None
    except OSError as exc:
        writer.close()
        raise ClientError(f"cannot connect to {host}:{port}: {exc}") from exc
    except ClientError:
        writer.close()
        raise
    except SluiceError as exc:
        writer.close()
        raise ClientError(f"bad answer from {host}:{port}: {exc}") from exc
    return reader, writer, connected


async def _read_connected(reader: asyncio.StreamReader, machine: ClientMachine) -> Connected:
    while True:
        data = await reader.read(READ_CHUNK)
        if not data:
            raise machine.closed_by_peer()
        for event in machine.receive_data(data):
            if isinstance(event, ErrorReceived):
                raise event.error
            if isinstance(event, Connected):
                return event


async def fail_over(client: AsyncClient, error: ClientError) -> bool:
    """Connect the client to the next broker that answers and replay onto it: subscriptions,
    then every unconfirmed SEND in its original order. False: no failover URL, closing, or
    ``maxReconnectAttempts`` spent."""
    options = client._brokers.failover
    if options is None or client._closing or client._failure is not None:
        return False
    loop = asyncio.get_running_loop()
    lost_at = loop.time()
    client._up.clear()
    old = client._machine
    old.connection_lost()
    receipts, client._receipts = client._receipts, {}
    sub_waiters = {client._sub_receipts.pop(r): f for r, f in list(receipts.items())
                   if r in client._sub_receipts}
    replayed = {id(f) for f in sub_waiters.values()}
    lost = [f for r, f in receipts.items() if r not in client._inflight and id(f) not in replayed]
    rolled_back = tuple(sorted(client._open_tx))
    client._lost_tx |= client._open_tx
    client._open_tx.clear()
    from_url = client.address
    for sid in drop_range_reads(old):
        sub = client._subscriptions.pop(sid, None)
        if sub is not None:
            sub.active = False
            sub._queue.put_nowait(Ended(range_read_lost(from_url)))
    log.warning("connection to %s lost (%s); failing over", from_url, error)
    for future in lost:
        if not future.done():
            future.set_exception(ClientError(f"connection to {from_url} lost before the broker "
                                             f"confirmed this frame: {error}"))
    client._writer.close()
    current = asyncio.current_task()
    for task in client._tasks:
        if task is not current:
            task.cancel()
    client._tasks = [t for t in client._tasks if t is current]
    attempts = 0
    while not client._closing:
        for address in client._brokers.ordered():
            machine = old.successor()
            if not client._host_given:
                machine.host = address[1]
            attempts += 1
            try:
                reader, writer, connected = await dial_async(address, machine, client.timeout,
                                                             client._ssl_context)
            except ClientError as exc:
                log.info("failover attempt %d to %s failed: %s", attempts,
                         format_address(address), exc)
                if 0 <= options.maxReconnectAttempts <= attempts:
                    return False
                continue
            if client._closing:
                writer.close()
                return False
            resent, resubscribed = _replay(client, reader, writer, machine, old, sub_waiters)
            client.connected, client.address = connected, format_address(address)
            event = FailoverEvent(from_url, client.address, loop.time() - lost_at, attempts,
                                  resent, resubscribed, rolled_back)
            log.warning("failed over from %s to %s in %.3fs (%d attempts, %d sends re-sent, "
                        "%d subscriptions replayed)", from_url, client.address, event.downtime,
                        attempts, resent, resubscribed)
            client._tasks.append(asyncio.create_task(client._heartbeat_loop()))
            client._up.set()
            if client.on_failover is not None:
                client.on_failover(event)
            return True
        await asyncio.sleep(options.backoff(attempts))
    return False


def _replay(client: AsyncClient, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
            machine: ClientMachine, old: ClientMachine,
            sub_waiters: dict[str, asyncio.Future[dict[str, str]]]) -> tuple[int, int]:
    """Install the new connection and write the replayed frames before anything new."""
    loop = asyncio.get_running_loop()
    client._reader, client._writer, client._machine = reader, writer, machine
    client._epoch += 1
    data: list[bytes] = []
    for sub in old.subscriptions.values():
        out = machine.resubscribe(sub)
        assert out.receipt is not None
        client._receipts[out.receipt] = sub_waiters.get(sub.id) or loop.create_future()
        client._sub_receipts[out.receipt] = sub.id
        data.append(out.data)
    inflight, client._inflight = client._inflight, {}
    for pending in inflight.values():
        out = machine.send(pending.destination, pending.body, pending.headers,
                           persistent=pending.persistent)
        assert out.receipt is not None
        client._receipts[out.receipt] = pending.future  # type: ignore[assignment]
        client._inflight[out.receipt] = pending
        data.append(out.data)
    writer.write(b"".join(data))
    return len(inflight), len(old.subscriptions)
