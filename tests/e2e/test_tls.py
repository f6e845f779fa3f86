"""Spec of STOMP over TLS: stomps:// listener, verification, client-certificate logins.

A throwaway CA, server and client certificates are made with the `openssl` CLI at test time;
a second, untrusted CA signs a look-alike client certificate.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sluice_testing import make_ca, make_cert
from sluicemq.client import AsyncClient, Client
from sluicemq.core.security.policy import hash_password
from sluicemq.errors import ClientError
from sluicemq.tls import client_context

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI")
TLS_RE = re.compile(r"listening on stomps://([\d.]+):(\d+)")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    make_ca(d, "ca")
    make_ca(d, "rogue")
    make_cert(d, "server", "localhost", "ca", server=True)
    make_cert(d, "olga", "olga", "ca")
    make_cert(d, "fake-olga", "olga", "rogue")
    make_cert(d, "stranger", "stranger", "ca")
    return d


def tls_broker(factory: Any, pki: Path, security: str = "") -> tuple[Any, str]:
    text = (f'[tls]\nport = 0\ncert = "{pki / "server.crt"}"\nkey = "{pki / "server.key"}"\n'
            f'ca = "{pki / "ca.crt"}"\n{security}')
    b = factory(config_text=text)
    m = TLS_RE.search(b.log())
    assert m, b.log()
    return b, f"stomps://127.0.0.1:{m.group(2)}"


SECURED = f"""
[[security.users]]
name = "olga"
password = "{hash_password("olga-pw")}"
groups = ["admins"]

[[security.acl]]
destination = ">"
read = ["admins"]
write = ["admins"]
"""


def test_stomps_and_stomp_serve_the_same_broker(broker_factory: Any, pki: Path) -> None:
    b, url = tls_broker(broker_factory, pki)
    with Client(url, ssl_context=client_context(pki / "ca.crt"), timeout=10) as c:
        sub = c.subscribe("/queue/t")
        with Client(b.url, timeout=10) as plain:
            plain.send("/queue/t", b"from plain")
        c.send("/queue/t", b"from tls")
        assert {sub.get(5).body, sub.get(5).body} == {b"from plain", b"from tls"}


def test_large_messages_cross_tls_intact(broker_factory: Any, pki: Path) -> None:
    _b, url = tls_broker(broker_factory, pki)
    body = os.urandom(3 << 20)
    with Client(url, ssl_context=client_context(pki / "ca.crt"), timeout=20) as c:
        sub = c.subscribe("/queue/big")
        for _ in range(3):
            c.send("/queue/big", body)
        for _ in range(3):
            got = sub.get(20)
            assert got is not None
            assert got.body == body


def test_async_client_speaks_tls(broker_factory: Any, pki: Path) -> None:
    _b, url = tls_broker(broker_factory, pki)

    async def roundtrip() -> bytes:
        async with await AsyncClient.connect(url, ssl_context=client_context(pki / "ca.crt"),
                                             timeout=10) as c:
            sub = await c.subscribe("/queue/a")
            await c.send("/queue/a", b"async tls")
            msg = await sub.get(5)
            assert msg is not None
            return msg.body

    assert asyncio.run(roundtrip()) == b"async tls"


def test_an_untrusted_broker_certificate_is_refused(broker_factory: Any, pki: Path) -> None:
    _b, url = tls_broker(broker_factory, pki)
    with pytest.raises(ClientError, match="CERTIFICATE_VERIFY_FAILED"):
        Client(url, ssl_context=client_context(pki / "rogue.crt"), timeout=10)
    with pytest.raises(ClientError):  # the system roots do not know our throwaway CA either
        Client(url, timeout=10)


def test_client_certificate_logs_in_as_its_common_name(broker_factory: Any, pki: Path) -> None:
    _b, url = tls_broker(broker_factory, pki, SECURED)
    ctx = client_context(pki / "ca.crt", pki / "olga.crt", pki / "olga.key")
    with Client(url, ssl_context=ctx, timeout=10) as c:
        c.send("/queue/admin-only", b"by certificate")
    with pytest.raises(ClientError, match="authentication required"):
        Client(url, ssl_context=client_context(pki / "ca.crt"), timeout=10)
    stranger = client_context(pki / "ca.crt", pki / "stranger.crt", pki / "stranger.key")
    with pytest.raises(ClientError, match="authentication required"):
        Client(url, ssl_context=stranger, timeout=10)  # a valid cert for an unknown user
    with Client(url, ssl_context=client_context(pki / "ca.crt"), login="olga",
                passcode="olga-pw", timeout=10) as c:  # passwords still work over TLS
        c.send("/queue/admin-only", b"by password")


def test_a_certificate_from_another_ca_fails_the_handshake(broker_factory: Any,
                                                           pki: Path) -> None:
    _b, url = tls_broker(broker_factory, pki, SECURED)
    ctx = client_context(pki / "ca.crt", pki / "fake-olga.crt", pki / "fake-olga.key")
    with pytest.raises(ClientError):
        Client(url, ssl_context=ctx, timeout=10).send("/queue/x", b"must not arrive")


def test_the_cert_cn_is_ignored_on_plain_tcp(broker_factory: Any, pki: Path) -> None:
    b, _url = tls_broker(broker_factory, pki, SECURED)
    with pytest.raises(ClientError, match="authentication required"):
        Client(b.url, login=None, timeout=10)


def test_plain_stomp_and_garbage_on_the_tls_port_do_not_hurt(broker_factory: Any,
                                                              pki: Path) -> None:
    b, url = tls_broker(broker_factory, pki)
    port = int(url.rsplit(":", 1)[1])
    for junk in (b"CONNECT\naccept-version:1.2\n\n\x00", os.urandom(4096), b"\x16\x03\x01\xff"):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(junk)
            try:
                data = s.recv(100)
            except (ConnectionResetError, TimeoutError):
                data = b""
            assert not data.startswith((b"CONNECTED", b"ERROR"))  # a TLS alert at most
    with Client(url, ssl_context=client_context(pki / "ca.crt"), timeout=10) as c:
        c.send("/queue/after-junk", b"ok")
    assert "internal error" not in b.log()


def test_cli_uses_tls_settings_from_the_environment(broker_factory: Any, pki: Path) -> None:
    _b, url = tls_broker(broker_factory, pki)
    env = dict(os.environ, SLUICE_TLS_CA=str(pki / "ca.crt"))
    sent = subprocess.run([sys.executable, "-m", "sluicemq", "publish", "--url", url,
                           "--to", "/queue/cli", "over tls"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert sent.returncode == 0, sent.stderr
    got = subprocess.run([sys.executable, "-m", "sluicemq", "consume", "--url", url,
                          "--from", "/queue/cli", "-n", "1", "--raw", "--timeout", "10"],
                         env=env, capture_output=True, timeout=60)
    assert got.returncode == 0, got.stderr
    assert got.stdout == b"over tls"


def test_tls_contexts_refuse_old_protocols(pki: Path) -> None:
    assert client_context(pki / "ca.crt").minimum_version >= ssl.TLSVersion.TLSv1_2


def test_a_tls_file_that_is_not_there_is_named_before_the_broker_starts(
        tmp_path: Path, pki: Path) -> None:
    """README's [tls] block copied before the files exist: the error says which file."""
    config = tmp_path / "broker.toml"
    config.write_text(f'[tls]\nport = 0\ncert = "{pki / "server.crt"}"\n'
                      f'key = "{tmp_path / "broker.key"}"\n')
    out = subprocess.run([sys.executable, "-m", "sluicemq", "broker", "--port", "0",
                          "--console-port", "off", "--ws-port", "off", "--config", str(config),
                          "--data-dir", str(tmp_path / "data")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1, out.stderr
    assert f"bad configuration: [tls] key = '{tmp_path / 'broker.key'}': no such file" \
        in out.stderr
    assert not (tmp_path / "data").exists()
