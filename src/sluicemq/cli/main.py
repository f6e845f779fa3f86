"""`sluice` entry point: one click group, one module per command family."""

from __future__ import annotations

import click

from sluicemq import __version__


@click.group()
@click.version_option(__version__, prog_name="sluice")
def cli() -> None:
    """SluiceMQ: a STOMP broker for data of any size."""


def _register() -> None:
    from sluicemq.cli import admin_cmd, broker_cmd, messaging, passwd_cmd, transfer

    cli.add_command(broker_cmd.broker)
    cli.add_command(admin_cmd.admin)
    cli.add_command(passwd_cmd.passwd)
    for command in (*messaging.COMMANDS, *transfer.COMMANDS):
        cli.add_command(command)


_register()
