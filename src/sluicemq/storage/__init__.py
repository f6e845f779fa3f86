"""Storage: the durable journal and everything written to disk besides it.

Owns journal segments and their record format, the writer thread (group commit, fsync before
a receipt), reads and run reads, start-up scanning, compaction, the index snapshot format,
the ``Store`` that pins records while anything holds them, temp files for paged-out
non-persistent messages, the spool of an open transaction (its SENDs kept as the record
payloads they become at COMMIT, ``txspool``), and the data directory's lock and lease. Knows
nothing of STOMP or queues: imports errors only.
"""
