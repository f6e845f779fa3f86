"""Paging: a queue's pending messages in bounded memory.

Owns the cursor (priority lanes, FIFO within a priority) and the id-range cuts ledger
commits take from it, the pager that moves messages between memory and their stored records,
the spill blocks of compact slots, and memory/flow accounting. May import routing.message,
routing.keys, storage, config and errors; never the broker.
"""
