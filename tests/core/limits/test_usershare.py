"""Spec of the per-user share's book (``UserShares``): body bytes by sender, charged once a
record and given back when its last holder lets go."""

from __future__ import annotations

from array import array
from pathlib import Path

from sluicemq.core.limits import usershare
from sluicemq.core.limits.usershare import UserShares
from sluicemq.storage import records
from sluicemq.storage.journal import Journal

ALICE, BOB = records.encode_owner("alice"), records.encode_owner("bob")
BIG = (4 << 30) - 64  # a body as large as a record allows


def test_a_message_is_charged_to_its_sender_until_it_is_removed() -> None:
    shares = UserShares(100)
    shares.charge(ALICE, 1, 40, 1)
    shares.charge(BOB, 2, 10, 1)
    assert (shares.used(ALICE), shares.used(BOB)) == (40, 10)
    shares.release(1)
    assert shares.used(ALICE) == 0
    shares.release(1)  # removed twice (or never charged): nothing more given back
    shares.release(99)
    assert (shares.used(ALICE), shares.used(BOB)) == (0, 10)


def test_staged_messages_count_until_unstaged_and_show_in_the_view() -> None:
    """A parked part's bytes and messages are its stager's (``stage``) until it is published
    or discarded (``unstage``); the other user is not touched."""
    shares = UserShares(100)
    shares.stage(ALICE, 60, 3)
    assert shares.refusal(ALICE, 41) is not None and shares.refusal(BOB, 41) is None
    assert shares.by_user()["alice"] == {"bytes": 60, "messages": 3}
    shares.unstage(ALICE, 60, 3)
    assert shares.by_user()["alice"] == {"bytes": 0, "messages": 0}


def test_a_record_held_by_several_subscriptions_is_charged_once() -> None:
    """A topic record held by two durable subscriptions counts once, until both let go."""
    shares = UserShares(100)
    shares.charge(ALICE, 5, 30, 2)
    shares.release(5)
    assert shares.used(ALICE) == 30
    shares.release_run(array("Q", [5]))
    assert shares.used(ALICE) == 0


def test_recounting_a_record_adds_its_holders_not_its_bytes() -> None:
    """Start-up charges a record once per queue that holds it."""
    shares = UserShares(100)
    shares.charge(ALICE, 5, 30, 1)
    shares.charge(ALICE, 5, 30, 1)
    assert shares.used(ALICE) == 30
    shares.release(5)
    assert shares.used(ALICE) == 30
    shares.release(5)
    assert shares.used(ALICE) == 0


def test_a_send_that_would_pass_the_share_is_refused_for_that_user_only() -> None:
    shares = UserShares(100)
    shares.charge(ALICE, 1, 90, 1)
    assert shares.refusal(ALICE, 10) is None  # exactly at the share
    assert shares.refusal(ALICE, 11) == (
        "user store limit reached (90 bytes of persistent messages of user 'alice', "
        "user_store_limit 100)")
    assert shares.refusal(BOB, 100) is None
    assert shares.refusal(BOB, 1000) is None  # larger than the share, nothing stored: taken
    assert shares.by_user() == {"alice": {"bytes": 90, "messages": 1}}


def test_records_without_a_sender_are_the_anonymous_users() -> None:
    shares = UserShares(100)
    shares.charge(b"", 1, 7, 1)
    assert shares.by_user() == {"anonymous": {"bytes": 7, "messages": 1}}


def test_the_book_keeps_a_few_bytes_a_message_and_gives_them_back_once_drained() -> None:
    """Six bytes a stored message in a block of 2^16 ids (offset and size), an owner number
    more only where two users' messages share a block; a drained range of ids is dropped."""
    shares = UserShares(1 << 40)
    for mid in range(100_000):
        shares.charge(ALICE, mid, 1024, 1)
    book = shares._held
    assert len(book.blocks) == 2 and book.nbytes() <= 6 * 100_000 * 1.2
    shares.release_run(array("Q", range(99_990)))
    assert shares.used(ALICE) == 10 * 1024
    assert len(book.blocks) == 1 and shares.by_user()["alice"]["messages"] == 10
    for mid in range(99_990, 100_000):
        shares.release(mid)
    assert not book.blocks and shares.used(ALICE) == 0


def test_two_users_in_one_block_out_of_order_and_large_sizes() -> None:
    """Ids charged out of order (a transaction's, a deferred write's), two users sharing a
    block, a body near 4 GiB (a record's limit) and several holders: each keeps its own
    owner, size and count."""
    shares = UserShares(1 << 40)
    for mid in (10, 30, 20, 5):
        shares.charge(ALICE if mid != 20 else BOB, mid, mid, 1)
    shares.charge(BOB, 40, BIG, 2)
    assert (shares.used(ALICE), shares.used(BOB)) == (45, 20 + (BIG))
    assert shares.by_user() == {"alice": {"bytes": 45, "messages": 3},
                                "bob": {"bytes": 20 + (BIG), "messages": 2}}
    for mid in (5, 20, 40, 40):
        shares.release(mid)
    assert (shares.used(ALICE), shares.used(BOB)) == (40, 0)
    shares.charge(BOB, 5, 1, 1)  # an id released earlier, charged again
    assert shares.holders(5) == 1 and shares.used(BOB) == 1


def test_a_block_mostly_released_out_of_order_is_packed() -> None:
    shares = UserShares(1 << 40)
    for mid in range(1000):
        shares.charge(ALICE, mid, 1, 1)
    for mid in range(999, 100, -1):  # newest first: no help from the oldest-entry hint
        shares.release(mid)
    block = next(iter(shares._held.blocks.values()))
    assert len(block.offs) < 1000 and block.live == 101
    assert shares.used(ALICE) == 101 and shares.holders(50) == 1 and shares.holders(500) == 0


def test_start_up_reads_each_records_sender_in_runs_and_large_records_alone(
        tmp_path: Path) -> None:
    """``recount`` reads the owners of a lane's records: neighbours with one extent, a large
    record (``_SMALL``) and one out of order with a peek each, a message inside a transaction
    record at its offset; records without a sender are anonymous's."""
    directory = tmp_path / "journal"
    journal = Journal(directory, segment_bytes=1 << 20)
    list(journal.recover())
    journal.start(lambda seq: None, lambda first, last, exc: None)
    logins = ["alice", "", "bob", "", "carol" * 20]
    for i, login in enumerate(logins):
        body = b"x" * (usershare._SMALL + 1 if i == 2 else 100)
        journal.append(records.MSG, records.encode_message(
            "q:q", i + 1, 0, 0, 4, {}, body, records.encode_owner(login) if login else b""))
    ops = [(records.MSG, records.encode_message("q:q", 10 + k, 0, 0, 4, {}, b"t",
                                                records.encode_owner(f"tx{k}")))
           for k in range(2)]
    journal.append(records.TX, records.encode_tx("tx", ops))
    journal.close()
    reopened = Journal(directory, segment_bytes=1 << 20)
    try:
        found = [(rtype, loc) for rtype, _payload, loc in reopened.recover()]
        msgs = [(loc.segment, loc.offset, loc.length, 0) for rtype, loc in found
                if rtype == records.MSG]
        tx = next(loc for rtype, loc in found if rtype == records.TX)
        inner = records.tx_op_offsets("tx", ops)
        slots = [*msgs, msgs[0], *((tx.segment, tx.offset, tx.length, k) for k in inner)]
        owners = usershare._owners(reopened, slots)
    finally:
        reopened.close()
    assert [records.owner_name(o) for o in owners] == [
        "alice", "anonymous", "bob", "anonymous", "carol" * 20, "alice", "tx0", "tx1"]


def test_a_commit_may_store_what_its_own_acks_free_of_hers() -> None:
    shares = UserShares(100)
    shares.charge(ALICE, 1, 100, 1)
    shares.charge(BOB, 2, 50, 1)
    assert shares.refusal(ALICE, 30) is not None
    assert shares.refusal(ALICE, 30, freed=30) is None  # stores no more than it frees
    assert shares.refusal(ALICE, 30, freed=10) is not None  # 100 - 10 + 30 > 100
    assert shares.refusal(BOB, 60) is not None  # 50 + 60 > 100
    assert shares.refusal(BOB, 60, freed=20) is None  # 50 - 20 + 60 = 90


def test_holders_counts_the_queues_still_holding_a_charged_message() -> None:
    shares = UserShares(1 << 20)
    shares.charge(b"\x01\x00m", 7, 100, 2)
    assert shares.holders(7) == 2
    shares.release(7)
    assert shares.holders(7) == 1
    shares.release(7)
    assert shares.holders(7) == shares.holders(8) == 0


def test_several_messages_get_no_pass_past_an_empty_share() -> None:
    shares = UserShares(100)
    assert shares.refusal(BOB, 1000) is None  # one message larger than the share
    assert shares.refusal(BOB, 100, whole=False) is None
    assert shares.refusal(BOB, 101, whole=False) is not None


def test_the_snapshot_section_names_each_senders_ids_up_to_its_position() -> None:
    """``sharestate``: a block one user filled is one owner, a block two users share lists
    its live ids; a record after the snapshot's position, or an id not in the book, is not
    known (the recount reads those)."""
    from sluicemq.core.limits import sharestate

    shares = UserShares(1 << 40)
    for mid in range(10):
        shares.charge(ALICE, mid, 1, 1)
    for mid in range(1 << 16, (1 << 16) + 10):
        shares.charge(ALICE if mid % 2 else BOB, mid, 1, 1)
    shares.release((1 << 16) + 3)
    data = sharestate.dump(shares.book, shares.logins, (7, 4096))
    import json

    seed = sharestate.load(json.loads(json.dumps(data)))
    assert [seed.owner(mid, 7, 0) for mid in (0, 9)] == [ALICE, ALICE]
    assert seed.owner((1 << 16) + 1, 7, 4096) == ALICE
    assert seed.owner((1 << 16) + 2, 6, 1 << 20) == BOB
    assert seed.owner((1 << 16) + 3, 7, 0) is None  # released before the snapshot
    assert seed.owner(5, 7, 4097) is None and seed.owner(5, 8, 0) is None  # after it
    assert seed.owner(1 << 20, 1, 0) is None  # never in the book


def test_a_lane_one_user_filled_is_charged_column_wise_only_where_the_snapshot_says_so() -> None:
    """``covered`` / ``run_owner`` / ``charge_run``: a lane's slots stored at or before the
    snapshot's position (earlier segments, or its own segment up to its offset), with
    ascending ids in blocks the snapshot gives one owner, are charged at once, as ``charge``
    would; a slot past the position, a block two users share or one not in the snapshot,
    ids out of order, are not (charged one by one instead)."""
    from sluicemq.core.limits import sharestate

    before = UserShares(1 << 40)
    mids = array("Q", [*range(5, 1 << 16, 7), *range((1 << 16) + 1, (1 << 16) + 500)])
    for mid in mids:
        before.charge(ALICE, mid, 3, 1)
    before.charge(BOB, 3 << 16, 3, 1)
    before.charge(ALICE, (3 << 16) + 1, 3, 1)
    seed = sharestate.load(sharestate.dump(before.book, before.logins, (9, 100)))
    sizes = array("I", [3]) * len(mids)
    segs, offs = array("I", [8]) * len(mids), array("Q", range(len(mids)))
    assert seed.covered(segs, offs, 0, len(mids)) == len(mids)
    in_last = array("I", [9]) * 20
    assert seed.covered(in_last, array("Q", range(0, 200, 10)), 0, 20) == 11  # 0..100
    assert seed.covered(in_last, array("Q", range(0, 200, 10)), 12, 20) == 12
    assert seed.covered(array("I", [8, 10, 8]), array("Q", [0, 0, 0]), 0, 3) == 1
    assert seed.run_owner(mids) == ALICE
    assert seed.run_owner(array("Q", [5, 1 << 20])) is None  # a block not in the snapshot
    assert seed.run_owner(array("Q", [(3 << 16) + 1])) is None  # a block two users share
    assert seed.owner((3 << 16) + 1, 9, 0) == ALICE  # (charged one by one)
    assert not UserShares(1).charge_run(ALICE, array("Q", [12, 5]), array("I", [1, 1]))

    after = UserShares(1 << 40)
    assert after.charge_run(ALICE, mids, sizes)
    assert after.by_user() == {"alice": {"bytes": 3 * len(mids), "messages": len(mids)}}
    assert not after.charge_run(ALICE, array("Q", [12]), array("I", [1]))  # not past the newest
    assert not after.charge_run(BOB, array("Q", [(1 << 16) + 600]), array("I", [1]))
    for mid in mids:
        after.release(mid)
    assert after.used(ALICE) == 0 and not after.book.blocks
