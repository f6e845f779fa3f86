"""Transport: sockets to sessions - STOMP over TCP (and TLS) and over WebSocket.

Owns the asyncio protocol and the WebSocket connection that feed bytes to a ``Session`` and
write what it sends (gathered per loop turn, held to the connection's share of the output
budget), and the heart-beat timer both share. May import protocol and core; the process
that opens the listeners is assembled in ``sluicemq.app``.
"""
