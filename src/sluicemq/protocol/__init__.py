"""Sans-IO STOMP: bytes in, frames out; frames in, bytes out. No sockets here."""

from sluicemq.protocol.frames import Frame

__all__ = ["Frame"]
