"""How the source and sink read their options: typos fail at query start with a message that
says what to do, never inside an executor later. No Spark session needed."""

from __future__ import annotations

import pytest

from sluicemq.spark.options import Connection, OptionError, SinkOptions, SourceOptions


def test_defaults_read_a_queue_from_the_local_broker():
    opts = SourceOptions.parse({"destination": "/queue/orders"})
    assert opts.connection.url == "stomp://127.0.0.1:61613"
    assert (opts.mode, opts.starting, opts.partitions, opts.ledger) == (
        "messages", "earliest", 2, "spark")
    assert opts.max_per_batch is None and not opts.consume and not opts.streams


def test_option_names_are_case_insensitive_as_in_spark():
    opts = SourceOptions.parse({"Destination": "/queue/a", "MAXMESSAGESPERTRIGGER": "5",
                                "startingOffsets": "LATEST"})
    assert (opts.max_per_batch, opts.starting) == (5, "latest")


def test_a_topic_is_read_through_a_durable_subscription():
    opts = SourceOptions.parse({"destination": "/topic/prices", "subscription": "s1",
                                "selector": "region = 'emea'"})
    assert opts.connection.client_id == "spark-s1" and opts.selector == "region = 'emea'"
    with pytest.raises(OptionError, match="durable subscription"):
        SourceOptions.parse({"destination": "/topic/prices"})


@pytest.mark.parametrize("options, message", [
    ({}, "destination is required"),
    ({"destination": "orders"}, "/queue/NAME"),
    ({"destination": "/queue/a", "mode": "files"}, "mode must be"),
    ({"destination": "/queue/a", "maxMessagesPerTrigger": "0"}, "positive"),
    ({"destination": "/queue/a", "partitions": "two"}, "integer"),
    ({"destination": "/queue/a", "url": "http://x"}, "scheme"),
    ({"destination": "/queue/a", "mode": "streams", "streams.output": "path"}, "needs option path"),
    ({"destination": "/queue/a", "mode": "streams", "streams.deleteCommitted": "true"},
     "needs streams.output=path"),
    ({"destination": "/queue/a", "selector": "x = 1"}, "topic subscription"),
    ({"destination": "/queue/a", "subscription": "s"}, "/topic/ destinations only"),
    ({"destination": "/queue/a", "consume": "maybe"}, "true or false"),
])
def test_bad_source_options_say_what_is_wrong(options, message):
    with pytest.raises(OptionError, match=message):
        SourceOptions.parse(options)


def test_a_streaming_sink_is_named_by_its_query_unless_named():
    """The writer derives `q-<query id>` from the task (docs/spark.md): nothing to parse."""
    assert SinkOptions.parse({"checkpointLocation": "/ck/one"}, streaming=True).sink_id is None
    assert SinkOptions.parse({"checkpointLocation": "/ck/one", "sinkId": "orders-v2"},
                             streaming=True).sink_id == "orders-v2"


def test_every_batch_write_is_its_own_sink_unless_named():
    assert SinkOptions.parse({}, streaming=False).sink_id is None  # the writer picks w-<random>
    assert SinkOptions.parse({"sinkId": "nightly"}, streaming=False).sink_id == "nightly"
    with pytest.raises(OptionError, match="sinkId"):
        SinkOptions.parse({"sinkId": "bad name/with slash"}, streaming=False)


def test_a_misspelt_option_is_an_error_that_names_the_right_one():
    with pytest.raises(OptionError, match=r"'maxmessagespertriger'.*did you mean "
                                          r"maxMessagesPerTrigger\?"):
        SourceOptions.parse({"destination": "/queue/a", "maxMessagesPerTriger": "5"})
    with pytest.raises(OptionError, match=r"unknown option 'sinkid2'.*did you mean sinkId"):
        SinkOptions.parse({"sinkId2": "x"}, streaming=True)
    with pytest.raises(OptionError, match=r"unknown option 'checkpointlocation'"):
        SinkOptions.parse({"checkpointLocation": "/ck"}, streaming=False)
    with pytest.raises(OptionError, match=r"unknown option 'colour' for reading.*known options "
                                          r"are url, login"):
        SourceOptions.parse({"destination": "/queue/a", "colour": "blue"})


def test_options_spark_adds_and_the_coming_read_options_are_known():
    SourceOptions.parse({"destination": "/queue/a", "path": "/x", "headers": "map",
                         "headerColumns": "k", "streams.format": "csv", "bulk": "true"})
    SinkOptions.parse({"destination": "/queue/a", "checkpointlocation": "/ck"}, streaming=True)


def test_a_failover_url_is_accepted_and_a_bad_one_named() -> None:
    url = "failover:(stomp://a:61613,stomp://b:61613)?randomize=false"
    assert Connection.parse({"url": url}).url == url
    with pytest.raises(OptionError, match="option url"):
        Connection.parse({"url": "failover:(stomp://a)?nosuch=1"})
