"""The blocking client's I/O for (re)connecting: dial a broker up to CONNECTED, connect first
(trying each broker of a failover URL) and, after a loss, move the client to the next broker.

What to dial when, and what survives the move, is decided sans-IO (client/reconnect.py,
client/tracker.py); this module only opens sockets, sleeps and writes. `SyncFailover` is a
mixin of the blocking connection (client/sync_conn.py), which provides the state it names.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
import threading
import time
from concurrent.futures import Future

from sluicemq.client.failover import FailoverCallback, FailoverEvent, range_read_lost, resolve
from sluicemq.client.machine import ClientMachine, Connected
from sluicemq.client.reconnect import Dial, GiveUp, Reconnect, connected_in, handshake_failed
from sluicemq.client.tracker import Tracker
from sluicemq.client.url import Address, BrokerList, format_address, tls_context
from sluicemq.errors import ClientError, SluiceError

log = logging.getLogger("sluicemq.client")
DIAL_TIMEOUT = 10.0  # at most this per connection attempt (a dead host answers nothing)


def dial(address: Address, machine: ClientMachine, timeout: float,
         ssl_context: ssl.SSLContext | None = None) -> tuple[socket.socket, Connected]:
    """Open a socket, send CONNECT and read until CONNECTED (blocking, within ``timeout``).

    Raises ClientError naming the address on any failure, or the broker's ERROR as sent.
    """
    scheme, host, port = address
    deadline = time.monotonic() + timeout
    try:
        sock = socket.create_connection((host, port), timeout=min(timeout, DIAL_TIMEOUT))
    except OSError as exc:
        raise ClientError(f"cannot connect to {host}:{port}: {exc}") from exc
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if scheme == "stomps":
            sock = tls_context(ssl_context).wrap_socket(sock, server_hostname=host)
        sock.sendall(machine.connect())
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            sock.settimeout(remaining)
            data = sock.recv(1 << 16)
            if not data:
                raise machine.closed_by_peer()
            connected = connected_in(machine.receive_data(data))
            if connected is not None:
                sock.settimeout(None)
                return sock, connected
    except (OSError, SluiceError) as exc:
        sock.close()
        if isinstance(exc, ClientError):
            raise  # the broker's ERROR, as sent
        raise handshake_failed(exc, address, timeout) from exc


class SyncFailover:
    """Connecting and failing over, for the blocking connection that inherits it."""

    timeout: float
    address: str
    connected: Connected
    on_failover: FailoverCallback | None
    _brokers: BrokerList
    _ssl_context: ssl.SSLContext | None
    _host_given: bool
    _track: Tracker[Future[dict[str, str]]]
    _sock: socket.socket
    _state: threading.Lock
    _write: threading.Lock
    _up: threading.Event
    _closed: threading.Event
    _closing: bool
    _failure: ClientError | None

    def _end_range(self, sub_id: str, error: ClientError) -> None:
        raise NotImplementedError

    def _machine_for(self, machine: ClientMachine, address: Address) -> ClientMachine:
        """The CONNECT's host header names the broker dialled, unless the caller chose one."""
        if not self._host_given:
            machine.host = address[1]
        return machine

    def _connect_first(self) -> tuple[socket.socket, Connected, str]:
        """Connect to the first broker that answers (socket, CONNECTED, its URL): a plain URL
        gets exactly one attempt, a failover URL follows its reconnect options until
        ``timeout``."""
        plan = Reconnect(self._brokers, timeout=self.timeout, startup=True)
        error = ClientError("no broker to connect to")
        machine = self._track.machine
        while True:
            step = plan.next()
            if isinstance(step, GiveUp):
                raise error
            if not isinstance(step, Dial):
                time.sleep(step.seconds)
                continue
            if plan.attempts > 1:
                machine = machine.successor()
            try:
                sock, connected = dial(step.address, self._machine_for(machine, step.address),
                                       step.timeout, self._ssl_context)
            except ClientError as exc:
                error = exc
                continue
            self._track.machine = machine
            return sock, connected, format_address(step.address)

    def _fail_over(self, error: ClientError) -> bool:
        """Connect to the next broker that answers and replay onto it: subscriptions, then
        every unconfirmed SEND in its original order. False: no failover URL, closing, or
        ``maxReconnectAttempts`` spent."""
        lost_at = time.monotonic()
        track = self._track
        with self._state:
            if not track.failover or self._closing or self._failure is not None:
                return False
            self._up.clear()
            from_url = self.address
            loss = track.lose(error, from_url)
            old_sock, old = self._sock, track.machine
        log.warning("connection to %s lost (%s); failing over", from_url, error)
        for sid in loss.ranges:
            self._end_range(sid, range_read_lost(from_url))
        for waiter, failure in loss.failed:
            resolve(waiter, failure)
        with contextlib.suppress(OSError):
            old_sock.close()
        plan = Reconnect(self._brokers, timeout=self.timeout, startup=False)
        while not self._closing:
            step = plan.next()
            if isinstance(step, GiveUp):
                return False
            if not isinstance(step, Dial):
                self._closed.wait(step.seconds)  # cut short by disconnect()
                continue
            machine = self._machine_for(old.successor(), step.address)
            try:
                sock, connected = dial(step.address, machine, step.timeout, self._ssl_context)
            except ClientError as exc:
                log.info("failover attempt %d to %s failed: %s", plan.attempts,
                         format_address(step.address), exc)
                continue
            with self._write:
                with self._state:
                    self._sock = sock
                    replay = track.replay(machine, loss, Future)
                with contextlib.suppress(OSError):  # if this broker died too, the reader sees it
                    sock.sendall(replay.data)
            self.connected, self.address = connected, format_address(step.address)
            event = FailoverEvent(from_url, self.address, time.monotonic() - lost_at,
                                  plan.attempts, replay.resent, replay.resubscribed,
                                  loss.rolled_back)
            log.warning("failed over from %s to %s in %.3fs (%d attempts, %d sends re-sent, "
                        "%d subscriptions replayed)", from_url, self.address, event.downtime,
                        event.attempts, event.resent, event.resubscribed)
            self._up.set()
            if self.on_failover is not None:
                self.on_failover(event)
            return True
        return False
