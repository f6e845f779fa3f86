"""Spec of the per-user share of the store (``[limits] user_store_limit``) and staged
publishing (``sluice-stage``): a parked part's messages are stored from its records' write on,
so they count against the share of the user who staged them - until the part is discarded
(ABORT, a newer attempt, ``stage_timeout``) or published, when each message is charged as a
stored SEND's is, and her consumer's acknowledgements give the room back. A restart (clean or
kill -9) finds her parts and published messages charged to her again. Another user's share is
neither used nor freed by anything she stages.

``mallory`` may write only ``/queue/m.>``, ``alice`` only ``/queue/a.>``; each may store 64 KiB
of persistent messages, and ``/queue/m.strict.>`` refuses past it (``fail_if_no_space``).
"""

from __future__ import annotations

from typing import Any

import pytest
from accounts import NEIGHBOUR_RULES, NEIGHBOURS

from sluicemq import Client, ClientError

CONFIG = """
[limits]
user_store_limit = "64 KiB"

[[policy]]
queue = "m.strict.>"
fail_if_no_space = true

[[policy]]
queue = "a.strict.>"
fail_if_no_space = true
""" + NEIGHBOURS.config(NEIGHBOUR_RULES, delay=0.1, max_failures=10)

BODY = b"m" * 4096
FIT = 16  # 16 x 4 KiB fill the 64 KiB share
SHARE = ("user store limit reached (65536 bytes of persistent messages of user 'mallory', "
         "user_store_limit 65536)")


def stage_fill(c: Client, batch: str = "b1", count: int = FIT) -> None:
    """``count`` x 4 KiB (by default her whole share) as part p0 of ``batch``."""
    with c.stage("sink", batch, "p0") as part:
        for i in range(count):
            part.send("/queue/m.staged", BODY, {"n": str(i)})
    assert (part.result, part.messages) == ("staged", count)


def refused(c: Client) -> str:
    """The ERROR a persistent SEND to a strict queue of hers gets (she is at her share)."""
    with pytest.raises(ClientError) as info:
        c.send("/queue/m.strict.q", BODY, persistent=True)
    return str(info.value)


def her_share_stays_full_across_restarts(broker: Any) -> None:
    """A clean restart, then kill -9: each finds mallory's share full again (what she staged
    or published is counted from the records that name her)."""
    for restart in ("clean", "kill -9"):
        if restart == "clean":
            assert broker.stop() == 0
        else:
            broker.kill()
        broker.restart()
        with NEIGHBOURS.login(broker, "mallory") as m:
            assert SHARE in refused(m)


def test_a_parked_part_counts_against_her_share_until_it_is_aborted(
        broker_factory: Any) -> None:
    """A part she staged is hers: a SEND past the share is refused, a second part's SEND too,
    while alice sends and stages her own 64 KiB; her ABORT gives the room back."""
    broker = broker_factory(config_text=CONFIG)
    with NEIGHBOURS.login(broker, "mallory") as m, NEIGHBOURS.login(broker, "alice") as a:
        stage_fill(m)
        assert SHARE in refused(m)
        with pytest.raises(ClientError, match="stored 0 of 1 messages"), \
                m.stage("sink", "b2", "p0") as more:
            more.send("/queue/m.strict.staged", BODY)
        with a.stage("sink", "a1", "p0") as theirs:  # alice's share is her own
            for _ in range(FIT):
                theirs.send("/queue/a.staged", BODY)
        assert "of user 'alice'" in _refused_to(a, "/queue/a.strict.q")
        assert m.abort_stage("sink", "b1") == 1
        m.send("/queue/m.strict.q", BODY, persistent=True)  # room again
        assert a.abort_stage("sink", "a1") == 1


def _refused_to(c: Client, dest: str) -> str:
    with pytest.raises(ClientError) as info:
        c.send(dest, BODY, persistent=True)
    return str(info.value)


def test_a_publication_keeps_her_charged_until_her_consumer_acknowledges(
        broker_factory: Any) -> None:
    """Publishing moves the part's bytes onto its messages: still at her share (also after a
    clean restart and after kill -9, counted from the records that name her), and her
    consumer's acknowledgements give the room back."""
    broker = broker_factory(config_text=CONFIG)
    with NEIGHBOURS.login(broker, "mallory") as m:
        stage_fill(m)
        assert m.publish_stage("sink", "b1", ["p0"]) == ("published", FIT)
        assert SHARE in refused(m)
    her_share_stays_full_across_restarts(broker)
    with NEIGHBOURS.login(broker, "mallory") as m:
        sub = m.subscribe("/queue/m.staged", ack="client-individual")
        for i in range(FIT):
            msg = sub.get(timeout=30)
            assert msg is not None and msg.headers["n"] == str(i)
            msg.ack()
        m.send("/queue/m.strict.q", BODY, persistent=True)


def test_a_parked_part_stays_charged_across_restarts_and_leaves_with_a_newer_attempt(
        broker_factory: Any) -> None:
    """A parked part found again by a restart is hers again; staging the same part again
    replaces the attempt (charged once, not twice), and publishing one of two parts gives
    the other part's bytes back."""
    broker = broker_factory(config_text=CONFIG)
    with NEIGHBOURS.login(broker, "mallory") as m:
        stage_fill(m)
    her_share_stays_full_across_restarts(broker)
    with NEIGHBOURS.login(broker, "mallory") as m:
        assert m.abort_stage("sink", "b1") == 1
        for _ in range(2):  # the same part twice: the second attempt replaces the first
            stage_fill(m, count=FIT // 4)  # (both count until its COMMIT parks it)
        for _ in range(FIT - FIT // 4 - 1):  # so 4 KiB of her share are still free
            m.send("/queue/m.strict.q", BODY, persistent=True)
        with m.stage("sink", "b1", "p1") as last:  # a second part: one byte
            last.send("/queue/m.staged", b"s")
        assert "(61441 bytes of persistent messages of user 'mallory'" in refused(m)
        assert m.publish_stage("sink", "b1", ["p1"]) == ("published", 1)  # p0 discarded
        for _ in range(FIT // 4):
            m.send("/queue/m.strict.q", BODY, persistent=True)
        assert "(61441 bytes of persistent messages of user 'mallory'" in refused(m)


def test_a_column_batch_part_names_her_in_each_row_and_is_hers_after_kill_9(
        broker_factory: Any) -> None:
    """A part of column batches (``sluice-format:columns``): its rows are charged when the
    batch is journaled, and each row's record names her, so after publication and kill -9
    the recount finds her at her share; acknowledging the messages gives it back."""
    from sluicemq.protocol.columns import ColumnWriter

    writer = ColumnWriter()
    for i in range(FIT):
        writer.add(0, 0, 0, 4, 0, b'{"n":"%d"}' % i, BODY)
    batch = b"".join(writer.finish())
    broker = broker_factory(config_text=CONFIG)
    with NEIGHBOURS.login(broker, "mallory") as m:
        with m.stage("sink", "cols", "p0") as part:
            part.send_batch("/queue/m.cols", batch, FIT)
        assert (part.result, part.messages) == ("staged", FIT)
        assert SHARE in refused(m)
        assert m.publish_stage("sink", "cols", ["p0"]) == ("published", FIT)
    broker.kill()
    broker.restart()
    with NEIGHBOURS.login(broker, "mallory") as m:
        assert SHARE in refused(m)
        sub = m.subscribe("/queue/m.cols", ack="client-individual")
        for i in range(FIT):
            msg = sub.get(timeout=30)
            assert msg is not None and msg.headers["n"] == str(i) and msg.body == BODY
            msg.ack()
        m.send("/queue/m.strict.q", BODY, persistent=True)
