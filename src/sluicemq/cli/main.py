"""`sluice` entry point: the command line is assembled here, one module per command family.

Nothing registers itself: each family module only defines its commands, and ``build_cli``
puts them in a fresh group when called, so importing any of these modules changes nothing.
"""

from __future__ import annotations

import click

from sluicemq import __version__
from sluicemq.cli import admin_cmd, broker_cmd, messaging, passwd_cmd, transfer


def build_cli() -> click.Group:
    """The `sluice` group with every command family in it."""

    @click.group(name="sluice", commands=[broker_cmd.broker, admin_cmd.admin, passwd_cmd.passwd,
                                          *messaging.COMMANDS, *transfer.COMMANDS])
    @click.version_option(__version__, prog_name="sluice")
    def sluice() -> None:
        """SluiceMQ: a STOMP broker for data of any size."""

    return sluice


def cli() -> None:
    """Run `sluice` on the process's arguments (the console script and `python -m sluicemq`)."""
    build_cli()()
