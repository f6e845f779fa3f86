"""`sluice publish` and `sluice consume`: small messages from the shell, for scripts and tests.

`connection_options` and `open_client` are shared with every client-side command so they all
accept the same `--url/--user/--password` (and environment variables) and fail the same way:
one line on stderr, exit status 1, no traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, BinaryIO, TypeVar

import click

from sluicemq.client import Client, Message
from sluicemq.config import DEFAULT_URL
from sluicemq.errors import ClientError

F = TypeVar("F", bound=Callable[..., Any])

# Headers every message carries; the summary line shows only the others (application headers).
_STANDARD_HEADERS = frozenset({
    "destination", "message-id", "subscription", "ack", "content-length", "content-type",
    "persistent", "priority", "expires", "timestamp", "redelivered",
})


def connection_options(func: F) -> F:
    """Add `--url`, `--user` and `--password` (defaults from $SLUICE_URL/_USER/_PASSWORD)."""
    decorators = [
        click.option("--url", envvar="SLUICE_URL", default=DEFAULT_URL, show_default=True,
                     help="Broker address (env SLUICE_URL)."),
        click.option("--user", envvar="SLUICE_USER", default=None,
                     help="Login (env SLUICE_USER)."),
        click.option("--password", envvar="SLUICE_PASSWORD", default=None,
                     help="Passcode (env SLUICE_PASSWORD)."),
    ]
    for decorate in reversed(decorators):
        func = decorate(func)
    return func


def open_client(url: str, user: str | None, password: str | None, **kwargs: Any) -> Client:
    """Connect or exit 1 with a one-line reason (bad URL, refused, credentials rejected)."""
    try:
        return Client(url, login=user, passcode=password, **kwargs)
    except ValueError as exc:
        raise click.ClickException(f"bad --url: {exc}") from None
    except ClientError as exc:
        reason = str(exc)
        if not reason.startswith("cannot connect"):
            reason = f"{url} refused the connection: {reason}"
        raise click.ClickException(reason) from None


def destination(name: str) -> str:
    """Let scripts write `orders` for `/queue/orders`; explicit `/queue/` or `/topic/` pass."""
    return name if name.startswith("/") else f"/queue/{name}"


def parse_headers(pairs: tuple[str, ...]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected K=V, got {pair!r}", param_hint="--header")
        headers[key] = value
    return headers


@click.command()
@connection_options
@click.option("--to", "to", required=True, metavar="DEST",
              help="Destination: /queue/NAME, /topic/NAME, or NAME for a queue.")
@click.option("--persistent/--non-persistent", default=True, show_default=True,
              help="Persistent messages are journaled (fsync'd) before the receipt.")
@click.option("--header", "-H", "header", multiple=True, metavar="K=V",
              help="Extra header; repeatable.")
@click.option("--file", "-f", "file", type=click.File("rb"), default=None,
              help="Send this file's bytes as the body ('-' for stdin).")
@click.argument("text", required=False)
def publish(url: str, user: str | None, password: str | None, to: str, persistent: bool,
            header: tuple[str, ...], file: BinaryIO | None, text: str | None) -> None:
    """Send one message (TEXT or --file) and wait for the broker's receipt."""
    if text is not None and file is not None:
        raise click.UsageError("give either TEXT or --file, not both")
    headers = parse_headers(header)
    body: bytes | str = file.read() if file is not None else (text or "")
    dest = destination(to)
    client = open_client(url, user, password)
    try:
        client.send(dest, body, headers, persistent=persistent)
    except ClientError as exc:
        raise click.ClickException(f"publish to {dest} failed: {exc}") from None
    finally:
        client.disconnect()
    size = len(body.encode() if isinstance(body, str) else body)
    kind = "persistent" if persistent else "non-persistent"
    click.echo(f"published {size} bytes to {dest} ({kind}, receipt confirmed)")


@click.command()
@connection_options
@click.option("--from", "source", required=True, metavar="DEST",
              help="Destination: /queue/NAME, /topic/NAME, or NAME for a queue.")
@click.option("--count", "-n", type=click.IntRange(min=1), default=None,
              help="Stop after N messages (default: run until --timeout or Ctrl-C).")
@click.option("--ack", type=click.Choice(["auto", "client", "client-individual"]),
              default="auto", show_default=True,
              help="Client modes acknowledge each message after it is printed.")
@click.option("--timeout", type=float, default=None, metavar="S",
              help="Give up after S seconds without a message (exit 1 if --count not reached).")
@click.option("--selector", default=None, help="SQL-92 selector on message headers.")
@click.option("--raw", is_flag=True, help="Write bodies only, as raw bytes, to stdout.")
def consume(url: str, user: str | None, password: str | None, source: str, count: int | None,
            ack: str, timeout: float | None, selector: str | None, raw: bool) -> None:
    """Receive and print messages."""
    dest = destination(source)
    client = open_client(url, user, password)
    received = 0
    try:
        # With --count, prefetch exactly that many: in auto mode anything more that the broker
        # pushed would count as delivered and be lost when we disconnect.
        sub = client.subscribe(dest, ack=ack, selector=selector, prefetch=count)
        while count is None or received < count:
            message = sub.get(timeout)
            if message is None:
                if count is not None:
                    raise click.ClickException(
                        f"timed out: received {received} of {count} messages from {dest}")
                break
            received += 1
            _show(message, received, raw)
            message.ack()
    except ClientError as exc:
        raise click.ClickException(f"consume from {dest} failed: {exc}") from None
    except KeyboardInterrupt:
        sys.exit(130)
    finally:
        client.disconnect()
    if not raw:
        click.echo(f"received {received} message{'s' if received != 1 else ''} from {dest}",
                   err=True)


def _show(message: Message, index: int, raw: bool) -> None:
    if raw:
        sys.stdout.buffer.write(message.body)
        sys.stdout.buffer.flush()
        return
    extra = "".join(f"  {k}={v}" for k, v in message.headers.items()
                    if k not in _STANDARD_HEADERS)
    flag = "  (redelivered)" if message.redelivered else ""
    click.echo(f"[{index}] {message.destination}  id={message.message_id}  "
               f"{len(message.body)} bytes{flag}{extra}")
    try:
        click.echo(message.text())
    except UnicodeDecodeError:
        click.echo(f"<{len(message.body)} bytes of binary; use --raw>")


COMMANDS = [publish, consume]
