"""What the blocking client hands out: subscriptions, transactions and receipt handles."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING

from sluicemq.client.inbox import Ended, take
from sluicemq.client.machine import ClientMachine, Outgoing
from sluicemq.client.message import Message
from sluicemq.client.producer import DUPLICATE
from sluicemq.client.scope import CommitScope
from sluicemq.errors import ClientError

if TYPE_CHECKING:
    from sluicemq.client.ports import SyncPort


class Subscription:
    """Messages of one SUBSCRIBE, queued by the reader thread; iterate or `get()` them."""

    def __init__(self, client: SyncPort, sub_id: str, destination: str) -> None:
        self.client = client
        self.id = sub_id
        self.destination = destination
        self.active = True
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()

    def get(self, timeout: float | None = None) -> Message | None:
        """The next message, or None on timeout or once the subscription has ended.

        Raises ClientError for a broker ERROR no call claimed (once) or a dead connection.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = None if deadline is None else max(deadline - time.monotonic(), 0)
            try:
                item = self._queue.get(timeout=remaining)
            except queue.Empty:
                return None
            message = take(item, self._queue.put, Message)
            if message is None or not self.client._track.stale(message.epoch, message.ack_mode):
                return message

    def __iter__(self) -> Iterator[Message]:
        while (message := self.get()) is not None:
            yield message

    def unsubscribe(self, durable: bool = False) -> None:
        """Stop deliveries; `durable` also deletes a durable subscription on the broker."""
        if not self.active:
            return
        self.active = False
        try:
            self.client._call(lambda m: m.unsubscribe(self.id, durable=durable))
        finally:
            self.client._forget(self.id)
            self._queue.put(Ended())

    def _deliver(self, item: object) -> None:
        self._queue.put(item)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.active and self.client.is_open:
            self.unsubscribe()


class Transaction(CommitScope):
    """A STOMP transaction: begun on creation, committed on a clean `with` exit, else aborted."""

    def __init__(self, client: SyncPort) -> None:
        self.client = client
        self.finished = False

        def begin(m: ClientMachine) -> Outgoing:
            out = m.begin()
            assert out.ident is not None
            client._track.begun(out.ident)  # under the state lock, like the failover's view
            return out

        out = client._call(begin)
        assert out.ident is not None
        self.id = out.ident

    def send(self, destination: str, body: bytes | str = b"",
             headers: dict[str, str] | None = None, *, persistent: bool = True,
             receipt: bool = False) -> None:
        """Send inside the transaction; no receipt by default since COMMIT's receipt covers it."""
        self.client.send(destination, body, headers, persistent=persistent, receipt=receipt,
                         transaction=self.id)

    def ack(self, message: Message) -> None:
        message.ack(self.id)

    def nack(self, message: Message) -> None:
        message.nack(self.id)

    def commit(self) -> None:
        """COMMIT; raises TransactionRolledBack if a failover lost the transaction (retry)."""
        self._finish(lambda m: m.commit(self.id), committing=True)

    def abort(self) -> None:
        """ABORT; after a failover there is nothing left to abort, so it just ends."""
        self._finish(lambda m: m.abort(self.id), committing=False)

    def _finish(self, build: Callable[[ClientMachine], Outgoing], *, committing: bool) -> None:
        if self.finished:
            raise ClientError(f"transaction {self.id} already finished")
        self.finished = True
        client = self.client
        go: list[bool] = []

        def finish(m: ClientMachine) -> Outgoing:
            go.append(client._track.finishing(self.id, committing))  # may raise: rolled back
            return build(m) if go[0] else Outgoing(b"")

        try:
            client._call(finish)
        except ClientError as exc:
            if committing and go and go[0]:
                raise client._track.commit_failed(self.id, exc, client.is_open) from exc
            raise


class Receipt:
    """Handle of a frame in flight; `result()` waits for its receipt (client timeout by default)
    and raises ClientError if the broker refused it or the connection died first."""

    def __init__(self, future: Future[dict[str, str]], timeout: float,
                 waiters: ReceiptWaiters | None = None) -> None:
        self._future = future
        self._timeout = timeout
        self._waiters = waiters
        self.producer_seq: int | None = None  # the number a numbered SEND went out with

    @property
    def duplicate(self) -> bool:
        """The broker had this producer number stored already and dropped this copy."""
        return self.result().get(DUPLICATE) == "true"

    def done(self) -> bool:
        return self._future.done()

    def when_confirmed(self, callback: Callable[[], None]) -> None:
        """Call back (on the reader thread, or now) once the broker confirmed; never on error."""
        def check(future: Future[dict[str, str]]) -> None:
            if not future.cancelled() and future.exception() is None:
                callback()

        self._future.add_done_callback(check)

    def result(self, timeout: float | None = None) -> dict[str, str]:
        """The RECEIPT's headers (empty when the frame asked for no receipt)."""
        waiters = self._waiters if not self._future.done() else None
        if waiters is not None:
            waiters.enter()
        try:
            return self._future.result(self._timeout if timeout is None else timeout)
        except FutureTimeout:
            raise ClientError("no receipt from the broker in time") from None
        finally:
            if waiters is not None:
                waiters.leave()

    wait = result


class ReceiptWaiters:
    """How many threads wait for a receipt. While any does, the reader thread must keep
    reading (its receipt may sit behind range-read messages), so range readers do not make
    it wait for their callers."""

    def __init__(self, on_enter: Callable[[], None]) -> None:
        self._lock = threading.Lock()
        self._on_enter = on_enter
        self.count = 0

    def enter(self) -> None:
        with self._lock:
            self.count += 1
        self._on_enter()

    def leave(self) -> None:
        with self._lock:
            self.count -= 1


def _nothing() -> None:
    return None
