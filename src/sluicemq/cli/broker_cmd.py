"""`sluice broker`: run the broker in the foreground."""

from __future__ import annotations

import logging
from pathlib import Path

import click

from sluicemq.config import DEFAULT_HOST, DEFAULT_PORT, BrokerConfig


@click.command()
@click.option("--host", default=None, help=f"Interface to listen on [default: {DEFAULT_HOST}].")
@click.option("--port", type=int, default=None,
              help=f"STOMP port, 0 for any free one [default: {DEFAULT_PORT}].")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the journal lives [default: ./sluice-data].")
@click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False,
                                                          path_type=Path),
              default=None, help="TOML file with limits and destination policies.")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]))
def broker(host: str | None, port: int | None, data_dir: Path | None,
           config_file: Path | None, log_level: str) -> None:
    """Run the SluiceMQ broker until SIGTERM or Ctrl-C."""
    logging.basicConfig(level=log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = BrokerConfig.load(config_file, host=host, port=port, data_dir=data_dir)
    except (ValueError, TypeError, OSError) as exc:
        raise click.ClickException(f"bad configuration: {exc}") from exc
    from sluicemq.transport.server import run

    try:
        run(config)
    except OSError as exc:
        raise click.ClickException(str(exc)) from exc
