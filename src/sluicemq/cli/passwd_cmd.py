"""`sluice passwd`: turn a password into the argon2 hash that `[[security.users]]` stores."""

from __future__ import annotations

import sys

import click


@click.command()
def passwd() -> None:
    """Read a password on stdin and print its salted argon2id hash.

    On a terminal it asks twice without echo; piped, it reads the first line, so scripts can
    run `printf %s "$PW" | sluice passwd`. The password never appears in the process list.
    """
    from sluicemq.core.security.policy import hash_password

    if sys.stdin.isatty():
        password = click.prompt("Password", hide_input=True, confirmation_prompt=True,
                                err=True)
    else:
        password = sys.stdin.readline().rstrip("\r\n")
    if not password:
        raise click.ClickException("empty password")
    click.echo(hash_password(password))
