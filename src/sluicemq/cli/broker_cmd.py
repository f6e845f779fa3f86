"""`sluice broker`: run the broker in the foreground."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from sluicemq.config import (
    DEFAULT_CONSOLE_PORT,
    DEFAULT_HOST,
    DEFAULT_PORT,
    DEFAULT_WS_PORT,
    BrokerConfig,
)
from sluicemq.errors import StorageError
from sluicemq.protocol.numbers import natural


class PortOrOff(click.ParamType):
    """A TCP port, ``auto`` for any free one (printed at start-up), or ``0``/``off`` for none."""

    name = "PORT|auto|off"

    def convert(self, value: object, param: click.Parameter | None,
                ctx: click.Context | None) -> int | None:
        if value is None or isinstance(value, int):
            return value
        text = str(value).strip().lower()
        if text in ("0", "off", "none", "no", "false"):
            return None
        if text == "auto":
            return 0
        port = natural(text, 5)
        if port is not None and port < 65536:
            return port
        self.fail(f"{value!r} is neither a port number, 'auto' nor 'off'", param, ctx)


@click.command()
@click.option("--host", default=None, help=f"Interface to listen on [default: {DEFAULT_HOST}].")
@click.option("--port", type=int, default=None,
              help=f"STOMP port, 0 for any free one [default: {DEFAULT_PORT}].")
@click.option("--console-port", type=PortOrOff(), default=-1,
              help="Web console, admin API and /metrics on --host; auto: any free port; 0 disables "
                   f"[default: {DEFAULT_CONSOLE_PORT}]. Needs an admin login once users exist.")
@click.option("--ws-port", type=PortOrOff(), default=-1,
              help="STOMP over WebSocket on --host; auto: any free port; 0 disables "
                   f"[default: {DEFAULT_WS_PORT}].")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the journal lives [default: ./sluice-data].")
@click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False,
                                                          path_type=Path),
              default=None, help="TOML file with limits and destination policies.")
@click.option("--tls-port", type=int, default=None,
              help="STOMP over TLS (stomps://) port, used with --tls-cert/--tls-key "
                   "[default: 61612].")
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, help="PEM certificate chain for the TLS listener.")
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, help="PEM private key for the TLS listener.")
@click.option("--tls-ca", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, help="CA bundle: ask for and verify client certificates (CN → user).")
@click.option("--lock-retry", type=click.FloatRange(min=0.01), default=None,
              help="Seconds between a standby's attempts to take the data directory's lock "
                   "[default: 0.5].")
@click.option("--ha-lock", type=click.Choice(["kernel", "lease"]), default=None,
              help="How brokers sharing --data-dir decide who serves: an fcntl lock (local "
                   "disks, SAN, NFS v4) or a renewed lease with fencing [default: kernel].")
@click.option("--standby-health/--no-standby-health", default=None,
              help="While standing by, answer /api/health (role: standby) on the console port.")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]))
def broker(host: str | None, port: int | None, console_port: int | None, ws_port: int | None,
           data_dir: Path | None,
           config_file: Path | None, tls_port: int | None, tls_cert: Path | None,
           tls_key: Path | None, tls_ca: Path | None, lock_retry: float | None,
           ha_lock: str | None, standby_health: bool | None, log_level: str) -> None:
    """Run the SluiceMQ broker until SIGTERM or Ctrl-C.

    Several brokers may share one --data-dir: the first to take its lock serves, the others
    stand by and take over when it stops or dies.
    """
    logging.basicConfig(level=log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # -1: flag not given (the config file or the default decides); None: "off".
    ports: dict[str, Any] = {k: v for k, v in (("console_port", console_port),
                                                ("ws_port", ws_port)) if v != -1}
    try:
        config = BrokerConfig.load(config_file, host=host, port=port, data_dir=data_dir)
        config = replace(config, **ports)
        tls: dict[str, Any] = {k: v for k, v in (("port", tls_port), ("cert", tls_cert),
                                                 ("key", tls_key), ("ca", tls_ca))
                               if v is not None}
        if tls:
            config = replace(config, tls=replace(config.tls, **tls))
        ha: dict[str, Any] = {k: v for k, v in (("lock_retry", lock_retry),
                                                ("standby_health", standby_health),
                                                ("lock", ha_lock)) if v is not None}
        if ha:
            config = replace(config, ha=replace(config.ha, **ha))
    except (ValueError, TypeError, OSError) as exc:
        raise click.ClickException(f"bad configuration: {exc}") from exc
    from sluicemq.app import run

    try:
        run(config)
    except StorageError as exc:  # a data directory it must not read on (say, a foreign key)
        logging.getLogger("sluicemq.server").error("%s", exc)
        raise SystemExit(1) from exc
    except OSError as exc:
        raise click.ClickException(str(exc)) from exc
