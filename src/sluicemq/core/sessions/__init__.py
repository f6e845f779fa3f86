"""Sessions: one client connection's STOMP conversation.

Owns the frame-by-frame session (frames in, broker calls and frames out, sans-IO); an open
transaction's spool is storage's (``storage.txspool``), so no session encodes a record. The
top of core: may import every other core package; nothing in core imports it.
"""
