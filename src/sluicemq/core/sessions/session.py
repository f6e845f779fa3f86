"""One client connection's STOMP conversation: each frame goes to a small handler.

``SessionContext`` (``context.py``) holds the connection's state, its frame loop and its
replies; ``Session`` adds the table below, which names the handler of each client command.
The handlers live beside it, one module per concern: ``connect``, ``send`` (the SEND
pipeline), ``subscribe``, ``acks`` and ``transactions``.

Errors: framing and protocol violations (frames before CONNECT, unknown commands, missing
required headers) are fatal — ERROR, then close, as the STOMP spec says. Semantic errors that
concern one operation (an unknown ack id, an invalid destination, a bad selector, an unknown
transaction) get an ERROR but keep the connection, as ActiveMQ does, so one bad request does
not tear down a producer's other work.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from sluicemq.core.sessions import acks, connect, send, subscribe, transactions
from sluicemq.core.sessions.context import SessionContext
from sluicemq.errors import ProtocolError
from sluicemq.protocol.frames import CLIENT_COMMANDS, Frame

Handler = Callable[[SessionContext, Frame], None]

HANDLERS: Mapping[str, Handler] = {
    "SEND": send.send,
    "SUBSCRIBE": subscribe.subscribe,
    "UNSUBSCRIBE": subscribe.unsubscribe,
    "ACK": acks.ack,
    "NACK": acks.nack,
    "BEGIN": transactions.begin,
    "COMMIT": transactions.commit,
    "ABORT": transactions.abort,
    "DISCONNECT": connect.disconnect,
}


class Session(SessionContext):
    """A connection's session: its state (``SessionContext``) and a handler per command."""

    def dispatch(self, frame: Frame) -> None:
        command = frame.command
        if not self.connected:
            if command in ("CONNECT", "STOMP"):
                connect.connect(self, frame)
                return
            raise ProtocolError(f"expected CONNECT or STOMP, got {command!r}")
        handler = HANDLERS.get(command)
        if handler is None:
            if command in ("CONNECT", "STOMP"):
                raise ProtocolError("already connected")
            what = "a server frame" if command not in CLIENT_COMMANDS else "unsupported"
            raise ProtocolError(f"unknown command {command!r} ({what})")
        if "receipt" in frame.headers and (self.consumers or self.fanins):
            # its RECEIPT follows what earlier frames dispatch to this connection; one that
            # consumes nothing is owed nothing, and its SENDs keep the end-of-turn pass
            # (a 1 GiB stream's producer: 0.6 -> 1.2-1.4 GB/s, its chunks deferred whole)
            self.broker.settle_dispatch()
        handler(self, frame)
