"""Limits: what any one client may take from everyone else.

Owns connection admission (CONNECT timeout, per-address caps), per-connection transaction
bytes and SENDs waiting for a consumer: pure bookkeeping, importing config and errors only.
The per-user share of the store (``usershare``, ``heldbook``, ``sharestate``) also reads the
queues and stored records at start-up and rides in the index snapshot: it imports routing,
paging, persistence's state-part base and storage.
"""
