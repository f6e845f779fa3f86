"""Sessions: one client connection's STOMP conversation.

Owns the frame-by-frame session (frames in, broker calls and frames out, sans-IO) and the
on-disk spool of open transactions. The top of core: may import every other core package;
nothing in core imports it.
"""
