"""Producer duplicate detection under kill -9: a producer that pipelines numbered sends and,
after each crash, resends every unconfirmed message under its original number, in order, ends
with every message stored exactly once."""

from __future__ import annotations

import random
import threading
from collections import Counter, deque

from sluice_testing import stored
from sluicemq import Client, ClientError
from sluicemq.client.sync import Receipt

WINDOW = 50
FIRST = 1_000


def test_resending_unconfirmed_numbered_messages_after_kill_9_stores_each_once(broker) -> None:
    rng = random.Random(5)
    pending: deque[tuple[int, str, Receipt | None]] = deque()  # sent, not yet confirmed
    next_body = 0
    for _cycle in range(4):
        killer = threading.Timer(rng.uniform(0.1, 0.6), broker.kill)
        killer.start()
        try:
            with Client(broker.url, producer_id="crash-producer", timeout=5) as c:
                resend, pending = list(pending), deque()
                for seq, text, _ in resend:  # in order, under the original numbers
                    pending.append((seq, text, c.send_async("/queue/dd", text,
                                                            producer_seq=seq)))
                while True:
                    if len(pending) >= WINDOW:
                        receipt = pending[0][2]
                        assert receipt is not None
                        receipt.result()  # confirmed: no resend needed
                        pending.popleft()
                    text = f"m{next_body}"
                    seq = FIRST + next_body  # the producer's own numbering, kept with the text
                    next_body += 1
                    pending.append((seq, text, None))
                    pending[-1] = (seq, text, c.send_async("/queue/dd", text, producer_seq=seq))
        except (ClientError, OSError):
            pass
        killer.join()
        broker.restart()
    with Client(broker.url, producer_id="crash-producer") as c:
        for seq, text, _ in pending:
            c.send("/queue/dd", text, producer_seq=seq)
    seen = Counter(stored(broker.url, "/queue/dd"))
    assert seen == Counter(f"m{i}" for i in range(next_body))
