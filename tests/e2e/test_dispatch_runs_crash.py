"""Spec: a kill -9 in the middle of a dispatch run loses no message and reorders none.

A queue's backlog of persistent messages (stored before anyone subscribed) goes to a lone
consumer; the broker is killed (-9) at a point the consumer decides - right after it read its
``k``-th message - and started again, three times over, then the rest is drained. With
``ack:auto`` the consumer is served in runs (``PendingList.take``, ``deliver_run``,
``run_frames_12``; small bodies, no groups), its reads are its acknowledgements, and it reads on
after the kill until the connection ends (what the kernel still held for it was handed over);
with ``client`` (cumulative) and ``client-individual`` every message is ACKed, every 16th
ACK with a receipt. After each restart:

* a message whose ACK was receipted never comes back;
* every other message the consumer did not have comes back exactly once, in queue order - a
  read (auto) or ACKed-but-unreceipted one may come back too (its removal was not on disk yet),
  at most once and in its place;
* nothing is lost across the cycles: the final drain ends with every message accounted for -
  except, with ``ack:auto``, what the killed broker had handed to the connection but not yet
  written to its socket: the run's removal is journaled as the run is handed over, so up to
  the connection's output share (and the frame that crosses it) right after the consumer's
  last message may be gone (a known gap, README Status; 34 messages in one in-memory run
  here). Client acks, either kind, lose nothing.

Backlogs from memory and paged out after a restart (the cursor's tail, refilled in batches).
"""

from __future__ import annotations

import pytest

from sluice_testing import BrokerProcess, RawStomp
from sluicemq.protocol.codec import encode_frame
from sluicemq.protocol.frames import Frame

COUNT = 2400
KILL_AFTER = (1, 300, 1100)  # messages read before each kill: a run's first, later ones
RECEIPT_EVERY = 16
# A connection may hold 32 KiB unsent: runs stop part way, so the broker holds frames of a
# run when it is killed; the window pages most of the backlog out
OUTPUT_SHARE = 32 << 10
FRAME_HEAD = 100  # a MESSAGE frame's command and headers here, at least
CONFIG = ('[limits]\noutput_buffer_bytes = "32 KiB"\n'
          '[[policy]]\nqueue = "crash.>"\ncursor_window = 400\n')


def _body(n: int) -> bytes:
    """Small bodies (a run carries them), each naming its number."""
    return str(n).encode().rjust(10, b".") * (40 + n % 90)


def produce(b: BrokerProcess, destination: str, count: int, batch: int = 400) -> None:
    """Persistent SENDs numbered ``n``, pipelined, a receipt per batch."""
    p = RawStomp(b.host, b.port, timeout=60)
    p.connect()
    for start in range(0, count, batch):
        stop = min(start + batch, count)
        frames = [encode_frame(Frame("SEND", {"destination": destination, "persistent": "true",
                                              "n": str(n)}, _body(n)))
                  for n in range(start, stop - 1)]
        frames.append(encode_frame(Frame("SEND", {"destination": destination,
                                                  "persistent": "true", "n": str(stop - 1),
                                                  "receipt": str(stop)}, _body(stop - 1))))
        p.send_bytes(b"".join(frames))
        answer = p.recv(timeout=60)
        assert answer.command == "RECEIPT" and answer.headers["receipt-id"] == str(stop), answer
    p.close()


class Ledger:
    """What the test knows of each message: certainly gone (an ACK receipted), perhaps gone
    (read with auto acks, or ACKed without a receipt yet), or still the queue's."""

    def __init__(self, count: int) -> None:
        self.gone: set[int] = set()
        self.maybe: set[int] = set()
        self.count = count
        self.at_risk: set[int] = set()  # (auto) what the killed broker may have held unsent
        self.lost: list[int] = []

    def killed_after(self, last: int) -> None:
        """The broker was killed with ``last`` the newest message an auto-ack consumer got:
        the messages after it that fit in its connection's output share may have been handed
        to the connection, their removal journaled, yet never written (the known gap)."""
        held = 0  # a run takes frames while it holds less than the share: one may cross it
        for n in range(last + 1, self.count):
            if held >= OUTPUT_SHARE:
                break
            self.at_risk.add(n)
            held += len(_body(n)) + FRAME_HEAD

    def owed(self) -> list[int]:
        """The messages that must still come, in queue order."""
        return [n for n in range(self.count) if n not in self.gone and n not in self.maybe]

    def check_next(self, n: int, seen: list[int]) -> None:
        """A delivery after a restart: in order, never twice, none owed skipped. A message
        perhaps gone that the queue passed over is gone (its removal was on disk)."""
        assert n not in self.gone, f"{n} came back although it was gone"
        assert not seen or n > seen[-1], f"{n} after {seen[-1]}: reordered or repeated"
        passed = [m for m in range(seen[-1] + 1 if seen else 0, n) if m not in self.gone]
        skipped = [m for m in passed if m not in self.maybe]
        assert self.at_risk.issuperset(skipped), f"{skipped[:5]}... skipped before {n}: lost"
        self.lost += skipped
        self.gone.update(passed)
        self.maybe.difference_update(passed)
        seen.append(n)
        self.at_risk.clear()


def consume_and_kill(b: BrokerProcess, destination: str, ack: str, ledger: Ledger,
                     kill_after: int) -> None:
    """Subscribe, take ``kill_after`` messages (each checked against the ledger), kill -9."""
    c = RawStomp(b.host, b.port, timeout=30)
    c.connect()
    c.send("SUBSCRIBE", {"destination": destination, "id": "s", "ack": ack, "receipt": "sub"})
    first = c.recv()
    assert first.command == "RECEIPT", first
    seen: list[int] = []
    acked: list[int] = []  # ACKs sent, in order; a receipt covers every one before it
    settled = 0
    while len(seen) < kill_after:
        frame = c.recv(timeout=30)
        if frame.command == "RECEIPT":
            upto = int(frame.headers["receipt-id"])
            ledger.gone.update(acked[settled:upto])
            ledger.maybe.difference_update(acked[settled:upto])
            settled = upto
            continue
        assert frame.command == "MESSAGE", frame
        n = int(frame.headers["n"])
        ledger.check_next(n, seen)
        assert frame.body == _body(n)
        ledger.maybe.add(n)
        if ack != "auto":
            acked.append(n)
            headers = {"id": frame.headers["ack"]}
            if len(acked) % RECEIPT_EVERY == 0:
                headers["receipt"] = str(len(acked))
            c.send("ACK", headers)
    b.kill()
    if ack == "auto":  # what was on its way is the consumer's: read it to the end
        try:
            while True:
                frame = c.recv(timeout=30)
                if frame.command == "MESSAGE":
                    n = int(frame.headers["n"])
                    ledger.check_next(n, seen)
                    ledger.maybe.add(n)
        except (ConnectionError, OSError):
            pass
        ledger.killed_after(seen[-1])
    c.close()


def drain(b: BrokerProcess, destination: str, ledger: Ledger) -> list[int]:
    """Every message left, behind a marker sent now (auto acks, served in runs)."""
    c = RawStomp(b.host, b.port, timeout=30)
    c.connect()
    c.send("SUBSCRIBE", {"destination": destination, "id": "d", "ack": "auto", "receipt": "s"})
    assert c.recv().command == "RECEIPT"
    p = RawStomp(b.host, b.port, timeout=30)
    p.connect()
    p.send("SEND", {"destination": destination, "persistent": "true", "n": "end",
                    "receipt": "end"}, b"")
    assert p.recv().command == "RECEIPT"
    p.close()
    seen: list[int] = []
    while True:
        frame = c.recv(timeout=30)
        if frame.headers["n"] == "end":
            break
        n = int(frame.headers["n"])
        ledger.check_next(n, seen)
        assert frame.body == _body(n)
    c.close()
    return seen


@pytest.mark.parametrize("backlog", ["in memory", "paged out after a restart"])
@pytest.mark.parametrize("ack", ["auto", "client", "client-individual"])
def test_kill_9_mid_run_loses_nothing_and_keeps_the_order(broker_factory, ack: str,
                                                          backlog: str) -> None:
    b = broker_factory(config_text=CONFIG)
    destination = f"/queue/crash.{ack}"
    produce(b, destination, COUNT)
    if backlog != "in memory":
        b.stop()
        b.restart()
    ledger = Ledger(COUNT)
    for kill_after in KILL_AFTER:
        consume_and_kill(b, destination, ack, ledger, kill_after)
        b.restart()
    left = drain(b, destination, ledger)
    owed = ledger.owed()
    assert set(owed) <= set(left), f"lost after kill -9: {sorted(set(owed) - set(left))[:10]}"
    assert ledger.gone.isdisjoint(left)
    if ack != "auto":
        assert ledger.gone, "ACK receipts came before the kills"
        assert not ledger.lost
