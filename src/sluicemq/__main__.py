"""`python -m sluicemq` is the `sluice` command."""

from sluicemq.cli.main import cli

if __name__ == "__main__":
    cli()
