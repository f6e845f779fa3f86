"""Staging: exactly-once publication of staged batches (docs/replay-protocol.md section 3).

Owns the stage book (parked parts, published batch memory), the broker-side stager (journal
records, publication, discard, timer), the frames a session hands over, the mover that keeps
parked parts off the oldest segment, and recovery of all of it. May import routing, paging,
persistence, dedup, security, protocol and storage.
"""
