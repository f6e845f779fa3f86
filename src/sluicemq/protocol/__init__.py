"""Sans-IO STOMP: bytes in, frames out; frames in, bytes out. No sockets here.

Owns the frame type, the incremental parser and the encoder for STOMP 1.0-1.2 (header
escaping per version), column batches (many messages in one MESSAGE body) and heart-beat
negotiation and timing. The bottom layer, shared by the broker, the clients and the
transports: imports nothing of SluiceMQ but errors.
"""

from sluicemq.protocol.frames import Frame

__all__ = ["Frame", "compiled"]


def compiled() -> bool:
    """Whether the codec runs compiled (the optional mypyc build of setup.py) rather than as
    the pure-Python source: the broker says so when it starts, so a figure names its build."""
    from sluicemq.protocol import codec

    return not str(codec.__file__).endswith(".py")
