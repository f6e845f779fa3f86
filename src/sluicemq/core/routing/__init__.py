"""Routing: destinations and how a message reaches a consumer.

Owns the broker (destinations and routing), subscriptions and consumer caps, durable
subscriptions, the receipt clock, the broker's table of large streams, compaction's view of
who holds journal records, queues, topics, consumers, the dispatch pass, the in-memory
message, destination names and the destination count limits. May import paging, streams,
limits, selectors, storage, config and errors; it reaches persistence, staging and dedup only
through the broker's start-up wiring.
"""
