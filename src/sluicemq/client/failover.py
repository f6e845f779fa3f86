"""What a client keeps to survive a failover, and the blocking dial that opens a connection.

After the connection to the master is lost, a client with a ``failover:`` URL connects to the
next broker, replays its subscriptions (same ids, ack modes, durable names) and re-sends, in
their original order and under their original producer numbers, every SEND whose RECEIPT it
never got. The broker's duplicate detection drops those it had stored already, so nothing is
lost and nothing is stored twice. Transactions open at the failure are lost (the broker rolled
them back) and say so with `TransactionRolledBack`.
"""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sluicemq.client.machine import ClientMachine, Connected, ErrorReceived
from sluicemq.client.url import Address, tls_context
from sluicemq.errors import ClientError, SluiceError

DIAL_TIMEOUT = 10.0  # at most this per connection attempt (a dead host answers nothing)


class TransactionRolledBack(ClientError):
    """The connection failed over while this transaction was open (or its COMMIT was in
    flight): the broker rolled it back (or, for a COMMIT in flight, may have committed it).
    Retry the whole transaction; numbered sends inside it are dropped at COMMIT if stored."""

    def __init__(self, transaction: str, detail: str = "") -> None:
        super().__init__(f"transaction {transaction} was open when the connection failed over "
                         f"and was rolled back{detail}; retry it")
        self.transaction = transaction


@dataclass(slots=True)
class PendingSend:
    """A receipted SEND not yet confirmed: everything needed to send it again identically."""

    destination: str
    body: bytes | str
    headers: dict[str, str]  # as sent, producer id and number included
    persistent: bool
    future: object = None  # the caller's receipt future, resolved by whichever copy answers


@dataclass(frozen=True, slots=True)
class FailoverEvent:
    """Told to ``on_failover`` (and logged) once a new connection is up and replayed."""

    from_url: str
    to_url: str
    downtime: float  # seconds from the loss to the replayed connection
    attempts: int  # connection attempts it took
    resent: int  # unconfirmed SENDs sent again
    resubscribed: int
    rolled_back: tuple[str, ...] = field(default_factory=tuple)  # open transactions lost


FailoverCallback = Callable[[FailoverEvent], None]


def drop_range_reads(machine: ClientMachine) -> list[str]:
    """Remove the range reads and browses (``browser:true``) of a lost connection and return
    their ids: replaying one would deliver its range again from the start, so it ends with an
    error instead and its caller reads the range again (a Spark task is retried)."""
    ids = [sid for sid, sub in machine.subscriptions.items()
           if sub.headers.get("browser") == "true"]
    for sid in ids:
        del machine.subscriptions[sid]
    return ids


def range_read_lost(url: str) -> ClientError:
    return ClientError(f"range read interrupted: the connection to {url} failed over; "
                       "read the range again")


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
            for event in machine.receive_data(data):
                if isinstance(event, ErrorReceived):
                    raise event.error
                if isinstance(event, Connected):
                    sock.settimeout(None)
                    return sock, event
    except TimeoutError:
        sock.close()
        raise ClientError(f"no CONNECTED from {host}:{port} within {timeout}s") from None
    except OSError as exc:
        sock.close()
        raise ClientError(f"cannot connect to {host}:{port}: {exc}") from exc
    except ClientError:
        sock.close()
        raise
    except SluiceError as exc:  # a malformed CONNECTED
        sock.close()
        raise ClientError(f"bad answer from {host}:{port}: {exc}") from exc


class EarlyAcks:
    """Messages the caller acknowledged after the connection that delivered them was lost.

    Such an ACK cannot be sent (the new broker would read the old ack id as one of its own
    deliveries), yet the caller has processed the message: when the new broker redelivers it
    (same subscription, same message-id), the client acknowledges it at once instead of
    handing it out again, so a failover duplicates nothing the caller already acknowledged.
    Bounded: the oldest are forgotten past ``limit`` (a broker that had the ACK before it
    died never redelivers those).
    """

    def __init__(self, limit: int = 65_536) -> None:
        self.limit = limit
        self._keys: dict[tuple[str, str], None] = {}

    def note(self, subscription: str, message_id: str) -> None:
        self._keys[(subscription, message_id)] = None
        if len(self._keys) > self.limit:
            del self._keys[next(iter(self._keys))]

    def take(self, subscription: str, message_id: str | None) -> bool:
        """Is this delivery one the caller already acknowledged? (Forgets it.)"""
        if message_id is None or not self._keys:
            return False
        return self._keys.pop((subscription, message_id), 0) is None
