"""Spec of the blocking `Client` against a real broker process."""

from __future__ import annotations

import threading

import pytest

from sluice_testing import RawStomp, eventually, nothing_delivered
from sluicemq.client import Client, Message
from sluicemq.errors import ClientError


def next_message(sub, timeout: float = 10.0) -> Message:
    message = sub.get(timeout)
    assert message is not None, "no message arrived in time"
    return message


def test_send_then_receive_preserves_body_and_headers(broker) -> None:
    with Client(broker.url) as c:
        c.send("/queue/roundtrip", b"\x00binary\xff", {"color": "blue"})
        sub = c.subscribe("/queue/roundtrip")
        message = next_message(sub)
    assert message.body == b"\x00binary\xff"
    assert message.headers["color"] == "blue"
    assert message.destination == "/queue/roundtrip"
    assert message.message_id
    assert message.subscription == sub.id
    assert not message.redelivered


def test_text_is_sent_as_utf8(broker) -> None:
    with Client(broker.url) as c:
        c.send("/queue/text", "grüße")
        assert next_message(c.subscribe("/queue/text")).text() == "grüße"


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.2"])
def test_each_protocol_version_negotiates_and_acks(broker, version: str) -> None:
    with Client(broker.url, version=version) as c:
        assert c.version == version
        c.send("/queue/v", "x")
        sub = c.subscribe("/queue/v", ack="client")
        next_message(sub).ack()
    with Client(broker.url) as c:
        assert c.head("/queue/v").count == 0  # the ACK took effect: nothing retained


def test_pipelined_sends_all_receipted_and_delivered_in_order(broker) -> None:
    with Client(broker.url) as c:
        pending = [c.send_async("/queue/pipe", f"m{i}") for i in range(200)]
        for receipt in pending:
            receipt.result()
        assert all(receipt.done() for receipt in pending)
        sub = c.subscribe("/queue/pipe")
        assert [next_message(sub).text() for _ in range(200)] == [f"m{i}" for i in range(200)]


def test_sends_from_many_threads_interleave_safely(broker) -> None:
    with Client(broker.url) as c:

        def produce(worker: int) -> None:
            for i in range(50):
                c.send("/queue/threads", f"{worker}:{i}")

        threads = [threading.Thread(target=produce, args=(w,)) for w in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        sub = c.subscribe("/queue/threads")
        got = [next_message(sub).text() for _ in range(200)]
    assert sorted(got) == sorted(f"{w}:{i}" for w in range(4) for i in range(50))
    for w in range(4):  # each producer's own order is kept
        assert [g for g in got if g.startswith(f"{w}:")] == [f"{w}:{i}" for i in range(50)]


def test_nack_redelivers_with_the_redelivered_flag(broker) -> None:
    with Client(broker.url) as c:
        c.send("/queue/nack", "once more")
        sub = c.subscribe("/queue/nack", ack="client-individual")
        first = next_message(sub)
        first.nack()
        again = next_message(sub)
        assert again.text() == "once more"
        assert again.redelivered
        again.ack()
        assert c.head("/queue/nack").count == 0  # acked, not redelivered again


def test_unacked_client_messages_return_to_the_queue_on_disconnect(broker) -> None:
    with Client(broker.url) as c:
        for i in range(3):
            c.send("/queue/unacked", str(i))
        sub = c.subscribe("/queue/unacked", ack="client")
        [next_message(sub) for _ in range(3)]
    with Client(broker.url) as c:
        sub = c.subscribe("/queue/unacked")
        assert [next_message(sub).text() for _ in range(3)] == ["0", "1", "2"]


def test_auto_ack_consumes_on_delivery(broker) -> None:
    with Client(broker.url) as c:
        c.send("/queue/auto", "gone")
        message = next_message(c.subscribe("/queue/auto", prefetch=1))
        message.ack()  # harmless no-op in auto mode
    with Client(broker.url) as c:
        assert c.head("/queue/auto").count == 0


def test_prefetch_bounds_unacked_deliveries(broker) -> None:
    with Client(broker.url) as c:
        for i in range(5):
            c.send("/queue/prefetch", str(i))
        sub = c.subscribe("/queue/prefetch", ack="client-individual", prefetch=2)
        first, _ = next_message(sub), next_message(sub)
        assert nothing_delivered(c, sub)
        first.ack()
        assert next_message(sub).text() == "2"


def test_transaction_commit_publishes_and_abort_discards(broker) -> None:
    with Client(broker.url) as c:
        sub = c.subscribe("/queue/tx")
        with c.transaction() as tx:
            tx.send("/queue/tx", "committed")
            assert nothing_delivered(c, sub)  # invisible until COMMIT
        assert next_message(sub).text() == "committed"
        tx = c.transaction()
        tx.send("/queue/tx", "aborted")
        tx.abort()
        assert nothing_delivered(c, sub)


def test_exception_inside_transaction_block_aborts(broker) -> None:
    with Client(broker.url) as c:
        with pytest.raises(RuntimeError), c.transaction() as tx:
            tx.send("/queue/tx-exc", "never")
            raise RuntimeError("boom")
        assert c.head("/queue/tx-exc").count == 0


def test_transactional_ack_counts_only_on_commit(broker) -> None:
    with Client(broker.url) as c:
        c.send("/queue/tx-ack", "x")
        sub = c.subscribe("/queue/tx-ack", ack="client-individual")
        message = next_message(sub)
        with c.transaction() as tx:
            tx.ack(message)
    with Client(broker.url) as c:
        assert c.head("/queue/tx-ack").count == 0


def test_durable_subscription_keeps_messages_while_offline(broker) -> None:
    with Client(broker.url, client_id="auditor") as c:
        c.subscribe("/topic/orders", durable_name="audit")
    with Client(broker.url) as producer:
        for i in range(3):
            producer.send("/topic/orders", f"o{i}")
    with Client(broker.url, client_id="auditor") as c:
        sub = c.subscribe("/topic/orders", durable_name="audit")
        assert [next_message(sub).text() for _ in range(3)] == ["o0", "o1", "o2"]
        sub.unsubscribe(durable=True)
    with Client(broker.url) as producer:
        producer.send("/topic/orders", "after removal")
    with Client(broker.url, client_id="auditor") as c:
        assert nothing_delivered(c, c.subscribe("/topic/orders", durable_name="audit"))


def test_selector_filters_deliveries(broker) -> None:
    with Client(broker.url) as c:
        sub = c.subscribe("/queue/sel", selector="region = 'eu' AND size > 2")
        c.send("/queue/sel", "no", {"region": "us", "size": "5"})
        c.send("/queue/sel", "yes", {"region": "eu", "size": "5"})
        c.send("/queue/sel", "small", {"region": "eu", "size": "1"})
        assert next_message(sub).text() == "yes"
        assert nothing_delivered(c, sub)


def test_iteration_ends_when_the_subscription_does(broker) -> None:
    with Client(broker.url) as c:
        sub = c.subscribe("/queue/iter")
        for i in range(3):
            c.send("/queue/iter", str(i))
        got = []
        for message in sub:
            got.append(message.text())
            if len(got) == 3:
                sub.unsubscribe()
        assert got == ["0", "1", "2"]
        assert sub.get(timeout=10) is None  # the end is kept: every later read sees it


def test_broker_error_on_send_raises_with_its_message(broker) -> None:
    with Client(broker.url) as c:
        with pytest.raises(ClientError, match="destination") as info:
            c.send("/nowhere/x", "x")
        assert info.value.headers.get("message")
        c.send("/queue/still-usable", "ok")  # a refused frame does not end the connection


def test_broker_error_on_subscribe_raises(broker) -> None:
    with Client(broker.url) as c, pytest.raises(ClientError, match="selector"):
        c.subscribe("/queue/bad-sel", selector="a = = 1")


def test_unclaimed_error_reaches_the_subscription_iterator(broker) -> None:
    with Client(broker.url) as c:
        c.send("/queue/bad-ack", "x")
        sub = c.subscribe("/queue/bad-ack", ack="client-individual")
        message = next_message(sub)
        message.ack()
        message.ack()  # the broker no longer knows this ack id: ERROR without a receipt
        with pytest.raises(ClientError):
            sub.get(5)


def test_killed_broker_fails_waiting_calls(broker) -> None:
    c = Client(broker.url, heartbeat=(200, 200))
    sub = c.subscribe("/queue/dying")
    broker.kill()
    with pytest.raises(ClientError):
        sub.get(5)
    with pytest.raises(ClientError):
        c.send("/queue/dying", "x")
    c.disconnect()  # still safe


def test_connection_refused_is_a_client_error() -> None:
    with pytest.raises(ClientError, match="cannot connect"):
        Client("stomp://127.0.0.1:1", timeout=2)


def test_a_closed_client_never_holds_the_next_socket_of_the_process_open(broker) -> None:
    """Closing a client shuts its connection down at once, and its descriptor is closed only
    where the reader thread no longer polls it. A descriptor closed under a late poll left the
    poll holding whichever socket the process opened next under the same number: that
    socket's close never reached the broker, and the consumer it stood for kept its
    messages (a stream that should have been redelivered never arrived)."""
    for _ in range(100):
        with Client(broker.url):
            pass
        other = RawStomp(broker.host, broker.port)
        other.connect()
        other.close()
    eventually(lambda: not broker.api("connections")["connections"],
               "the broker saw every connection end")
