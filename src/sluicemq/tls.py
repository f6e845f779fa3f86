"""TLS contexts for STOMP (stomps://) on both ends, and the client-certificate → user mapping.

The stdlib `ssl` module does the work; this module only chooses safe settings in one place:
TLS 1.2 or newer, the library's default cipher list, and on the broker a client certificate
that is asked for (and must verify against the CA) only when a CA is configured.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any


def server_context(cert: Path, key: Path, ca: Path | None = None) -> ssl.SSLContext:
    """A broker-side context; with `ca`, clients may present certificates signed by it.

    Client certificates are optional (CERT_OPTIONAL) so password logins keep working on the
    same port; a certificate that is presented but does not verify fails the handshake.
    """
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(str(cert), str(key))
    if ca is not None:
        ctx.load_verify_locations(cafile=str(ca))
        ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx


def client_context(ca: Path | str | None = None, cert: Path | str | None = None,
                   key: Path | str | None = None, *, verify: bool = True) -> ssl.SSLContext:
    """A client-side context: verify the broker against `ca` (system roots when None).

    `cert`/`key` present a client certificate; `verify=False` is for throwaway test brokers
    only and turns off both chain and host-name checks.
    """
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH,
                                     cafile=str(ca) if ca is not None else None)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert is not None:
        ctx.load_cert_chain(str(cert), str(key) if key is not None else None)
    if not verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def peer_common_name(peercert: dict[str, Any] | None) -> str | None:
    """The subject CN of a verified peer certificate (`SSLSocket.getpeercert()` form)."""
    if not peercert:
        return None
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None
