"""Replay: reading a queue as a log (docs/replay-protocol.md sections 1 and 2).

Owns range reads and their requests, column batches, head queries, the sequence index,
ledgers (durable "done up to here" positions), commit-upto and streams-mode reads. May import
routing, paging, streams, protocol and storage.
"""
