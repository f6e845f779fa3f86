"""`sluice admin` against a real broker's console: output for people, one-line errors."""

from __future__ import annotations

import json

from click.testing import CliRunner

from sluice_testing import reserve_port
from sluicemq.cli.main import build_cli


def admin(console_url: str, *args: str, input: str | None = None):
    return CliRunner().invoke(build_cli(), ["admin", "--console-url", console_url, *args],
                              input=input)


def fill(raw_conn, destination: str, bodies: list[str]) -> None:
    for i, body in enumerate(bodies):
        raw_conn.send("SEND", {"destination": destination, "receipt": f"r{i}",
                               "persistent": "true"}, body.encode())
        assert raw_conn.recv().command == "RECEIPT"


def test_list_browse_move_purge_and_stats(broker, raw) -> None:
    conn = raw()
    conn.connect()
    fill(conn, "/queue/jobs", ["a", "b", "c"])
    url = broker.console_url

    listed = admin(url, "list")
    assert listed.exit_code == 0, listed.output
    header, row = listed.output.splitlines()
    assert header.split()[:4] == ["KIND", "NAME", "DEPTH", "CONSUMERS"]
    assert row.split()[:4] == ["queue", "jobs", "3", "0"]

    browsed = admin(url, "browse", "jobs", "--limit", "2")
    assert browsed.exit_code == 0, browsed.output
    assert browsed.output.splitlines()[0] == ("/queue/jobs: 3 waiting, 0 in flight; "
                                              "showing 1-2")
    assert "    a" in browsed.output and "    c" not in browsed.output

    as_json = json.loads(admin(url, "browse", "/queue/jobs", "--json").output)
    first = as_json["messages"][0]["id"]
    moved = admin(url, "move", "jobs", "/queue/later", "--id", first)
    assert moved.output.strip() == "moved 1 message(s) from jobs to /queue/later"
    copied = admin(url, "move", "jobs", "later", "--copy")
    assert copied.output.strip() == "copied 2 message(s) from jobs to later"

    refused = admin(url, "purge", "jobs", input="n\n")
    assert refused.exit_code == 1  # answering no aborts
    purged = admin(url, "purge", "jobs", "--yes")
    assert purged.output.strip() == "purged 2 message(s) from jobs"
    depths = {d["name"]: d["depth"] for d in json.loads(admin(url, "list", "--json").output)}
    assert depths == {"jobs": 0, "later": 3}

    stats = admin(url, "stats")
    assert stats.exit_code == 0, stats.output
    assert "connections          1" in stats.output
    assert "journal" in stats.output and "fsync p99" in stats.output


def test_errors_are_one_line(broker) -> None:
    missing = admin(broker.console_url, "browse", "nope")
    assert missing.exit_code == 1
    assert missing.output.strip() == "Error: no queue named 'nope' (HTTP 404)"

    free = reserve_port()  # nobody listens there, and no outgoing connection takes it
    unreachable = admin(f"http://127.0.0.1:{free}", "list")
    assert unreachable.exit_code == 1
    assert unreachable.output.startswith(f"Error: cannot reach the console at "
                                         f"http://127.0.0.1:{free}:")
    assert len(unreachable.output.strip().splitlines()) == 1

    bad = admin(broker.console_url, "browse", "/topic/news")
    assert bad.exit_code == 2 and "only queues" in bad.output


def test_the_console_url_comes_from_the_environment(broker) -> None:
    result = CliRunner().invoke(build_cli(), ["admin", "list"],
                                env={"SLUICE_CONSOLE_URL": broker.console_url})
    assert result.exit_code == 0 and result.output.strip() == "no destinations"
