"""When and where to (re)connect: the schedule of a failover URL, sans-IO.

Both clients follow one `Reconnect` plan, so that what ActiveMQ's failover options mean here
(``randomize``, ``initialReconnectDelay``, ``maxReconnectDelay``, ``useExponentialBackOff``,
``backOffMultiplier``, ``maxReconnectAttempts``, ``startupMaxReconnectAttempts``) is decided
in one place and tested with a fake clock; a driver only dials, sleeps and reports failures.

A round tries every broker of the URL once (in a fresh random order with ``randomize``),
without waiting in between; after a failed round the plan waits the back-off of the attempts
so far before the next round. The first connection is bounded by the client's ``timeout``
and ``startupMaxReconnectAttempts``; a failover after a lost connection by
``maxReconnectAttempts`` (-1: until the client is closed).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from sluicemq.client.machine import Connected, ErrorReceived, Event
from sluicemq.client.url import Address, BrokerList
from sluicemq.errors import ClientError, SluiceError


@dataclass(frozen=True, slots=True)
class Dial:
    """Connect to ``address`` now, giving up on it after ``timeout`` seconds."""

    address: Address
    timeout: float


@dataclass(frozen=True, slots=True)
class Pause:
    """Wait ``seconds`` before asking for the next step (the back-off between rounds)."""

    seconds: float


@dataclass(frozen=True, slots=True)
class GiveUp:
    """No more attempts: raise (first connection) or fail the client (failover)."""


Step = Dial | Pause | GiveUp


class Reconnect:
    """The steps of one connection effort: call `next()` first and after every failed dial."""

    def __init__(self, brokers: BrokerList, *, timeout: float, startup: bool,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.brokers = brokers
        self.options = brokers.failover
        self.timeout = timeout
        self.startup = startup
        self.attempts = 0  # dials handed out so far
        self._clock = clock
        self._deadline = clock() + timeout if startup else None
        self._round: list[Address] = brokers.ordered()
        self._paused = False

    def next(self) -> Step:
        options = self.options
        if self.attempts and options is None:
            return GiveUp()  # a plain URL gets exactly one attempt
        if options is not None and not self.startup \
                and 0 <= options.maxReconnectAttempts <= self.attempts:
            return GiveUp()
        if not self._round:
            if self._paused:
                self._paused = False
                self._round = self.brokers.ordered()
            else:
                if self._give_up_startup():
                    return GiveUp()
                self._paused = True
                assert options is not None
                return Pause(min(options.backoff(self.attempts), self._remaining()))
        if self.startup and self.attempts and self._remaining() <= 0:
            return GiveUp()
        self.attempts += 1
        address = self._round.pop(0)
        timeout = max(self._remaining(), 0.001) if self.startup else self.timeout
        return Dial(address, timeout)

    def _give_up_startup(self) -> bool:
        if not self.startup:
            return False
        assert self.options is not None
        limit = self.options.startupMaxReconnectAttempts
        return 0 <= limit < self.attempts or self._remaining() <= 0

    def _remaining(self) -> float:
        if self._deadline is None:
            return float("inf")
        return self._deadline - self._clock()


def connected_in(events: list[Event]) -> Connected | None:
    """The CONNECTED among events read during a handshake; a broker ERROR is raised."""
    for event in events:
        if isinstance(event, ErrorReceived):
            raise event.error
        if isinstance(event, Connected):
            return event
    return None


def handshake_failed(exc: OSError | SluiceError, address: Address, timeout: float) -> ClientError:
    """The error a failed handshake with ``address`` raises (the broker's own ERROR is raised
    as sent instead): one that names the broker and what went wrong."""
    _, host, port = address
    if isinstance(exc, TimeoutError):
        return ClientError(f"no CONNECTED from {host}:{port} within {timeout}s")
    if isinstance(exc, OSError):
        return ClientError(f"cannot connect to {host}:{port}: {exc}")
    return ClientError(f"bad answer from {host}:{port}: {exc}")  # a malformed CONNECTED
