"""Streaming: large files as numbered chunk messages, both ends, sans-IO.

Owns the stream wire format (``manifest``: header names and parsing), the producer's chunker
and the consumer's assembler that checks order, size and SHA-256. Shared by the client, the
CLI, Spark and the broker's stream handling; imports errors only.
"""
