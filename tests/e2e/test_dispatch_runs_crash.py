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
* every message the consumer did not have comes back exactly once, in queue order;
* one it had may come back too, at most once and in its place, only while its removal was not
  on disk at the kill: ACKed without a receipt yet (client acks), or read (auto) with its
  removal - journaled once its frame's bytes left the broker's user space for the kernel, synced
  with the journal's next batch - not yet synced. That includes what the kernel still held for
  the consumer at the kill: it reads those after the kill (at least once, never lost);
* nothing is lost across the cycles: the final drain ends with every message accounted for,
  in both ack modes. (Before the removal of an auto-acked stored message waited for its bytes,
  what the killed broker had handed to the connection but not yet written was lost: 34
  messages of one in-memory run.)

Backlogs from memory and paged out after a restart (the cursor's tail, refilled in batches).
"""

from __future__ import annotations

import pytest

from sluice_testing import BrokerProcess, RawStomp, produce

COUNT = 2400
KILL_AFTER = (1, 300, 1100)  # messages read before each kill: a run's first, later ones
RECEIPT_EVERY = 16
# A connection may hold 32 KiB unsent: runs stop part way, so the broker holds frames of a
# run when it is killed; the window pages most of the backlog out
# The consumer's kernel takes little ahead of it: its TCP window fills, and the broker's own
# buffers hold frames (up to the output share) at every kill, not only now and then
CONSUMER_RCVBUF = 8192
CONFIG = ('[limits]\noutput_buffer_bytes = "32 KiB"\n'
          '[[policy]]\nqueue = "crash.>"\ncursor_window = 400\n')


def _body(n: int) -> bytes:
    """Small bodies (a run carries them), each naming its number."""
    return str(n).encode().rjust(10, b".") * (40 + n % 90)


class Ledger:
    """What the test knows of each message: certainly gone (an ACK receipted), perhaps gone
    (read with auto acks, or ACKed without a receipt yet), or still the queue's."""

    def __init__(self, count: int) -> None:
        self.gone: set[int] = set()
        self.maybe: set[int] = set()
        self.count = count

    def owed(self) -> list[int]:
        """The messages that must still come, in queue order."""
        return [n for n in range(self.count) if n not in self.gone and n not in self.maybe]

    def check_next(self, n: int, seen: list[int]) -> None:
        """A delivery after a restart: in order, never twice, none owed skipped. A message
        perhaps gone that the queue passed over is gone (its removal was on disk); one that
        comes is the queue's again (it may come back once more only after another kill)."""
        assert n not in self.gone, f"{n} came back although it was gone"
        assert not seen or n > seen[-1], f"{n} after {seen[-1]}: reordered or repeated"
        passed = [m for m in range(seen[-1] + 1 if seen else 0, n) if m not in self.gone]
        skipped = [m for m in passed if m not in self.maybe]
        assert not skipped, f"{skipped[:5]}... skipped before {n}: lost"
        self.gone.update(passed)
        self.maybe.difference_update(passed)
        self.maybe.discard(n)
        seen.append(n)


def stalled(b: BrokerProcess, destination: str) -> None:
    """Wait until the broker hands the consumer, which stopped reading, nothing more (its
    socket and the broker's buffers for it are full) and all it appended is on disk: receipts
    (asked for on a second connection, each after a sync) until the queue's ``dequeued`` count
    stays the same across one. A removal journaled for frames not yet written would then be
    on disk at the kill and those messages gone - every time, not now and then."""
    p = RawStomp(b.host, b.port, timeout=30)
    p.connect()
    last = -1
    for round_ in range(50):
        p.send("SEND", {"destination": "/queue/crash.sync", "receipt": str(round_)}, b"")
        answer = p.recv()
        assert answer.command == "RECEIPT", answer
        dequeued = b.api(f"destinations/queue/{destination.split('/')[-1]}")["dequeued"]
        if dequeued == last:
            break
        last = dequeued
    else:
        raise AssertionError("the broker kept handing the consumer messages")
    p.close()


def consume_and_kill(b: BrokerProcess, destination: str, ack: str, ledger: Ledger,
                     kill_after: int) -> None:
    """Subscribe, take ``kill_after`` messages (each checked against the ledger), kill -9."""
    c = RawStomp(b.host, b.port, timeout=30, rcvbuf=CONSUMER_RCVBUF)
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
    stalled(b, destination)
    b.kill()
    if ack == "auto":  # what the kernel held for it is the consumer's: read it to the end
        try:
            while True:
                frame = c.recv(timeout=30)
                if frame.command == "MESSAGE":
                    n = int(frame.headers["n"])
                    ledger.check_next(n, seen)
                    assert frame.body == _body(n)
                    ledger.maybe.add(n)
        except (ConnectionError, OSError):
            pass
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
    produce(b, destination, COUNT, headers=lambda n: {"n": str(n)}, body=_body, batch=400)
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
    assert len(ledger.gone) + len(left) + len(ledger.maybe) == COUNT, "every message accounted"
    if ack != "auto":
        assert ledger.gone, "ACK receipts came before the kills"
