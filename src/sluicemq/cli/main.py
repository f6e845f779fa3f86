"""`sluice` entry point: the command line is assembled here, one module per command family.

Nothing registers itself: each family module only defines its commands, and ``build_cli``
puts them in a fresh group when called, so importing any of these modules changes nothing.
A family's module is imported when one of its commands is looked up (running it, or
``--help``): `sluice broker` runs for days and need not map what the client-side commands
import (the client, numpy, rich: ~5 MiB of a broker's RSS).
"""

from __future__ import annotations

import importlib

import click

from sluicemq import __version__

# command name -> (module, attribute) of the family that defines it
FAMILIES: dict[str, tuple[str, str]] = {
    "broker": ("sluicemq.cli.broker_cmd", "broker"),
    "admin": ("sluicemq.cli.admin_cmd", "admin"),
    "passwd": ("sluicemq.cli.passwd_cmd", "passwd"),
    "publish": ("sluicemq.cli.messaging", "publish"),
    "consume": ("sluicemq.cli.messaging", "consume"),
    "send": ("sluicemq.cli.transfer", "send"),
    "receive": ("sluicemq.cli.transfer", "receive"),
}


class _Families(click.Group):
    """A group that imports each family's module on the first lookup of one of its commands."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*FAMILIES, *self.commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in FAMILIES:
            module, attribute = FAMILIES[cmd_name]
            self.add_command(getattr(importlib.import_module(module), attribute), cmd_name)
        return self.commands.get(cmd_name)


def build_cli() -> click.Group:
    """The `sluice` group with every command family in it."""

    @click.group(name="sluice", cls=_Families)
    @click.version_option(__version__, prog_name="sluice")
    def sluice() -> None:
        """SluiceMQ: a STOMP broker for data of any size."""

    return sluice


def cli() -> None:
    """Run `sluice` on the process's arguments (the console script and `python -m sluicemq`)."""
    build_cli()()
