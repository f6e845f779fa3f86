"""Transport: sockets to sessions - STOMP over TCP (and TLS) and over WebSocket.

Owns the asyncio protocol and the WebSocket connection that feed bytes to a ``Session`` and
write what it sends (gathered per loop turn, held to the connection's share of the output
budget), and the heart-beat timer both share. May import protocol and core; the process
that opens the listeners is assembled in ``sluicemq.app``.

Both are edges around the same sans-IO machine, not machines of their own: bytes go to
``Session.feed`` (the codec cuts frames, the session decides), and what the session decides
comes back through the ``Outbound`` it was given (write, pause/resume reading, close). A
WebSocket adds no STOMP framing to extract: a TEXT or BINARY message is fed as bytes (a
message may hold part of a frame or several), each frame written goes out as one message, text
when it is valid UTF-8. What stays here is I/O - aiohttp's upgrade and message iterator, the
writer task, timers - and the output queue's bookkeeping, which reports to the sans-IO
accounts (``MemoryAccount``, ``Admission``). The in-process specs drive both on the test's own
loop (``tests/transport``).
"""
