"""Spec of `sluice publish` / `sluice consume`, run as real subprocesses against a real broker
(usage and connection errors in process)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from sluicemq.cli.main import build_cli


def sluice(*args: str, env: dict[str, str] | None = None,
           timeout: float = 30) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "sluicemq", *args], capture_output=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def in_process(*args: str) -> Result:
    """The command run in this process: for what fails before any broker answers."""
    return CliRunner().invoke(build_cli(), list(args))


def ok(result: subprocess.CompletedProcess[bytes]) -> str:
    assert result.returncode == 0, result.stderr.decode()
    return result.stdout.decode()


def test_publish_then_consume_count(broker) -> None:
    out = ok(sluice("publish", "--url", broker.url, "--to", "/queue/cli", "hello"))
    assert "published 5 bytes to /queue/cli" in out
    ok(sluice("publish", "--url", broker.url, "--to", "cli", "-H", "color=red", "world"))
    result = sluice("consume", "--url", broker.url, "--from", "/queue/cli", "--count", "2")
    out = ok(result)
    assert "hello" in out and "world" in out
    assert "color=red" in out
    assert "received 2 messages" in result.stderr.decode()


def test_raw_consume_writes_exact_bytes(broker, tmp_path: Path) -> None:
    payload = bytes(range(256)) * 4
    (tmp_path / "blob").write_bytes(payload)
    ok(sluice("publish", "--url", broker.url, "--to", "/queue/raw", "--file",
              str(tmp_path / "blob")))
    result = sluice("consume", "--url", broker.url, "--from", "/queue/raw", "-n", "1", "--raw")
    assert result.returncode == 0
    assert result.stdout == payload


def test_url_comes_from_the_environment(broker) -> None:
    env = {"SLUICE_URL": broker.url}
    ok(sluice("publish", "--to", "/queue/env", "--non-persistent", "via env", env=env))
    assert "via env" in ok(sluice("consume", "--from", "/queue/env", "-n", "1", env=env))


def test_selector_and_client_ack(broker) -> None:
    for region in ("us", "eu"):
        ok(sluice("publish", "--url", broker.url, "--to", "/queue/sel", "-H",
                  f"region={region}", f"from {region}"))
    out = ok(sluice("consume", "--url", broker.url, "--from", "/queue/sel", "-n", "1",
                    "--selector", "region = 'eu'", "--ack", "client-individual"))
    assert "from eu" in out and "from us" not in out
    result = sluice("consume", "--url", broker.url, "--from", "/queue/sel", "--timeout", "0.5")
    assert "from us" in ok(result)
    assert "received 1 message " in result.stderr.decode()


def test_timeout_before_count_is_reached_exits_1(broker) -> None:
    ok(sluice("publish", "--url", broker.url, "--to", "/queue/few", "only one"))
    result = sluice("consume", "--url", broker.url, "--from", "/queue/few", "-n", "3",
                    "--timeout", "0.5")
    assert result.returncode == 1
    assert "only one" in result.stdout.decode()
    assert "received 1 of 3" in result.stderr.decode()


@pytest.mark.parametrize(("url", "words"), [("stomp://127.0.0.1:1", "cannot connect"),
                                             ("http://example.com", "bad --url")])
def test_connection_problems_are_one_line_errors(url: str, words: str) -> None:
    for command in (["publish", "--to", "/queue/x", "hi"], ["consume", "--from", "/queue/x"]):
        result = in_process(*command, "--url", url)
        assert result.exit_code == 1
        assert words in result.stderr
        assert "Traceback" not in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1


def test_broker_refusal_is_reported(broker) -> None:
    result = sluice("publish", "--url", broker.url, "--to", "/nowhere/x", "hi")
    assert result.returncode == 1
    assert "destination" in result.stderr.decode()
    assert "Traceback" not in result.stderr.decode()


def test_text_and_file_together_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    result = in_process("publish", "--to", "/queue/x", "--file", str(tmp_path / "f"), "text")
    assert result.exit_code == 2
