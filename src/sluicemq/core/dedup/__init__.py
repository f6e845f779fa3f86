"""Dedup: duplicate detection for every producer (docs/replay-protocol.md section 4).

Owns the producer table and its recovery from journal and snapshot. May import persistence
and storage.
"""
