"""CONNECT (or STOMP) and DISCONNECT: version, heart-beats, login, client id.

With security on the login is checked off the event loop; frames the client pipelines behind
its CONNECT are held (bounded) and run, in order, once the answer is known.
"""

from __future__ import annotations

from sluicemq import __version__
from sluicemq.core.security.policy import User
from sluicemq.core.sessions.context import SessionContext
from sluicemq.errors import ProtocolError
from sluicemq.protocol.codec import encode_frame
from sluicemq.protocol.frames import Frame
from sluicemq.protocol.heartbeat import negotiate, parse_heart_beat
from sluicemq.storage import records

SUPPORTED_VERSIONS = ("1.0", "1.1", "1.2")


def connect(session: SessionContext, frame: Frame) -> None:
    h = frame.headers
    accepted = h.get("accept-version")
    offered = [v.strip() for v in accepted.split(",")] if accepted else ["1.0"]
    common = [v for v in SUPPORTED_VERSIONS if v in offered]
    if not common:
        session.out.write(encode_frame(Frame(
            "ERROR", {"version": ",".join(SUPPORTED_VERSIONS), "content-type": "text/plain",
                      "message": "unsupported protocol version"},
            f"supported versions are {','.join(SUPPORTED_VERSIONS)}".encode()), "1.0"))
        session.close()
        return
    session.version = common[-1]
    client_hb = parse_heart_beat(h.get("heart-beat"))
    server_ms = session.broker.config.limits.heartbeat_ms
    session.heartbeat = negotiate(client_hb, (server_ms, server_ms))
    if session.security.enabled:
        session.held = []
        session.security.begin_login(h.get("login"), h.get("passcode"), session.peer,
                                     session.cert_user, lambda user, reason:
                                     _logged_in(session, frame, user, reason))
        return
    _accept(session, frame)


def _logged_in(session: SessionContext, frame: Frame, user: User | None, reason: str) -> None:
    """The login check finished: accept or refuse, then run what was pipelined behind it."""
    held, session.held = session.held or [], None
    if session.closed:
        return
    if reason:
        session.error(reason, frame, fatal=True)
        return
    session.user = user
    session.store_owner = records.encode_owner(user.name) if user is not None else b""
    session.guarded(lambda f: _accept(session, f), frame)
    for later in held:
        session.handle(later)


def _accept(session: SessionContext, frame: Frame) -> None:
    h = frame.headers
    broker = session.broker
    client_id = h.get("client-id")
    if client_id:
        # With security on a client id is the user's own: another user's connection of the
        # same id neither blocks nor is blocked (their durable subscriptions are guarded by
        # owner, see subscribe.claim_durable).
        lock = (session.owner(), client_id)
        holder = broker.client_ids.get(lock)
        if holder is not None and holder is not session:
            raise ProtocolError(f"client-id {client_id!r} is already connected")
        broker.client_ids[lock] = session
        session.client_id = client_id
    session.login = h.get("login")
    session.connected = True
    broker.advisories.connection("added", session.id, session.peer,
                                 session.user.name if session.user else None)
    session.parser.version = session.version
    session.on_version(session.version)
    reply = {"version": session.version, "session": session.id,
             "server": f"SluiceMQ/{__version__}",
             "heart-beat": f"{session.heartbeat[0]},{session.heartbeat[1]}"}
    session.out.write(encode_frame(Frame("CONNECTED", reply), session.version))


def disconnect(session: SessionContext, frame: Frame) -> None:
    receipt_id = frame.headers.get("receipt")
    if receipt_id is None:
        session.close()
        return

    def done(exc: BaseException | None) -> None:
        if not session.closed:
            session.out.write(encode_frame(Frame("RECEIPT", {"receipt-id": receipt_id}),
                                           session.version))
            session.close()

    session.broker.when_durable(done, session)
