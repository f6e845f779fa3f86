"""What the client's protocol machine (client/machine.py) costs a received MESSAGE and its
ACK, in process: 1 KiB MESSAGE frames of a client-individual subscription fed in 64 KiB reads,
each acknowledged without a receipt (no sockets, no broker). Prints ns a message, the best of
``--rounds`` runs, so an A/B of the machine alone is a few seconds:

    PYTHONPATH=<a copy>/src .venv/bin/python bench/machine_cost.py   # A, then B, interleaved
"""

from __future__ import annotations

import argparse
import time

from sluicemq.client.machine import ClientMachine, MessageReceived
from sluicemq.protocol.codec import encode_frame
from sluicemq.protocol.frames import Frame


def one_run(count: int) -> float:
    m = ClientMachine(host="h", heartbeat=(0, 0))
    m.connect()
    m.receive_data(encode_frame(Frame("CONNECTED", {"version": "1.2"}), "1.2"))
    m.subscribe("/queue/q", ack="client-individual", id="s", receipt=False)
    frames = b"".join(
        encode_frame(Frame("MESSAGE", {"subscription": "s", "message-id": f"m{i}",
                                       "ack": f"a{i}", "destination": "/queue/q"},
                           b"x" * 1024), "1.2")
        for i in range(count))
    start = time.perf_counter()
    for at in range(0, len(frames), 65536):
        for event in m.receive_data(frames[at:at + 65536]):
            assert isinstance(event, MessageReceived)
            m.ack(event.ack_id, event.subscription)
    return (time.perf_counter() - start) / count * 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(f"{min(one_run(args.count) for _ in range(args.rounds)):.0f}")


if __name__ == "__main__":
    main()
