"""Shared-storage master/standby: brokers on one data directory, one serves at a time.

The first broker takes the data directory's lock and serves; every other one stands by without
touching the journal or listening, and the first standby to get the lock after the master dies
(kill -9 included) or stops recovers the journal and serves the same messages.
"""

from __future__ import annotations

import hashlib
import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from ha_helpers import RETRY_RE, STANDBY_RE, Cluster, first_listening, wait_lines
from sluice_testing import BrokerProcess
from sluicemq import Client


def journal_fingerprint(data_dir: Path) -> dict[str, str]:
    """Name -> SHA-256 of every file in the data directory (lock file included)."""
    return {str(p.relative_to(data_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(data_dir.rglob("*")) if p.is_file()}


def health(b: BrokerProcess) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{b.console_port}/api/health",
                                timeout=10) as resp:
        return json.loads(resp.read())


def refuses(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


def test_standby_writes_nothing_and_listens_on_nothing_while_the_master_lives(
        tmp_path: Path) -> None:
    """With segment preallocation off an idle master writes nothing either, so any change to
    the data directory would be the standby's."""
    cluster = Cluster(tmp_path / "shared", "[journal]\npreallocate = false\n")
    try:
        standby_writes_nothing(cluster)
    finally:
        cluster.close()


def standby_writes_nothing(cluster: Cluster) -> None:
    master = cluster.master()
    with Client(master.url) as c:
        for i in range(20):
            c.send("/queue/ha", f"m{i}")
    before = journal_fingerprint(cluster.data_dir)
    standby = cluster.standby()
    named = STANDBY_RE.search(standby.log())
    assert named is not None and int(named.group(1)) == master.pid
    wait_lines(standby, RETRY_RE, 10)  # ten attempts on the lock, all refused
    assert journal_fingerprint(cluster.data_dir) == before
    assert refuses(standby.port) and refuses(standby.console_port)
    h = health(master)
    assert h["role"] == "master" and h["lock"]["pid"] == master.pid
    assert "taking over" not in standby.log()


def test_standby_answers_health_only_when_asked(cluster) -> None:
    master = cluster.master()
    standby = cluster.standby("--standby-health")
    h = health(standby)
    assert h["role"] == "standby" and h["lock"]["pid"] == master.pid
    assert not h["lock"]["held_by_me"]
    assert refuses(standby.port)


def test_kill_9_of_the_master_hands_the_journal_to_the_standby(cluster) -> None:
    master = cluster.master()
    standby = cluster.standby()
    with Client(master.url) as c:
        for i in range(50):
            c.send("/queue/ha", f"m{i}")  # each receipted: durable
    master.kill()
    standby.wait_listening()
    assert health(standby)["role"] == "master"
    assert health(standby)["lock"]["pid"] == standby.pid
    with Client(standby.url) as c, c.subscribe("/queue/ha", ack="client-individual") as sub:
        got = []
        for _ in range(50):
            msg = sub.get(timeout=10)
            assert msg is not None
            got.append(msg.text())
            msg.ack(receipt=True)
    assert got == [f"m{i}" for i in range(50)]  # all of them, in order


def test_two_standbys_never_both_take_over_and_a_clean_stop_hands_over(cluster) -> None:
    master = cluster.master()
    first, second = cluster.standby(), cluster.standby()
    with Client(master.url) as c:
        c.send("/queue/ha", "before")
    master.kill()
    winner = first_listening(first, second)
    loser = second if winner is first else first
    mark = sum(1 for line in list(loser.output) if RETRY_RE.search(line))
    wait_lines(loser, RETRY_RE, mark + 10)  # ten more refused attempts after the takeover
    assert not loser.listening.is_set() and refuses(loser.port)
    assert "taking over" not in loser.log()
    with Client(winner.url) as c:
        c.send("/queue/ha", "after")
    assert winner.stop() == 0  # clean stop: the lock goes at once
    loser.wait_listening()
    with Client(loser.url) as c, c.subscribe("/queue/ha") as sub:
        assert [sub.get(timeout=10).text() for _ in range(2)] == ["before", "after"]


def test_admin_status_names_the_role_since_when_and_the_lock_holder(cluster) -> None:
    master = cluster.master()
    standby = cluster.standby("--standby-health")
    for broker, role in ((master, "master"), (standby, "standby")):
        out = subprocess.run([sys.executable, "-m", "sluicemq", "admin", "--console-url",
                              f"http://127.0.0.1:{broker.console_port}", "status"],
                             capture_output=True, text=True, timeout=60, check=True).stdout
        since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(health(broker)["since"]))
        assert out.splitlines() == [f"role       {role}", f"since      {since}",
                                    f"lock held  pid {master.pid} on {socket.gethostname()}"]
    master.kill()
    standby.wait_listening()
    after = health(standby)
    assert after["role"] == "master" and after["lock"]["pid"] == standby.pid
    assert after["since"] >= after["lock"]["since"]  # since it took the lock


def test_cli_publish_and_consume_take_a_failover_url(cluster) -> None:
    """Every `sluice` command that takes --url builds a Client, so failover URLs work there."""
    master = cluster.master()
    standby = cluster.standby()
    url = f"failover:({master.url},{standby.url})?randomize=false&maxReconnectDelay=200"
    master.kill()
    standby.wait_listening()
    subprocess.run([sys.executable, "-m", "sluicemq", "publish", "--url", url, "--to",
                    "/queue/cli", "--persistent", "via failover"], check=True, timeout=60,
                   capture_output=True)
    out = subprocess.run([sys.executable, "-m", "sluicemq", "consume", "--url", url, "--from",
                          "/queue/cli", "--count", "1"], check=True, timeout=60,
                         capture_output=True, text=True).stdout
    assert "via failover" in out
