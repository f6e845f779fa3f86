"""`sluice admin`: the console's JSON API from the shell (list, browse, purge, move, stats, status).

Every failure is one line on stderr and exit status 1: an unreachable console, an unknown
destination, a refused action (the API's own error message is shown).
"""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote, urlencode

import click

from sluicemq.config import DEFAULT_CONSOLE_PORT, DEFAULT_HOST

DEFAULT_CONSOLE_URL = f"http://{DEFAULT_HOST}:{DEFAULT_CONSOLE_PORT}"
TIMEOUT = 30.0


class Console:
    """A tiny JSON client for the admin API."""

    def __init__(self, url: str, user: str | None = None, password: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if user is not None:
            token = base64.b64encode(f"{user}:{password or ''}".encode()).decode()
            self.headers["Authorization"] = f"Basic {token}"

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body or {}).encode() if method == "POST" else None
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers=self.headers)
        try:
            with urllib.request.urlopen(req, timeout=TIMEOUT) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            raise click.ClickException(_api_error(exc)) from None
        except urllib.error.URLError as exc:
            reason = getattr(exc, "reason", exc)
            raise click.ClickException(
                f"cannot reach the console at {self.url}: {reason}") from None
        except (TimeoutError, ConnectionError, json.JSONDecodeError) as exc:
            raise click.ClickException(f"console at {self.url} failed: {exc}") from None


def _api_error(exc: urllib.error.HTTPError) -> str:
    try:
        message = json.loads(exc.read()).get("error")
    except (ValueError, AttributeError):
        message = None
    return f"{message or exc.reason} (HTTP {exc.code})"


def split_destination(text: str) -> tuple[str, str]:
    """``orders`` or ``/queue/orders`` → ("queue", "orders"); ``/topic/t`` → ("topic", "t")."""
    for kind in ("queue", "topic"):
        prefix = f"/{kind}/"
        if text.startswith(prefix):
            return kind, text[len(prefix):]
    if text.startswith("/"):
        raise click.BadParameter(f"{text!r}: use /queue/NAME, /topic/NAME or NAME")
    return "queue", text


def _path(text: str) -> str:
    kind, name = split_destination(text)
    return f"/api/destinations/{kind}/{quote(name, safe='')}"


def _queue_path(text: str) -> str:
    kind, name = split_destination(text)
    if kind != "queue":
        raise click.BadParameter(f"{text!r}: only queues hold messages to browse or move")
    return f"/api/destinations/queue/{quote(name, safe='')}"


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _table(rows: list[list[str]], header: list[str]) -> None:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        cells = [str(c).rjust(w) if i > 1 else str(c).ljust(w)
                 for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        click.echo("  ".join(cells).rstrip())


def _echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2))


@click.command("list")
@click.option("--filter", "pattern", default="", help="Only names containing this text.")
@click.option("--json", "as_json", is_flag=True, help="Print the API's JSON.")
@click.pass_obj
def list_(console: Console, pattern: str, as_json: bool) -> None:
    """Every queue and topic with depth, consumers and counters."""
    dests = [d for d in console.call("GET", "/api/destinations")["destinations"]
             if pattern in d["name"]]
    if as_json:
        _echo_json(dests)
        return
    if not dests:
        click.echo("no destinations")
        return
    _table([[d["kind"], d["name"], d["depth"], d["consumers"], d["enqueued"], d["dequeued"],
             d["redelivered"], d["dead_lettered"], _size(d["memory_bytes"])] for d in dests],
           ["KIND", "NAME", "DEPTH", "CONSUMERS", "ENQUEUED", "DEQUEUED", "REDELIVERED",
            "DLQ", "MEMORY"])


@click.command()
@click.argument("destination")
@click.option("--offset", default=0, show_default=True, help="Skip this many messages.")
@click.option("--limit", default=20, show_default=True, help="Show at most this many.")
@click.option("--json", "as_json", is_flag=True, help="Print the API's JSON.")
@click.pass_obj
def browse(console: Console, destination: str, offset: int, limit: int, as_json: bool) -> None:
    """Waiting messages of a queue, in delivery order, with headers and a body preview."""
    query = urlencode({"offset": offset, "limit": limit})
    page = console.call("GET", f"{_queue_path(destination)}/messages?{query}")
    if as_json:
        _echo_json(page)
        return
    shown = len(page["messages"])
    click.echo(f"{page['destination']}: {page['total']} waiting, {page['inflight']} in flight; "
               f"showing {offset + 1 if shown else 0}-{offset + shown}")
    for m in page["messages"]:
        headers = " ".join(f"{k}={v}" for k, v in m["headers"].items())
        click.echo(f"{m['id']}  prio={m['priority']} persistent={str(m['persistent']).lower()} "
                   f"size={m['size']}  {headers}")
        preview = m["body_preview"][:200].replace("\n", "\\n")
        click.echo(f"    {'hex: ' if m['binary'] else ''}{preview}"
                   f"{'…' if m['truncated'] or len(m['body_preview']) > 200 else ''}")


@click.command()
@click.argument("destination")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.pass_obj
def purge(console: Console, destination: str, yes: bool) -> None:
    """Delete every waiting message of a queue (or of every subscription of a topic)."""
    if not yes:
        click.confirm(f"Purge every waiting message of {destination}?", abort=True)
    result = console.call("POST", f"{_path(destination)}/purge")
    click.echo(f"purged {result['removed']} message(s) from {destination}")


@click.command()
@click.argument("source")
@click.argument("target")
@click.option("--copy", "copy_", is_flag=True, help="Copy instead of move.")
@click.option("--id", "ids", multiple=True, help="Only this message id (repeatable).")
@click.pass_obj
def move(console: Console, source: str, target: str, copy_: bool,
         ids: tuple[str, ...]) -> None:
    """Move (or copy) waiting messages from a queue to another destination."""
    body: dict[str, Any] = {"to": target if target.startswith("/") else f"/queue/{target}"}
    if ids:
        body["ids"] = list(ids)
    action = "copy" if copy_ else "move"
    result = console.call("POST", f"{_queue_path(source)}/{action}", body)
    count = result["copied" if copy_ else "moved"]
    click.echo(f"{'copied' if copy_ else 'moved'} {count} message(s) from {source} to {target}")


@click.command()
@click.argument("dlq")
@click.option("--id", "ids", multiple=True, help="Only this message id (repeatable).")
@click.pass_obj
def retry(console: Console, dlq: str, ids: tuple[str, ...]) -> None:
    """Send dead-lettered messages back to the destination they came from."""
    result = console.call("POST", f"{_queue_path(dlq)}/retry",
                          {"ids": list(ids)} if ids else {})
    origins = ", ".join(f"{n} to {o}" for o, n in result["origins"].items()) or "nothing"
    click.echo(f"retried {result['retried']} message(s): {origins}")


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the API's JSON.")
@click.pass_obj
def stats(console: Console, as_json: bool) -> None:
    """Broker overview: uptime, connections, memory, journal, message rates."""
    o = console.call("GET", "/api/overview")
    if as_json:
        _echo_json(o)
        return
    mem, j, r = o["memory"], o["journal"], o["rates"]
    limit = f" of {_size(mem['limit_bytes'])} ({mem['limit_source']})" if mem["limit_bytes"] else ""
    lines = [
        ("version", o["version"]),
        ("uptime", f"{o['uptime_s']:.0f} s"),
        ("connections", o["connections"]),
        ("destinations", f"{o['queues']} queues, {o['topics']} topics, "
                         f"{o['durable_subscriptions']} durable subscriptions"),
        ("messages waiting", o["depth"]),
        ("rate", f"{r['in']:.1f} msg/s in, {r['out']:.1f} msg/s out "
                 f"({r['total_in']} in, {r['total_out']} out in total)"),
        ("memory", f"{_size(mem['rss_bytes'])} RSS{limit}"),
    ]
    if j:
        p99 = j["fsync_p99_ms"]
        spare = f" (+{_size(j['spare_bytes'])} spare)" if j.get("spare_bytes") else ""
        lines += [("journal", f"{_size(j['disk_bytes'])} on disk{spare}, {j['records']} records, "
                              f"{j['batches']} group commits (mean {j['mean_batch']:.1f})"),
                  ("fsync p99", f"{p99:.2f} ms" if p99 is not None else "n/a")]
    lines.append(("streams in progress", o["streams_in_progress"]))
    width = max(len(k) for k, _ in lines)
    for key, value in lines:
        click.echo(f"{key.ljust(width)}  {value}")


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the API's JSON.")
@click.pass_obj
def status(console: Console, as_json: bool) -> None:
    """Master or standby, since when, and who holds the data directory's lock."""
    h = console.call("GET", "/api/health")
    if as_json:
        _echo_json(h)
        return
    lock = h.get("lock") or {}
    since = h.get("since")
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(since)) if since else "n/a"
    holder = (f"pid {lock['pid']} on {lock['host']}" if lock.get("pid") is not None
              else "unknown")
    click.echo(f"role       {h['role']}\nsince      {when}\nlock held  {holder}")


@click.group(commands=[list_, browse, purge, move, retry, stats, status])
@click.option("--console-url", envvar="SLUICE_CONSOLE_URL", default=DEFAULT_CONSOLE_URL,
              show_default=True, help="Web console address (env SLUICE_CONSOLE_URL).")
@click.option("--user", envvar="SLUICE_USER", default=None,
              help="Admin login when the broker has users (env SLUICE_USER).")
@click.option("--password", envvar="SLUICE_PASSWORD", default=None,
              help="Its password (env SLUICE_PASSWORD).")
@click.pass_context
def admin(ctx: click.Context, console_url: str, user: str | None, password: str | None) -> None:
    """Inspect and manage a running broker through its console's admin API."""
    ctx.obj = Console(console_url, user, password)
