"""How a session's consumers' messages go out: MESSAGE frames written to its transport.

Why apart from ``context.py``: delivery is what dispatch calls, per message
(``routing.queue.Delivery``), and it has its own knowledge of the transport - whether it keeps
a body it is given by reference (``share_bodies_from``), takes a run of frames at once within
the room it has left (``write_frames``, ``room``), and can tell how much of its output has
left user space (``bytes_written``: what an ack:auto consumer took is journaled as removed,
or given back if the connection ends, by that) - while the context runs the frame loop and
the replies. ``SessionContext`` is a ``Delivering``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from sluicemq.core.routing.message import Message
from sluicemq.core.routing.queue import AUTO, Consumer
from sluicemq.core.sessions.heads import message_head, message_head_12, run_frames_12
from sluicemq.core.sessions.peer import Outbound
from sluicemq.core.sessions.unwritten import Unwritten
from sluicemq.core.streams.chunks import STREAM_ID

if TYPE_CHECKING:
    from sluicemq.core.persistence.storelater import StoreLater
    from sluicemq.core.routing.broker import Broker

LARGE_BODY = 65536  # a body this large is never copied into its frame (one write for the
# head, one for the body); a transport that keeps what it is given by reference may ask for
# smaller ``bytes`` bodies to go out that way too (``share_bodies_from``, see deliver)


class Delivering:
    """A connection's MESSAGE frames out; the connection's state is ``SessionContext``'s."""

    broker: Broker
    out: Outbound
    version: str
    closed: bool
    consumers: dict[str, Consumer]

    def _start_delivery(self, out: Outbound, later: StoreLater) -> None:
        self._share_from: int = getattr(out, "share_bodies_from", LARGE_BODY)
        # a transport that takes several frames at once, within the room it has left, gets
        # a consumer's messages in runs (deliver_run)
        self._write_frames: Callable[[list[bytes], int], None] | None = getattr(
            out, "write_frames", None)
        self._room: Callable[[], int] | None = getattr(out, "room", None)
        # a transport that can tell how much of its output left user space holds back the
        # journaled removal of stored messages an ack:auto consumer takes until then
        self._written: Callable[[], int] | None = getattr(out, "bytes_written", None)
        self.unwritten = Unwritten(later)  # and gives back their messages if it ends
        self.delivered = 0
        self._output_waiters: list[Callable[[], None]] = []

    @property
    def writable(self) -> bool:
        return self.out.writable and not self.closed

    def deliver(self, consumer: Consumer, msg: Message) -> None:
        self.delivered += 1
        body = msg.body if msg.body is not None else self.broker.body_of(msg)
        resumed = bool(consumer.resumed) and msg.group in consumer.resumed
        if resumed:
            consumer.resumed.discard(msg.group)
        head = None
        if self.version == "1.2":
            try:
                head = message_head_12(consumer, msg, len(body), resumed)
            except ValueError:  # a NUL: the general path drops that header
                head = None
        if head is None:
            head = message_head(consumer, msg, body, self.version, resumed)
        if msg.group is not None and STREAM_ID in msg.headers:
            self.broker.large_streams.delivered(msg)
        # Why a body may go out uncopied below LARGE_BODY: a topic message fanned out to peers
        # that stopped reading is then held once by their transports, not once per subscriber
        # in a frame of its own (200 stuck subscribers of 16 KiB messages held ~64 MiB of
        # copies of some twenty bodies). A memoryview is still copied: it may be a slice of a
        # span read back from the journal, and a transport holding it would hold the whole span.
        size = len(body)
        if size < self._share_from or (size < LARGE_BODY and type(body) is not bytes):
            self.out.write(b"".join((head, body, b"\x00")))
        else:  # the body goes out without another copy
            self.out.write(head)
            self.out.write(body)
            self.out.write(b"\x00")
        if msg.ticket is None and msg.persistent and self.broker.later.entries:
            # deferred (concurrent store and dispatch): ack:auto settles once the bytes are out,
            # a large body's store delay counts from their arrival (storelater.py); a transport
            # that cannot tell what its peer has (WebSocket) never settles an ack:auto one
            acked = getattr(self.out, "bytes_acked", _unknown)
            end = getattr(self.out, "bytes_out", 0)
            self.broker.later.sent(msg, consumer, (acked, end), auto=consumer.ack_mode == AUTO)
        if consumer.ack_mode == AUTO and self._written is not None and consumer.queue.durable:
            self.unwritten.add(consumer, msg, getattr(self.out, "bytes_out", 0))

    def deliver_run(self, consumer: Consumer, msgs: list[Message]) -> int:
        """``Delivery.deliver_run``: to a transport that takes whole runs (TCP), as frames
        built together (``run_frames_12``) and written with one call, until it has no room;
        a message a run cannot carry goes through ``deliver``."""
        write_frames, room = self._write_frames, self._room
        deferring = bool(self.broker.later.entries)
        done, count = 0, len(msgs)
        while done < count and self.out.writable and not self.closed:
            if write_frames is not None and room is not None and self.version == "1.2":
                frames, nbytes = run_frames_12(consumer, msgs, done, room(), self._share_from,
                                               deferring)
                if frames:
                    write_frames(frames, nbytes)
                    if self._written is not None and consumer.queue.durable:
                        self.unwritten.add_run(consumer, msgs[done:done + len(frames)],
                                               frames, getattr(self.out, "bytes_out", 0))
                    done += len(frames)
                    self.delivered += len(frames)
                    continue
            msg = msgs[done]
            msg.deliveries += 1
            self.deliver(consumer, msg)
            done += 1
        return done

    def written_mark(self) -> tuple[Callable[[], int], int] | None:
        """``Delivery.written_mark``: how many bytes of this connection have left user space
        (a function), and where its output ends now; None when the transport cannot say."""
        written = self._written
        if written is None:
            return None
        return written, getattr(self.out, "bytes_out", 0)

    def when_writable(self, resume: Callable[[], None]) -> None:
        """Call ``resume`` once the transport has drained (paced writers: range reads)."""
        self._output_waiters.append(resume)

    def output_ready(self) -> None:
        """The transport drained below its low-water mark: feed consumers and writers again."""
        for consumer in self.consumers.values():
            self.broker.schedule_dispatch(consumer.queue)
        waiting, self._output_waiters = self._output_waiters, []
        for resume in waiting:
            resume()


def _unknown() -> int:
    """Bytes a transport's peer acknowledged, where the transport cannot know: none."""
    return -1
