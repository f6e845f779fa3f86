"""Spec of limits and producer flow control decisions (core/paging/flow.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice_testing import mounted
from sluicemq.config import BrokerConfig, Limits, Policy
from sluicemq.core.paging.flow import (
    MAX_POLICY_SIZES,
    FlowControl,
    GiB,
    MemoryAccount,
    MiB,
    Pacing,
    ResolvedLimits,
    TooLarge,
    parse_size,
    physical_memory,
    resolve_limits,
    user_store_limit,
)


def test_sizes_are_bytes_or_human_strings() -> None:
    assert parse_size(1234) == 1234
    assert parse_size("512 MiB") == 512 * MiB
    assert parse_size("2GB") == 2 * 10**9
    assert parse_size("100k") == 100 << 10
    assert parse_size("1.5 GiB") == int(1.5 * GiB)
    with pytest.raises(ValueError):
        parse_size("lots")


def test_unset_limits_are_derived_from_the_machine(tmp_path: Path) -> None:
    r = resolve_limits(Limits(), tmp_path / "not-yet-created")
    assert 64 * MiB <= r.memory <= 2 * GiB
    assert 0 < r.store <= 1 << 40 and 0 < r.temp <= 100 * GiB
    assert r.max_message == Limits().max_frame_bytes
    given = resolve_limits(Limits(memory_limit="64 MiB", store_limit=10**9, temp_limit="1GiB",
                                  max_message_bytes="1 MiB"), tmp_path)
    assert given == ResolvedLimits(64 * MiB, 10**9, GiB, MiB)


def test_a_filesystem_without_a_size_bounds_the_store_by_half_the_ram(tmp_path: Path) -> None:
    """ramfs reports 0 bytes, total and free: the defaults must not become 0 (every
    persistent SEND would wait for room forever) - its files take RAM, so half of it counts
    as the free disk."""
    with mounted(tmp_path / "ramfs", "ramfs") as mnt:
        r = resolve_limits(Limits(), mnt / "data")
    half = physical_memory() // 2
    assert (r.store, r.temp) == (int(half * 0.9), min(100 * GiB, half // 2))


def test_limits_and_policies_come_from_toml(tmp_path: Path) -> None:
    cfg = tmp_path / "b.toml"
    cfg.write_text('[limits]\nmemory_limit = "32 MiB"\n'
                   '[[policy]]\nqueue = "vm.>"\ncursor = "vm"\nmemory_limit = "1 MiB"\n'
                   'fail_if_no_space = true\nmax_consumers = 2\n')
    config = BrokerConfig.load(cfg)
    assert config.limits.memory_limit == "32 MiB"
    p = config.policy_for("queue", "vm.a")
    assert (p.cursor, p.memory_limit, p.fail_if_no_space, p.max_consumers) == (
        "vm", "1 MiB", True, 2)
    assert config.policy_for("queue", "other").cursor == "store"


class Usage:
    def __init__(self) -> None:
        self.store = 0
        self.temp = 0
        self.unwritten = 0


def flow_with(usage: Usage, memory: MemoryAccount) -> FlowControl:
    return FlowControl(ResolvedLimits(memory=memory.limit, store=1000, temp=500,
                                      max_message=100, journal_backlog=300),
                       memory, lambda: usage.store, lambda: usage.temp,
                       unwritten=lambda: usage.unwritten)


def test_persistent_sends_wait_while_the_journal_is_behind_the_disk() -> None:
    """Records accepted but not yet written are RAM: past journal_backlog, persistent SENDs
    wait (and resume on the next durability report); non-persistent ones are not held."""
    usage, memory = Usage(), MemoryAccount(10_000)
    flow = flow_with(usage, memory)
    usage.unwritten = 300
    assert "journal writes behind" in (flow.full(Policy(), True, 0) or "")
    assert flow.full(Policy(), False, 0) is None
    usage.unwritten = 299
    assert flow.full(Policy(), True, 0) is None


def test_a_due_scheduled_message_meets_its_destinations_store_limit_and_when_it_adds_the_brokers(
        ) -> None:
    """``store_refusal`` (the scheduler's question for a due message): the policy's
    store_limit always; the broker's store limit only for a move that adds a message (a
    repetition follows), since a one-off move replaces its scheduled copy. The broker's own
    waiter is not counted as a waiting SEND, and is resumed by ``poll`` as producers are."""
    usage, memory = Usage(), MemoryAccount(10_000)
    flow = flow_with(usage, memory)
    capped = Policy(store_limit=100)
    assert flow.store_refusal(capped, 99, whole=False) is None
    assert "store_limit 100 of its policy" in (flow.store_refusal(capped, 100, whole=False) or "")
    usage.store = 1000
    assert flow.store_refusal(Policy(), 0, whole=False) is None
    assert "store limit reached (1000" in (flow.store_refusal(Policy(), 0, whole=True) or "")
    resumed: list[str] = []
    flow.wait(lambda: "full" if usage.store >= 1000 else None,
              lambda: resumed.append("scheduler"), producer=False)
    assert (flow.waiting, flow.blocked_total) == (0, 0)
    flow.poll()
    assert resumed == []
    usage.store = 999
    flow.poll()
    assert resumed == ["scheduler"]


def test_persistent_sends_wait_for_store_space_non_persistent_for_temp_space() -> None:
    usage, memory = Usage(), MemoryAccount(10_000)
    flow = flow_with(usage, memory)
    store_policy = Policy()
    assert flow.full(store_policy, True, 0) is None
    usage.store = 1000
    assert "store limit" in (flow.full(store_policy, True, 0) or "")
    assert flow.full(store_policy, False, 0) is None  # non-persistent needs no journal
    memory.used = 8000  # past the cursor high-water mark: overflow goes to temp
    usage.temp = 500
    assert "temp limit" in (flow.full(store_policy, False, 0) or "")


def test_a_destination_store_limit_holds_back_persistent_sends_to_it_alone() -> None:
    """A policy's store_limit (bytes, or a share of the broker's) is reached by the body bytes
    its destination holds ready, whatever the journal as a whole holds; non-persistent SENDs
    are bounded by memory and temp limits instead."""
    usage, memory = Usage(), MemoryAccount(10_000)
    flow = flow_with(usage, memory)
    capped = Policy(store_limit=100)
    assert flow.refusal(capped, 10, True, 0, None, held=99) is None
    reason = flow.refusal(capped, 10, True, 0, None, held=100) or ""
    assert reason == ("destination store limit reached (100 bytes of ready and scheduled "
                      "messages, store_limit 100 of its policy)")
    assert not isinstance(reason, (Pacing, TooLarge))  # waited out, like the store limit
    assert flow.refusal(capped, 10, False, 0, None, held=100) is None
    assert flow.refusal(Policy(), 10, True, 0, None, held=10**9) is None  # 0: no cap
    share = Policy(store_limit="25%")  # of the broker's store limit, 1000 here
    assert flow.sizes_of(share)[4] == 250
    assert flow.refusal(share, 10, True, 0, None, held=249) is None
    assert "store_limit 250" in (flow.refusal(share, 10, True, 0, None, held=250) or "")


@pytest.mark.parametrize("value", ["0%", "150%", "lots%"])
def test_a_store_limit_share_outside_0_to_100_percent_is_refused_at_load(
        tmp_path: Path, value: str) -> None:
    cfg = tmp_path / "b.toml"
    cfg.write_text(f'[[policy]]\nqueue = "m.>"\nstore_limit = "{value}"\n')
    with pytest.raises(ValueError, match=r"store_limit.*between 0 and 100%"):
        BrokerConfig.load(cfg)
    cfg.write_text(f'[defaults]\nstore_limit = "{value}"\n')
    with pytest.raises(ValueError, match=r"\[defaults\] store_limit"):
        BrokerConfig.load(cfg)


def test_the_user_store_limit_is_a_size_or_a_share_of_the_store_limit(tmp_path: Path) -> None:
    """``[limits] user_store_limit``: bytes, a size string or a share of the broker's resolved
    ``store_limit``; 0 (the default) keeps no per-user share; a share outside 0-100% is
    refused when the config is read."""
    assert Limits().user_store_limit == 0
    assert user_store_limit(0, 1000) == 0
    assert user_store_limit("64 KiB", 1000) == 65536
    assert user_store_limit("25%", 1000) == 250
    cfg = tmp_path / "b.toml"
    cfg.write_text('[limits]\nuser_store_limit = "1 GiB"\n')
    assert BrokerConfig.load(cfg).limits.user_store_limit == "1 GiB"
    for value in ("0%", "150%", "lots%"):
        cfg.write_text(f'[limits]\nuser_store_limit = "{value}"\n')
        with pytest.raises(ValueError, match=r"\[limits\] user_store_limit.*between 0 and 100%"):
            BrokerConfig.load(cfg)


def test_vm_cursor_and_destination_limits_are_memory_limits() -> None:
    usage, memory = Usage(), MemoryAccount(10_000)
    flow = flow_with(usage, memory)
    vm = Policy(cursor="vm")
    memory.used = 10_000
    assert "memory limit" in (flow.full(vm, True, 0) or "")
    memory.used = 0
    capped = Policy(memory_limit="2k")
    assert flow.full(capped, True, 2047) is None
    assert "destination memory limit" in (flow.full(capped, True, 2048) or "")


class Conn:
    """A connection's output side as the memory account sees it."""

    def __init__(self, buffered: int) -> None:
        self.buffered = buffered


def test_output_backed_up_for_connections_counts_with_queued_messages() -> None:
    usage, memory = Usage(), MemoryAccount(10_000, high_water=0.5)
    flow = flow_with(usage, memory)
    a, b = Conn(3_000), Conn(2_000)
    memory.used = 4_000
    assert memory.cursor_room() and memory.room() == 6_000
    memory.charge(a, a.buffered)
    assert not memory.cursor_room(), "4,000 queued + 3,000 of output is past the high water"
    memory.charge(b, b.buffered)
    memory.charge(b, b.buffered)  # charged again, not twice
    assert memory.output == 5_000 and memory.held == 9_000
    assert flow.usage()["memory"]["used"] == 9_000
    memory.charge(a, 7_000)
    assert "memory limit" in (flow.full(Policy(cursor="vm"), True, 0) or "")
    assert memory.room() == 6_000, "output's own room is what queued messages leave"
    a.buffered, b.buffered = 0, 500  # sockets drained without a word
    flow.tick()
    assert memory.output == 500
    memory.charge(b, 0)
    assert memory.output == 0 and memory.held == 4_000


def test_connections_state_counts_and_may_take_only_what_store_cursors_leave() -> None:
    """A connection's own state (a WebSocket's ~23 KiB) cannot be paged out, so it is charged
    while open and refused past the part of the limit above the cursors' high water."""
    memory = MemoryAccount(10_000, high_water=0.7)
    assert memory.open(1_000, "WebSocket connection") is None
    assert memory.open(2_000) is None
    assert memory.connections == 3_000 and memory.held == 3_000
    assert memory.room() == 7_000, "output's room is what connections leave too"
    refused = memory.open(1, "WebSocket connection")
    assert refused == ("memory limit reached: connections and destinations hold 3000 bytes, "
                       "at most 3000 (the 30% of memory_limit 10000 not given to queued "
                       "messages; a WebSocket connection takes 1)")
    assert memory.connections == 3_000, "a refused one is not charged"
    memory.used = 4_000
    assert not memory.cursor_room(), "4,000 queued + 3,000 of connections reach the high water"
    memory.close(2_000)
    assert memory.cursor_room() and memory.held == 5_000


def test_destinations_share_the_unpageable_part_with_connections() -> None:
    """A destination's own state (cursor, stats, policy: a few KiB however empty) is charged
    as a count times its cost, set from the broker's tables (never added and forgotten), and
    shares with connections the part of the limit store cursors leave."""
    memory = MemoryAccount(10_000, high_water=0.7)
    memory.destinations(4, 500)
    assert memory.objects == 2_000 and memory.held == 2_000
    assert memory.room() == 8_000
    assert memory.open(1_000, "TCP connection") is None
    refused = memory.open(1, "TCP connection")
    assert refused is not None and refused.startswith(
        "memory limit reached: connections and destinations hold 3000 bytes, at most 3000")
    assert memory.refusal(500, "destination") is not None, "nor may another destination come"
    memory.destinations(2, 500)  # two were dropped: counted again, not subtracted
    assert memory.objects == 1_000
    assert memory.refusal(500, "destination") is None
    memory.used = 5_000
    assert not memory.cursor_room(), "queued + connections + destinations reach the high water"


def test_message_size_limit_global_and_per_destination() -> None:
    flow = flow_with(Usage(), MemoryAccount(10_000))
    assert flow.too_large(Policy(), 100) is None
    assert "exceeds the limit of 100" in (flow.too_large(Policy(), 101) or "")
    assert flow.too_large(Policy(max_message_bytes=10), 11) is not None


def test_a_send_too_large_is_refused_before_any_wait_for_room() -> None:
    """``refusal`` answers both questions of a SEND in one look (once per message): a
    message larger than the destination takes is a ``TooLarge`` reason (an ERROR at once,
    whatever else holds), a full or paced destination one to wait out."""
    flow = flow_with(Usage(), MemoryAccount(10_000))
    policy = Policy(max_message_bytes=10, max_consumer_lag="1k", memory_limit=50)
    assert flow.refusal(policy, 10, False, 0, lag=0) is None
    too_large = flow.refusal(policy, 11, False, 100, lag=1 << 20)
    assert isinstance(too_large, TooLarge) and "exceeds the limit of 10" in too_large
    assert isinstance(flow.refusal(policy, 10, False, 0, lag=1 << 10), Pacing)
    full = flow.refusal(policy, 10, True, 50)
    assert full is not None and not isinstance(full, TooLarge)
    assert flow.full(policy, False, 0, lag=1 << 10) == flow.refusal(policy, 0, False, 0, 1 << 10)


def test_each_policy_is_held_to_its_own_sizes_however_many_there_are() -> None:
    """Sizes are resolved once per policy object (SENDs read them every time): a policy made
    later - a reloaded destination, a pattern's override - never sees another's sizes, also
    once more policies than the resolved ones kept (MAX_POLICY_SIZES) have come and gone."""
    flow = flow_with(Usage(), MemoryAccount(10_000))
    for limit in range(1, MAX_POLICY_SIZES * 2 + 2):
        policy = Policy(max_message_bytes=limit, max_consumer_lag=f"{limit}k",
                        memory_limit=limit * 10)
        assert flow.too_large(policy, limit) is None
        assert flow.too_large(policy, limit + 1) is not None
        assert flow.full(policy, False, 0, lag=(limit << 10) - 1) is None
        assert isinstance(flow.full(policy, False, 0, lag=limit << 10), Pacing)
        assert "destination memory limit" in (flow.full(policy, True, limit * 10) or "")
    assert flow.too_large(Policy(), 101) is not None  # 0: the broker-wide max_message


def test_waiters_resume_in_order_once_their_destination_has_room() -> None:
    flow = flow_with(Usage(), MemoryAccount(10_000))
    room = {"a": False, "b": False}
    resumed: list[str] = []
    for name in ("a", "b", "a"):
        flow.wait(lambda n=name: None if room[n] else "full",
                  lambda n=name: resumed.append(n))
    flow.poll()
    assert resumed == [] and flow.waiting == 3
    room["a"] = True
    flow.poll()
    assert resumed == ["a", "a"] and flow.waiting == 1  # b is still waiting, a is not held up
    room["b"] = True
    flow.poll()
    assert resumed == ["a", "a", "b"] and flow.waiting == 0
    assert flow.blocked_total == 3
