"""Spec of destination keys (core/routing/keys.py): the strings the journal and the index
snapshot store, so their form never changes (tests/e2e/test_old_data_dir.py starts on a data
directory written before this module existed)."""

from __future__ import annotations

from sluicemq.core.routing import keys


def test_each_kind_has_its_fixed_form() -> None:
    assert keys.queue_key("orders") == "q:orders"
    assert keys.topic_key("prices.eu") == "t:prices.eu"
    assert keys.durable_key("c1", "audit") == "d:c1:audit"
    assert keys.session_key("7", 2) == "s:7:2"


def test_destinations_and_keys_translate_both_ways() -> None:
    for destination in ("/queue/a.b", "/topic/x:y", "/topic/prices.*"):
        key = keys.destination_key(destination)
        assert keys.destination_of(key) == destination
    assert keys.kind_key("queue", "a") == "q:a" and keys.kind_key("topic", "a") == "t:a"
    assert (keys.kind_of("t:a"), keys.name_of("t:a")) == ("topic", "a")
    assert (keys.kind_of("q:a:b"), keys.name_of("q:a:b")) == ("queue", "a:b")


def test_predicates_and_durable_names() -> None:
    assert keys.is_queue("q:x") and not keys.is_queue("t:x")
    assert keys.is_topic("t:x") and not keys.is_topic("d:c:t")
    assert keys.is_session("s:1:0") and not keys.is_session("q:s:1")
    assert keys.subscription_of("d:client:sub:with:colons") == "sub:with:colons"
    assert keys.durable_key("c1", "x").startswith(keys.durable_prefix("c1"))
    assert not keys.durable_key("c10", "x").startswith(keys.durable_prefix("c1"))
