"""Limits: what any one client may take from everyone else.

Owns connection admission (CONNECT timeout, per-address caps), per-connection transaction
bytes and SENDs waiting for a consumer. Pure bookkeeping: imports config and errors only.
"""
