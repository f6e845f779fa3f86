"""Streams: large files sent as numbered chunk messages, handled as one unit.

Owns the per-stream state and chunk header parsing. May import routing.message and
routing.keys only (the broker's table of open streams is ``core/routing/streams.py``).
"""
