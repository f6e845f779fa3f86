"""SluiceMQ: a STOMP message broker for data of any size."""

__version__ = "0.1.0"
