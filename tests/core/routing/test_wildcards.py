"""Spec of wildcard topic matching (ActiveMQ syntax), in-process: which subscriptions a
published topic name reaches."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from sluicemq.config import match_destination
from sluicemq.core.routing.message import Message
from sluicemq.core.routing.wildcards import WildcardIndex, is_pattern, valid_pattern


class Sub:
    """A subscriber queue as the index sees it: a selector or none."""

    selector: Any = None

    def __init__(self, name: str) -> None:
        self.name = name


def msg() -> Message:
    return Message(1, "/topic/x", {}, b"", persistent=False)


def reached(index: WildcardIndex[Sub], topic: str) -> set[str]:
    return {q.name for q in index.targets(topic, msg())}


def index_of(*patterns: str, may_read=lambda t: True) -> WildcardIndex[Sub]:
    index = WildcardIndex[Sub]()
    for p in patterns:
        index.add(p, p, Sub(p), may_read)
    return index


def test_star_is_one_segment_and_gt_is_the_rest() -> None:
    index = index_of("prices.*", "prices.>", "prices.*.eu", "orders.>")
    assert reached(index, "prices.ibm") == {"prices.*", "prices.>"}
    assert reached(index, "prices.ibm.eu") == {"prices.>", "prices.*.eu"}
    assert reached(index, "prices") == {"prices.>"}  # `>` also matches nothing, as ActiveMQ
    assert reached(index, "orders.eu.1") == {"orders.>"}
    assert reached(index, "other") == set()


def test_a_removed_subscription_is_reached_no_more_and_its_branch_is_pruned() -> None:
    index = index_of("a.b.*", "a.>")
    index.remove("a.b.*")
    assert reached(index, "a.b.c") == {"a.>"}
    index.remove("a.>")
    assert len(index) == 0 and not index._root.children


def test_a_subscriber_never_gets_a_topic_it_may_not_read() -> None:
    index = index_of("orders.>", may_read=lambda topic: topic != "orders.eu")
    assert reached(index, "orders.us") == {"orders.>"}
    assert reached(index, "orders.eu") == set()


def test_patterns_are_recognised_and_checked() -> None:
    assert is_pattern("a.*") and is_pattern("a.>") and not is_pattern("a.b")
    assert valid_pattern("a.*.c") and valid_pattern("a.>")
    assert not valid_pattern("a.>.c") and not valid_pattern("a..b")


SEG = st.sampled_from(["a", "b", "c"])


@given(st.lists(st.lists(st.one_of(SEG, st.just("*")), min_size=1, max_size=3)
                .map(".".join), max_size=6),
       st.lists(SEG, min_size=1, max_size=4).map(".".join))
def test_the_trie_agrees_with_matching_each_pattern_alone(patterns, topic) -> None:
    patterns = list(dict.fromkeys(patterns + [p.rsplit(".", 1)[0] + ".>" for p in patterns
                                              if "." in p]))
    index = index_of(*patterns)
    assert reached(index, topic) == {p for p in patterns if match_destination(p, topic)}
