"""Once the broker has users, the console answers only to broker-wide admins (basic auth)."""

from __future__ import annotations

import base64

from click.testing import CliRunner
from console_client import ConsoleClient

from sluicemq.cli.main import build_cli
from sluicemq.core.security.policy import hash_password

CONFIG = f'''
[security]
login-failure-delay = 0.05

[[security.users]]
name = "ops"
password = "{hash_password('ops-secret')}"
groups = ["admins"]

[[security.users]]
name = "app"
password = "{hash_password('app-secret')}"

[[security.acl]]
destination = ">"
read = ["*"]
write = ["*"]
admin = ["admins"]
'''


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def test_console_requires_an_admin_login(broker_factory) -> None:
    b = broker_factory(config_text=CONFIG, name="secure")
    console = ConsoleClient(b.console_url)
    for path in ("/api/overview", "/metrics", "/destinations"):
        status, body = console.request("GET", path)
        assert status == 401, (path, status, body)
    status, _ = console.request("GET", "/api/overview", headers=basic("ops", "wrong"))
    assert status == 401
    status, body = console.request("GET", "/api/overview", headers=basic("app", "app-secret"))
    assert status == 403 and "admin" in body["error"]
    status, body = console.request("GET", "/api/overview", headers=basic("ops", "ops-secret"))
    assert status == 200 and body["connections"] == 0

    cli_run = CliRunner().invoke(build_cli(), ["admin", "--console-url", b.console_url,
                                               "--user", "ops", "--password", "ops-secret",
                                               "list"])
    assert cli_run.exit_code == 0 and cli_run.output.strip() == "no destinations"
    refused = CliRunner().invoke(build_cli(), ["admin", "--console-url", b.console_url, "list"])
    assert refused.exit_code == 1 and "(HTTP 401)" in refused.output
