"""The `sluice` command line as a whole, in process: how it is assembled, what it offers, and
the commands that need no broker (`--version`, `passwd`, a refused `broker` configuration)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from sluicemq import __version__
from sluicemq.cli import admin_cmd
from sluicemq.cli.broker_cmd import PortOrOff
from sluicemq.cli.main import build_cli
from sluicemq.core.security.policy import verify_password

FAMILIES = {"admin", "broker", "consume", "passwd", "publish", "receive", "send"}


def test_the_group_is_assembled_when_asked_and_each_build_is_its_own() -> None:
    first, second = build_cli(), build_cli()
    assert set(first.list_commands(click.Context(first))) == FAMILIES
    assert first is not second and first.commands is not second.commands
    first.add_command(click.Command("extra"))
    assert "extra" not in second.commands and "extra" not in build_cli().commands


def test_a_family_is_imported_when_one_of_its_commands_is_looked_up() -> None:
    """`sluice broker` need not map the client-side commands' imports (the client, numpy)."""
    code = ("import sys; from sluicemq.cli.main import build_cli; import click; "
            "group = build_cli(); group.get_command(click.Context(group), 'broker'); "
            "print(sorted(m for m in ('sluicemq.cli.broker_cmd', 'sluicemq.cli.messaging', "
            "'sluicemq.cli.transfer', 'sluicemq.client', 'rich') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout.strip() == "['sluicemq.cli.broker_cmd']"


def test_the_admin_group_lists_its_commands_where_it_is_defined() -> None:
    assert set(admin_cmd.admin.commands) == {"list", "browse", "purge", "move", "retry",
                                             "stats", "status"}


def test_help_and_version() -> None:
    runner = CliRunner()
    listed = runner.invoke(build_cli(), ["--help"])
    assert listed.exit_code == 0
    assert all(f"  {name} " in listed.output for name in FAMILIES)
    version = runner.invoke(build_cli(), ["--version"])
    assert version.exit_code == 0 and version.output == f"sluice, version {__version__}\n"


def test_passwd_prints_a_hash_of_the_first_line_of_stdin() -> None:
    result = CliRunner().invoke(build_cli(), ["passwd"], input="s3cret\nignored\n")
    assert result.exit_code == 0, result.output
    stored = result.stdout.strip()
    assert stored.startswith("$argon2id$") and "s3cret" not in stored
    assert verify_password(stored, "s3cret") and not verify_password(stored, "ignored")


def test_passwd_refuses_an_empty_password() -> None:
    result = CliRunner().invoke(build_cli(), ["passwd"], input="\n")
    assert result.exit_code == 1 and "empty password" in result.stderr


@pytest.mark.parametrize(("text", "port"), [("61613", 61613), ("auto", 0), ("AUTO", 0),
                                            ("off", None), ("0", None), ("no", None)])
def test_a_port_option_takes_a_number_auto_or_off(text: str, port: int | None) -> None:
    assert PortOrOff().convert(text, None, None) == port


@pytest.mark.parametrize("text", ["65536", "-1", "http", "", "\u00b2", "9" * 5000])
def test_anything_else_is_not_a_port(text: str) -> None:
    with pytest.raises(click.BadParameter, match="neither a port number"):
        PortOrOff().convert(text, None, None)


def test_a_broker_with_a_bad_configuration_does_not_start(tmp_path: Path) -> None:
    config = tmp_path / "sluice.toml"
    config.write_text("[limits]\nno_such_setting = 1\n")
    result = CliRunner().invoke(build_cli(), ["broker", "--config", str(config),
                                              "--data-dir", str(tmp_path / "data")])
    assert result.exit_code == 1
    assert "bad configuration" in result.stderr and "no_such_setting" in result.stderr
    assert not (tmp_path / "data").exists()
