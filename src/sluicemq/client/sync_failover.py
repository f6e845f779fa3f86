"""The blocking client's half of failover: the first connection (trying each broker of a
failover URL) and moving a connected `Client` to the next broker after a loss, replaying its
subscriptions and unconfirmed SENDs before anything new is written.

What survives a failover (pending sends, lost transactions, the event told to callbacks) is
shared with the asyncio client in client/failover.py.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import time
from concurrent.futures import Future
from typing import TYPE_CHECKING

from sluicemq.client.failover import FailoverEvent, dial, drop_range_reads, range_read_lost
from sluicemq.client.inbox import Ended
from sluicemq.client.machine import ClientMachine, Connected
from sluicemq.client.sync_handles import _resolve
from sluicemq.client.url import Address, format_address
from sluicemq.errors import ClientError

if TYPE_CHECKING:
    from sluicemq.client.sync import Client

log = logging.getLogger("sluicemq.client")


def connect_first(client: Client) -> tuple[socket.socket, Connected, str]:
    """Connect to the first broker that answers (socket, CONNECTED, its URL): a plain URL
    gets exactly one attempt, a failover URL tries every address, backing off, until
    ``timeout``."""
    options = client._brokers.failover
    deadline = time.monotonic() + client.timeout
    attempt = 0
    while True:
        for address in client._brokers.ordered():
            remaining = deadline - time.monotonic()
            machine = client._machine if attempt == 0 else client._machine.successor()
            try:
                sock, connected = dial(address, with_host(client, machine, address),
                                       max(remaining, 0.001), client._ssl_context)
            except ClientError as exc:
                error = exc
                if options is None:
                    raise
                attempt += 1
                client._machine = machine
                continue
            client._machine = machine
            return sock, connected, format_address(address)
        limit = options.startupMaxReconnectAttempts if options is not None else 0
        if options is None or 0 <= limit < attempt or time.monotonic() >= deadline:
            raise error
        time.sleep(min(options.backoff(attempt), max(deadline - time.monotonic(), 0)))


def with_host(client: Client, machine: ClientMachine, address: Address) -> ClientMachine:
    """The CONNECT's host header names the broker dialled, unless the caller chose one."""
    if not client._host_given:
        machine.host = address[1]
    return machine


def fail_over(client: Client, error: ClientError) -> bool:
    """Connect to the next broker that answers and replay onto it: subscriptions, then
    every unconfirmed SEND in its original order. False: no failover URL, closing, or
    ``maxReconnectAttempts`` spent."""
    options = client._brokers.failover
    lost_at = time.monotonic()
    with client._state:
        if options is None or client._closing or client._failure is not None:
            return False
        client._up.clear()
        old = client._machine
        old.connection_lost()
        receipts, client._receipts = client._receipts, {}
        sub_waiters = {client._sub_receipts.pop(r): f for r, f in list(receipts.items())
                       if r in client._sub_receipts}
        lost = [f for r, f in receipts.items()
                if r not in client._inflight and f not in sub_waiters.values()]
        rolled_back = tuple(sorted(client._open_tx))
        client._lost_tx |= client._open_tx
        client._open_tx.clear()
        old_sock, from_url = client._sock, client.address
        ranges = [client._subscriptions.pop(sid) for sid in drop_range_reads(old)
                  if sid in client._subscriptions]
    log.warning("connection to %s lost (%s); failing over", from_url, error)
    for sub in ranges:
        sub.active = False
        sub._deliver(Ended(range_read_lost(from_url)))
    for future in lost:
        _resolve(future, ClientError(f"connection to {from_url} lost before the broker "
                                     f"confirmed this frame: {error}"))
    with contextlib.suppress(OSError):
        old_sock.close()
    attempts = 0
    while not client._closing:
        for address in client._brokers.ordered():
            machine = with_host(client, old.successor(), address)
            attempts += 1
            try:
                sock, connected = dial(address, machine, client.timeout, client._ssl_context)
            except ClientError as exc:
                log.info("failover attempt %d to %s failed: %s", attempts,
                         format_address(address), exc)
                if 0 <= options.maxReconnectAttempts <= attempts:
                    return False
                continue
            resent, resubscribed = _replay(client, sock, machine, old, sub_waiters)
            client.connected, client.address = connected, format_address(address)
            event = FailoverEvent(from_url, client.address, time.monotonic() - lost_at,
                                  attempts, resent, resubscribed, rolled_back)
            log.warning("failed over from %s to %s in %.3fs (%d attempts, %d sends "
                        "re-sent, %d subscriptions replayed)", from_url, client.address,
                        event.downtime, attempts, resent, resubscribed)
            client._up.set()
            if client.on_failover is not None:
                client.on_failover(event)
            return True
        client._closed.wait(options.backoff(attempts))
    return False


def _replay(client: Client, sock: socket.socket, machine: ClientMachine, old: ClientMachine,
            sub_waiters: dict[str, Future[dict[str, str]]]) -> tuple[int, int]:
    """Install the new connection and write the replayed frames before anything new."""
    with client._write:
        with client._state:
            client._sock, client._machine = sock, machine
            client._epoch += 1
            data: list[bytes] = []
            for sub in old.subscriptions.values():
                out = machine.resubscribe(sub)
                assert out.receipt is not None
                client._receipts[out.receipt] = sub_waiters.get(sub.id) or Future()
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
        with contextlib.suppress(OSError):  # if this broker died too, the reader sees it
            sock.sendall(b"".join(data))
    return len(inflight), len(old.subscriptions)
